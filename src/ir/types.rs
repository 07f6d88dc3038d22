//! Types of the `.ef` IR: dtypes, symbolic shapes and parallel state.
//!
//! A tensor type is `tensor<SHAPE, DTYPE | STATE>`. The *logical* shape never changes under
//! tiling: `partition(K,p)` records that each coordinate of axis `p` holds a distinct slice of
//! dimension `K`, and the per-coordinate (tile) shape is derived from it. This is what lets a
//! tensor-level and a tiled expression of the same value have the same type.

use super::module::DimRef;
use super::symbol::Sym;
use std::collections::BTreeMap;
use std::fmt;

/// Element types. `i1` is the boolean produced by comparisons and consumed by `select`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum DType {
    BF16,
    F16,
    F32,
    I32,
    I1,
}

impl DType {
    pub fn parse(name: &str) -> Option<DType> {
        Some(match name {
            "bf16" => DType::BF16,
            "f16" => DType::F16,
            "f32" => DType::F32,
            "i32" => DType::I32,
            "i1" => DType::I1,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I1 => "i1",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }

    /// Bytes per element in global memory.
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I1 => 1,
        }
    }

    /// The dtype two operands of a pointwise operation are computed in. Floats widen to the
    /// narrowest type holding both (bf16 with f16 needs f32); integers and booleans only mix
    /// with themselves, so a float/int mix is `None` and needs an explicit `cast`.
    pub fn promote(a: DType, b: DType) -> Option<DType> {
        if a == b {
            return Some(a);
        }
        if a.is_float() && b.is_float() {
            return Some(DType::F32);
        }
        None
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The base of a dimension: a size symbol (`K`), a literal (`128`) or the extent of a
/// parallel axis (`|p|`, the leading dimension that `collection[p]` creates).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DimBase {
    Sym(Sym),
    Lit(u64),
    Extent(Sym),
}

/// One dimension of a shape. `splits` lists the axes the dimension was divided by: `(K/p)` is
/// the extent of one `p`-tile of `K`, which is what a reducer body sees of a K-partitioned item.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim {
    pub base: DimBase,
    pub splits: Vec<Sym>,
}

impl Dim {
    pub fn sym(name: &str) -> Dim {
        Dim {
            base: DimBase::Sym(Sym::new(name)),
            splits: Vec::new(),
        }
    }

    pub fn lit(n: u64) -> Dim {
        Dim {
            base: DimBase::Lit(n),
            splits: Vec::new(),
        }
    }

    pub fn extent(axis: &str) -> Dim {
        Dim {
            base: DimBase::Extent(Sym::new(axis)),
            splits: Vec::new(),
        }
    }

    pub fn is_one(&self) -> bool {
        self.base == DimBase::Lit(1) && self.splits.is_empty()
    }

    /// The dimension split once more by `axis`.
    pub fn split_by(&self, axis: &str) -> Dim {
        let mut d = self.clone();
        d.splits.push(Sym::new(axis));
        d
    }

    /// True when this dimension is named `name`, ignoring tile splits: `axis=K` finds `(K/p)`.
    pub fn has_symbol(&self, name: &str) -> bool {
        matches!(&self.base, DimBase::Sym(s) if s == name)
    }

    /// The concrete size under the given bindings (dimension symbols and axis extents).
    pub fn eval(&self, sizes: &dyn Fn(&str) -> Option<u64>) -> Result<u64, String> {
        let base = match &self.base {
            DimBase::Lit(n) => *n,
            DimBase::Sym(s) => sizes(s).ok_or_else(|| {
                format!("dimension {s} has no size; bind it in `where` or with --set {s}=<size>")
            })?,
            DimBase::Extent(a) => {
                sizes(a).ok_or_else(|| format!("parallel axis {a} has no extent"))?
            }
        };
        let mut size = base;
        for a in &self.splits {
            let e = sizes(a).ok_or_else(|| format!("parallel axis {a} has no extent"))?;
            if e == 0 || size % e != 0 {
                return Err(format!(
                    "extent {e} of axis {a} does not divide {size} (dimension {self})"
                ));
            }
            size /= e;
        }
        Ok(size)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let base = match &self.base {
            DimBase::Sym(s) => s.to_string(),
            DimBase::Lit(n) => n.to_string(),
            DimBase::Extent(a) => format!("|{a}|"),
        };
        if self.splits.is_empty() {
            f.write_str(&base)
        } else {
            write!(f, "({base}")?;
            for a in &self.splits {
                write!(f, "/{a}")?;
            }
            f.write_str(")")
        }
    }
}

pub type Shape = Vec<Dim>;

pub fn shape_to_string(shape: &[Dim]) -> String {
    shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x")
}

/// How one parallel axis relates to a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParKind {
    /// Each coordinate holds a distinct slice of this dimension (an index into the shape).
    Partition(usize),
    /// Every coordinate holds the whole value.
    Replicate,
    /// Each coordinate holds a contribution still to be folded by `reduce … parallel=`.
    Partial,
}

/// Parallel state: a set of entries keyed by axis name. Kept sorted so that equivalent
/// expressions built in different orders (`replicate[m](partition[K,p](x))` versus
/// `partition[K,p](replicate[m](x))`) have equal types.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParState(pub BTreeMap<Sym, ParKind>);

impl ParState {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, axis: &str) -> Option<ParKind> {
        self.0.get(axis).copied()
    }

    pub fn axes(&self) -> impl Iterator<Item = &Sym> {
        self.0.keys()
    }

    /// The axis that partitions dimension `dim`, if any.
    pub fn partitioner_of(&self, dim: usize) -> Option<&str> {
        self.0
            .iter()
            .find_map(|(a, k)| (*k == ParKind::Partition(dim)).then_some(a.as_str()))
    }

    /// Same entries with every partitioned dimension index passed through `map`; an entry whose
    /// dimension maps to `None` is dropped.
    pub fn remap_dims(&self, map: impl Fn(usize) -> Option<usize>) -> ParState {
        let mut out = BTreeMap::new();
        for (a, k) in &self.0 {
            match k {
                ParKind::Partition(d) => {
                    if let Some(nd) = map(*d) {
                        out.insert(*a, ParKind::Partition(nd));
                    }
                }
                other => {
                    out.insert(*a, *other);
                }
            }
        }
        ParState(out)
    }

    pub fn display(&self, shape: &[Dim]) -> String {
        self.0
            .iter()
            .map(|(a, k)| match k {
                ParKind::Partition(d) => format!("partition({},{a})", dim_ref_text(shape, *d)),
                ParKind::Replicate => format!("replicate({a})"),
                ParKind::Partial => format!("partial({a})"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How a dimension is referred to in text: by its symbol when that is unique in the shape,
/// else by index (so `tensor<KxK>` stays unambiguous).
pub fn dim_ref_text(shape: &[Dim], index: usize) -> String {
    if let Some(Dim {
        base: DimBase::Sym(s),
        ..
    }) = shape.get(index)
    {
        if shape.iter().filter(|d| d.has_symbol(s)).count() == 1 {
            return s.to_string();
        }
    }
    index.to_string()
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
    pub par: ParState,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Shape) -> TensorType {
        TensorType {
            dtype,
            shape,
            par: ParState::default(),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        if !self.shape.is_empty() {
            write!(f, "{}, ", shape_to_string(&self.shape))?;
        }
        f.write_str(self.dtype.name())?;
        if !self.par.is_empty() {
            write!(f, " | {}", self.par.display(&self.shape))?;
        }
        f.write_str(">")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Type {
    Tensor(TensorType),
    Tuple(Vec<Type>),
}

impl Type {
    pub fn as_tensor(&self) -> Option<&TensorType> {
        match self {
            Type::Tensor(t) => Some(t),
            Type::Tuple(_) => None,
        }
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Tensor(t) => t.fmt(f),
            Type::Tuple(fields) => {
                f.write_str("(")?;
                for (i, t) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    t.fmt(f)?;
                }
                f.write_str(")")
            }
        }
    }
}

/// Case conventions of the language: dimension symbols are upper case, parallel axes lower case.
pub fn is_dim_symbol(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_uppercase())
}

pub fn is_axis_name(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
}

/// Why a [`DimRef`] names no single dimension of a shape.
#[derive(Clone, Debug, PartialEq)]
pub struct DimError {
    pub message: String,
    pub help: Option<String>,
}

impl DimError {
    fn new(message: String) -> DimError {
        DimError {
            message,
            help: None,
        }
    }
}

/// A shape as typing errors name it: `a scalar`, or its text.
pub fn shape_text(shape: &[Dim]) -> String {
    if shape.is_empty() {
        "a scalar".into()
    } else {
        shape_to_string(shape)
    }
}

/// Resolves a dimension reference against a shape.
pub fn resolve_dim(shape: &[Dim], d: &DimRef) -> Result<usize, DimError> {
    match d {
        DimRef::Index(i) => {
            if *i < shape.len() {
                Ok(*i)
            } else {
                Err(DimError::new(format!(
                    "dimension index {i} is out of range for shape {}",
                    shape_text(shape)
                )))
            }
        }
        DimRef::Name(n) => {
            let hits: Vec<usize> = (0..shape.len())
                .filter(|&i| shape[i].has_symbol(n))
                .collect();
            match hits.as_slice() {
                [i] => Ok(*i),
                [] => Err(DimError::new(format!(
                    "the operand has no dimension {n}; its shape is {}",
                    shape_text(shape)
                ))),
                _ => Err(DimError {
                    message: format!("dimension {n} is ambiguous in shape {}", shape_text(shape)),
                    help: Some("refer to the dimension by index".into()),
                }),
            }
        }
    }
}
