//! Type inference: the rules that give every expression its dtype, logical shape and parallel
//! state (paper section 3). [`infer`] types one operation from its operands' types; `verify`
//! applies it to whole bodies, and the e-graph analysis reuses it, so there is one copy of the
//! typing rules.

use crate::diag::{Diagnostic, Span};
use crate::ir::*;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

/// A typing failure. `span` overrides the location of the offending expression when the
/// error is inside a reducer body; `notes` explain where the body was instantiated.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeError {
    pub message: String,
    pub help: Option<String>,
    pub span: Option<Span>,
    pub notes: Vec<(Option<Span>, String)>,
}

impl TypeError {
    pub fn new(message: impl Into<String>) -> TypeError {
        TypeError {
            message: message.into(),
            help: None,
            span: None,
            notes: Vec::new(),
        }
    }

    pub fn help(mut self, help: impl Into<String>) -> TypeError {
        self.help = Some(help.into());
        self
    }

    pub fn into_diagnostic(self, at: Span) -> Diagnostic {
        let mut d = Diagnostic::error(self.span.unwrap_or(at), self.message);
        d.help = self.help;
        for (s, m) in self.notes {
            d = d.with_note(s, m);
        }
        d
    }
}

type TResult<T> = Result<T, TypeError>;

fn err<T>(msg: impl Into<String>) -> TResult<T> {
    Err(TypeError::new(msg))
}

/// A reducer use: its name and item types.
type InstanceKey = (String, Vec<Type>);
/// A typed reducer use: its result type and the type of every body node.
type Instance = (Type, Vec<Type>);

/// What typing needs beyond operand types: the module's reducer definitions, with a cache of
/// reducer instantiations (a reducer is typed per use, like a template).
pub struct TypeEnv {
    reducers: Vec<ReducerDef>,
    /// The derived sizes of the function being typed (`HD = NH*D`).
    sizes: SizeDefs,
    /// Shared by the threads that search rules in parallel.
    cache: Mutex<HashMap<InstanceKey, TResult<Instance>>>,
    /// The functions a `call` may name: those defined before the one being typed.
    functions: Vec<Signature>,
}

/// A function's interface, as a `call` of it is typed.
#[derive(Clone, Debug)]
pub struct Signature {
    pub name: String,
    pub params: Vec<Type>,
    pub results: Vec<Type>,
    /// Its sizes: a caller must have the same value for each.
    pub bindings: Vec<(String, u64)>,
}

thread_local! {
    /// Reducers being typed on this thread, innermost last: a use of one of them is recursion.
    static ACTIVE_REDUCERS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

impl TypeEnv {
    pub fn new(reducers: &[ReducerDef]) -> TypeEnv {
        TypeEnv {
            reducers: reducers.to_vec(),
            sizes: SizeDefs::default(),
            cache: Mutex::new(HashMap::new()),
            functions: Vec::new(),
        }
    }

    /// The environment with these functions callable.
    pub fn with_functions(mut self, functions: Vec<Signature>) -> TypeEnv {
        self.functions = functions;
        self
    }

    /// The environment for a function with these `where` bindings: typing compares and
    /// names sizes through their derived definitions.
    pub fn for_bindings(reducers: &[ReducerDef], bindings: &[Binding]) -> TypeEnv {
        TypeEnv {
            sizes: SizeDefs::from_bindings(bindings),
            ..TypeEnv::new(reducers)
        }
    }

    /// This environment with the given derived sizes.
    pub fn with_sizes(mut self, sizes: SizeDefs) -> TypeEnv {
        self.sizes = sizes;
        self
    }

    /// The same reducers and derived sizes, with an empty cache (and room for more reducers).
    pub fn fresh_copy(&self) -> TypeEnv {
        TypeEnv {
            sizes: self.sizes.clone(),
            ..TypeEnv::new(&self.reducers)
        }
    }

    pub fn sizes(&self) -> &SizeDefs {
        &self.sizes
    }

    /// Registers a reducer made by a rule (no-op if one of that name exists).
    pub fn add_reducer(&mut self, def: ReducerDef) {
        if self.reducer(&def.name).is_none() {
            self.reducers.push(def);
        }
    }

    pub fn reducers(&self) -> &[ReducerDef] {
        &self.reducers
    }

    pub fn reducer(&self, name: &str) -> Option<&ReducerDef> {
        self.reducers.iter().find(|r| r.name == name)
    }
}

pub fn tensor(t: &Type) -> TResult<&TensorType> {
    match t {
        Type::Tensor(t) => Ok(t),
        Type::Tuple(_) => err("expected a tensor operand, found a tuple")
            .map_err(|e| e.help("select a field with `get[i](…)`")),
    }
}

/// A dimension reference that names no single dimension of a shape.
impl From<DimError> for TypeError {
    fn from(e: DimError) -> TypeError {
        TypeError {
            message: e.message,
            help: e.help,
            span: None,
            notes: Vec::new(),
        }
    }
}

fn state_text(t: &TensorType) -> String {
    if t.par.is_empty() {
        "no parallel state".into()
    } else {
        format!("state {{{}}}", t.par.display(&t.shape))
    }
}

fn kind_text(t: &TensorType, k: ParKind, axis: &str) -> String {
    match k {
        ParKind::Partition(d) => format!("partition({},{axis})", dim_ref_text(&t.shape, d)),
        ParKind::Replicate => format!("replicate({axis})"),
        ParKind::Partial => format!("partial({axis})"),
    }
}

/// Right-aligned numpy broadcasting of several shapes.
fn broadcast_shapes(shapes: &[&[Dim]]) -> TResult<Vec<Dim>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let mut dim: Option<&Dim> = None;
        for s in shapes {
            let off = rank - s.len();
            if i < off {
                continue;
            }
            let d = &s[i - off];
            match dim {
                None => dim = Some(d),
                Some(cur) if cur == d || d.is_one() => {}
                Some(cur) if cur.is_one() => dim = Some(d),
                Some(cur) => return Err(TypeError::new(format!(
                    "shapes {} do not broadcast: dimension {cur} against {d}",
                    shapes
                        .iter()
                        .map(|s| shape_text(s))
                        .collect::<Vec<_>>()
                        .join(" and ")
                ))
                .help(
                    "operands broadcast numpy-style from the right; a dimension must match or be 1",
                )),
            }
        }
        out.push(dim.cloned().unwrap_or_else(|| Dim::lit(1)));
    }
    Ok(out)
}

/// Merges the parallel states of pointwise operands, whose shapes broadcast to `out`.
/// Operands must index the same parallel axes (tiles pair up at equal coordinates); a rank-0
/// value without state (a literal) is implicitly replicated.
fn merge_states(ops: &[&TensorType], out: &[Dim]) -> TResult<ParState> {
    let mut axes: BTreeSet<&Sym> = BTreeSet::new();
    for t in ops {
        axes.extend(t.par.axes());
    }
    let mut result = BTreeMap::new();
    for axis in axes {
        let mut merged: Option<ParKind> = None;
        for t in ops {
            let k = match t.par.get(axis) {
                Some(k) => k,
                None if t.shape.is_empty() && t.par.is_empty() => ParKind::Replicate,
                None => {
                    return Err(TypeError::new(format!(
                        "operands do not share parallel axis `{axis}`: one has {}, another has {}",
                        state_text(ops.iter().find(|o| o.par.get(axis).is_some()).copied().unwrap_or(t)),
                        state_text(t)
                    ))
                    .help(format!("bring the other operand onto axis `{axis}` with replicate[{axis}](…) or partition[DIM,{axis}](…)")))
                }
            };
            let off = out.len() - t.shape.len();
            let k = match k {
                ParKind::Partition(d) => {
                    if t.shape[d].is_one() && !out[d + off].is_one() {
                        return err(format!(
                            "a size-1 dimension cannot be partitioned along `{axis}` and broadcast"
                        ));
                    }
                    ParKind::Partition(d + off)
                }
                other => other,
            };
            merged = Some(match (merged, k) {
                (None, k) => k,
                (Some(a), b) if a == b => a,
                (Some(ParKind::Replicate), ParKind::Partial)
                | (Some(ParKind::Partial), ParKind::Replicate) => ParKind::Partial,
                (Some(ParKind::Replicate), ParKind::Partition(d))
                | (Some(ParKind::Partition(d)), ParKind::Replicate) => ParKind::Partition(d),
                (Some(a), b) => {
                    let show = |k: ParKind| match k {
                        ParKind::Partition(d) => {
                            format!("partition({},{axis})", dim_ref_text(out, d))
                        }
                        ParKind::Replicate => format!("replicate({axis})"),
                        ParKind::Partial => format!("partial({axis})"),
                    };
                    return Err(TypeError::new(format!(
                        "operand tiles do not align on axis `{axis}`: {} against {}",
                        show(a),
                        show(b)
                    ))
                    .help("pointwise operands pair tiles at equal coordinates: partition the same dimension, or replicate"));
                }
            });
        }
        // A replicated operand paired with partitioned tiles must broadcast along that dim.
        if let Some(ParKind::Partition(d)) = merged {
            for t in ops {
                let off = out.len() as isize - t.shape.len() as isize;
                let local = d as isize - off;
                let replicated = matches!(t.par.get(axis), Some(ParKind::Replicate) | None);
                if replicated && local >= 0 && !t.shape[local as usize].is_one() {
                    return Err(TypeError::new(format!(
                        "operand tiles do not align on axis `{axis}`: one operand is partitioned along {} but another is replicated with the whole dimension",
                        out[d]
                    ))
                    .help(format!("partition that operand too: partition[{},{axis}](…)", out[d])));
                }
            }
        }
        if let Some(k) = merged {
            result.insert(*axis, k);
        }
    }
    Ok(ParState(result))
}

fn pointwise(ops: &[&TensorType], dtype: DType) -> TResult<Type> {
    let shapes: Vec<&[Dim]> = ops.iter().map(|t| t.shape.as_slice()).collect();
    let shape = broadcast_shapes(&shapes)?;
    let par = merge_states(ops, &shape)?;
    Ok(Type::Tensor(TensorType { dtype, shape, par }))
}

fn promote(a: DType, b: DType) -> TResult<DType> {
    DType::promote(a, b).ok_or_else(|| {
        TypeError::new(format!("operand dtypes {a} and {b} do not mix"))
            .help("convert one operand with `cast(x) to=DTYPE`")
    })
}

/// Types one operation. `operands` are the operand types in order; `annot` is the written type
/// (required by leaves); `param_types` gives reducer parameters their instantiated types.
pub fn infer(
    kind: &ExprKind,
    operands: &[&Type],
    annot: Option<&Type>,
    env: &TypeEnv,
) -> TResult<Type> {
    use ExprKind::*;
    match kind {
        Input | Constant(_) | Fill(_) => {
            let t = leaf_annotation(kind, annot)?;
            Ok(Type::Tensor(t.clone()))
        }
        Call(f, _) => {
            let Some(sig) = env.functions.iter().find(|s| s.name == *f) else {
                return err(format!(
                    "no function `{f}` is defined before this call (a call names a function defined earlier in the module, so calls never recurse)"
                ));
            };
            if operands.len() != sig.params.len() {
                return err(format!(
                    "`{f}` takes {} operand(s), got {}",
                    sig.params.len(),
                    operands.len()
                ));
            }
            for (i, (got, want)) in operands.iter().zip(&sig.params).enumerate() {
                if *got != want {
                    return err(format!(
                        "operand {i} of `call @{f}` is {got}, but `{f}` takes {want} there"
                    ));
                }
            }
            Ok(match sig.results.as_slice() {
                [one] => one.clone(),
                many => Type::Tuple(many.to_vec()),
            })
        }
        Param => err("reducer parameters are typed by their reducer's use"),
        Iota(d) => {
            let t = leaf_annotation(kind, annot)?;
            resolve_dim(&t.shape, d)?;
            if t.dtype == DType::I1 {
                return err("`iota` produces indices: use i32 or a float dtype");
            }
            Ok(Type::Tensor(t.clone()))
        }
        Tuple(_) => Ok(Type::Tuple(operands.iter().map(|t| (*t).clone()).collect())),
        Get(field, _) => match operands[0] {
            Type::Tuple(fields) => {
                let FieldRef::Index(i) = field else {
                    return err("field names resolve only on the result of a reducer with named state fields")
                        .map_err(|e| e.help("use a field index: `get[0](t)`"));
                };
                fields.get(*i).cloned().ok_or_else(|| {
                    TypeError::new(format!(
                        "field index {i} is out of range: the tuple has {} fields",
                        fields.len()
                    ))
                })
            }
            Type::Tensor(_) => err("`get` needs a tuple operand, found a tensor"),
        },
        Partition(d, axis, _) => {
            let t = tensor(operands[0])?;
            let i = resolve_dim(&t.shape, d)?;
            if t.par.get(axis).is_some() {
                return Err(TypeError::new(format!(
                    "axis `{axis}` already appears in the operand's {}",
                    state_text(t)
                ))
                .help("each parallel axis indexes a value at most once; use a new axis name"));
            }
            if let Some(other) = t.par.partitioner_of(i) {
                return err(format!(
                    "dimension {} is already partitioned along `{other}`",
                    t.shape[i]
                ));
            }
            let mut out = t.clone();
            out.par.0.insert(*axis, ParKind::Partition(i));
            Ok(Type::Tensor(out))
        }
        Replicate(axis, _) => match operands[0] {
            Type::Tensor(t) => replicate_tensor(t, axis).map(Type::Tensor),
            Type::Tuple(fields) => fields
                .iter()
                .map(|f| replicate_tensor(tensor(f)?, axis).map(Type::Tensor))
                .collect::<TResult<Vec<_>>>()
                .map(Type::Tuple),
        },
        Combination(d, axis, _) => {
            let t = tensor(operands[0])?;
            let i = resolve_dim(&t.shape, d)?;
            match t.par.get(axis) {
                Some(ParKind::Partition(j)) if j == i => {
                    let mut out = t.clone();
                    out.par.0.remove(axis);
                    Ok(Type::Tensor(out))
                }
                other => Err(TypeError::new(format!(
                    "combination[{},{axis}] needs partition({},{axis}), but the operand has {}",
                    t.shape[i],
                    t.shape[i],
                    match other {
                        Some(k) => kind_text(t, k, axis),
                        None => state_text(t),
                    }
                ))
                .help(match other {
                    Some(ParKind::Partial) => {
                        format!("fold partial results with `reduce … parallel={axis}` first")
                    }
                    _ => "combination joins the slices that partition made".to_string(),
                })),
            }
        }
        Collection(axis, _) => match operands[0] {
            Type::Tensor(t) => collect_tensor(t, axis).map(Type::Tensor),
            Type::Tuple(fields) => fields
                .iter()
                .map(|f| collect_tensor(tensor(f)?, axis).map(Type::Tensor))
                .collect::<TResult<Vec<_>>>()
                .map(Type::Tuple),
        },
        Unary(op, _) => {
            let t = tensor(operands[0])?;
            let int_ok = matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Square);
            if !(t.dtype.is_float() || int_ok && t.dtype == DType::I32) {
                return Err(TypeError::new(format!(
                    "`{}` needs a floating-point operand, found {}",
                    op.name(),
                    t.dtype
                ))
                .help("convert it with `cast(x) to=f32`"));
            }
            Ok(Type::Tensor(t.clone()))
        }
        Binary(op, _, _) => {
            let a = tensor(operands[0])?;
            let b = tensor(operands[1])?;
            let dt = if op.is_logical() {
                if a.dtype != DType::I1 || b.dtype != DType::I1 {
                    return err(format!(
                        "`{}` needs i1 operands, found {} and {}",
                        op.name(),
                        a.dtype,
                        b.dtype
                    ));
                }
                DType::I1
            } else {
                let dt = promote(a.dtype, b.dtype)?;
                if dt == DType::I1 {
                    return err(format!("`{}` does not apply to i1 values", op.name()))
                        .map_err(|e| e.help("use logical_and / logical_or, or select"));
                }
                if op.is_comparison() {
                    DType::I1
                } else {
                    dt
                }
            };
            pointwise(&[a, b], dt)
        }
        Select(..) => {
            let c = tensor(operands[0])?;
            let a = tensor(operands[1])?;
            let b = tensor(operands[2])?;
            if c.dtype != DType::I1 {
                return Err(TypeError::new(format!(
                    "`select` needs an i1 condition, found {}",
                    c.dtype
                ))
                .help("build conditions with comparisons such as `less_equal(a, b)`"));
            }
            pointwise(&[c, a, b], promote(a.dtype, b.dtype)?)
        }
        Cast(to, _) => {
            let mut t = tensor(operands[0])?.clone();
            t.dtype = *to;
            Ok(Type::Tensor(t))
        }
        MatMul { acc, .. } => matmul(tensor(operands[0])?, tensor(operands[1])?, *acc, false),
        TileMatMul { acc, .. } => matmul(tensor(operands[0])?, tensor(operands[1])?, *acc, true),
        Reduce {
            over,
            reducer,
            keep_dims,
            ..
        } => reduce(operands[0], over, reducer, *keep_dims, env),
        Transpose(perm, _) => {
            let t = tensor(operands[0])?;
            let mut sorted = perm.clone();
            sorted.sort_unstable();
            if sorted != (0..t.rank()).collect::<Vec<_>>() {
                return err(format!(
                    "[{}] is not a permutation of the {} dimensions of {}",
                    perm.iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                    t.rank(),
                    shape_text(&t.shape)
                ));
            }
            let shape = perm.iter().map(|&p| t.shape[p].clone()).collect();
            let par = t.par.remap_dims(|d| perm.iter().position(|&p| p == d));
            Ok(Type::Tensor(TensorType {
                dtype: t.dtype,
                shape,
                par,
            }))
        }
        Reshape(shape, _) => {
            let t = tensor(operands[0])?;
            if t.par.0.values().any(|k| matches!(k, ParKind::Partition(_))) {
                return Err(
                    TypeError::new("`reshape` of a partitioned value is not supported")
                        .help("reshape before partitioning, or after combination"),
                );
            }
            if !same_element_count(&t.shape, shape, &env.sizes) {
                return err(format!(
                    "reshape from {} to {} changes the number of elements",
                    shape_text(&t.shape),
                    shape_text(shape)
                ));
            }
            Ok(Type::Tensor(TensorType {
                dtype: t.dtype,
                shape: shape.clone(),
                par: t.par.clone(),
            }))
        }
        Slice(d, start, end, _) => slice(tensor(operands[0])?, d, start, end, &env.sizes),
        Concat(d, _) => {
            let ts = operands
                .iter()
                .map(|t| tensor(t))
                .collect::<TResult<Vec<_>>>()?;
            concat(&ts, d, &env.sizes)
        }
        Broadcast(shape, _) => {
            let t = tensor(operands[0])?;
            if shape.len() < t.rank() {
                return err(format!(
                    "cannot broadcast {} to the lower-rank shape {}",
                    shape_text(&t.shape),
                    shape_text(shape)
                ));
            }
            let off = shape.len() - t.rank();
            for (i, d) in t.shape.iter().enumerate() {
                if d != &shape[i + off] && !d.is_one() {
                    return err(format!(
                        "cannot broadcast {} to {}: dimension {d} against {}",
                        shape_text(&t.shape),
                        shape_text(shape),
                        shape[i + off]
                    ));
                }
            }
            for (a, k) in &t.par.0 {
                if let ParKind::Partition(d) = k {
                    if t.shape[*d] != shape[d + off] {
                        return err(format!(
                            "dimension {} is partitioned along `{a}` and cannot be broadcast",
                            t.shape[*d]
                        ));
                    }
                }
            }
            Ok(Type::Tensor(TensorType {
                dtype: t.dtype,
                shape: shape.clone(),
                par: t.par.remap_dims(|d| Some(d + off)),
            }))
        }
    }
}

fn leaf_annotation<'a>(kind: &ExprKind, annot: Option<&'a Type>) -> TResult<&'a TensorType> {
    match annot {
        Some(Type::Tensor(t)) => {
            if !t.par.is_empty() {
                return Err(TypeError::new(format!(
                    "`{}` values live in global memory and have no parallel state",
                    kind.op_name()
                ))
                .help("declare the tensor-level type and tile it with partition/replicate"));
            }
            Ok(t)
        }
        Some(Type::Tuple(_)) => err(format!(
            "`{}` needs a tensor type, not a tuple",
            kind.op_name()
        )),
        None => err(format!("`{}` needs a type annotation", kind.op_name())),
    }
}

fn replicate_tensor(t: &TensorType, axis: &str) -> TResult<TensorType> {
    if t.par.get(axis).is_some() {
        return Err(TypeError::new(format!(
            "axis `{axis}` already appears in the operand's {}",
            state_text(t)
        ))
        .help("each parallel axis indexes a value at most once; use a new axis name"));
    }
    let mut out = t.clone();
    out.par.0.insert(axis.into(), ParKind::Replicate);
    Ok(out)
}

fn collect_tensor(t: &TensorType, axis: &str) -> TResult<TensorType> {
    let Some(k) = t.par.get(axis) else {
        return Err(TypeError::new(format!(
            "collection[{axis}] needs a value on axis `{axis}`, but the operand has {}",
            state_text(t)
        ))
        .help("collection stores one slice per coordinate of an axis the value is on"));
    };
    let mut shape = vec![Dim::extent(axis)];
    for (i, d) in t.shape.iter().enumerate() {
        shape.push(if k == ParKind::Partition(i) {
            d.split_by(axis)
        } else {
            d.clone()
        });
    }
    let mut par = t.par.clone();
    par.0.remove(axis);
    Ok(TensorType {
        dtype: t.dtype,
        shape,
        par: par.remap_dims(|d| Some(d + 1)),
    })
}

/// The hint for an extent no symbol names: the binding that would name it.
fn name_it_help(p: &Poly) -> String {
    // A name from the expression's text: `T + 1` suggests `T1`, `NH*D` suggests `NHD`.
    let mut name: String = p
        .to_string()
        .chars()
        .filter_map(|c| match c {
            '-' => Some('M'),
            c if c.is_ascii_alphanumeric() || c == '_' => Some(c.to_ascii_uppercase()),
            _ => None,
        })
        .collect();
    if !name.starts_with(|c: char| c.is_ascii_uppercase()) {
        name.insert(0, 'N');
    }
    format!("name the size: add `{name} = {p}` to the function's `where` clause")
}

/// `slice[D, START, END](x)`: dimension `D` becomes `END - START`, which must be a literal or
/// the normal form of a dimension symbol. `D` must not be partitioned (the slice is of the
/// whole dimension); other dimensions and entries pass through.
fn slice(t: &TensorType, d: &DimRef, start: &Dim, end: &Dim, sizes: &SizeDefs) -> TResult<Type> {
    let i = resolve_dim(&t.shape, d)?;
    if let Some(a) = t.par.partitioner_of(i) {
        return Err(TypeError::new(format!(
            "slice of dimension {}, which is partitioned along `{a}`",
            t.shape[i]
        ))
        .help(format!(
            "slice the whole dimension: before partition[{},{a}] or after combination",
            t.shape[i]
        )));
    }
    for b in [start, end] {
        if !b.splits.is_empty() || matches!(b.base, DimBase::Extent(_)) {
            return err(format!(
                "slice bound {b} is neither an integer nor a dimension symbol"
            ));
        }
    }
    let (s, e, whole) = (
        sizes.normal(start),
        sizes.normal(end),
        sizes.normal(&t.shape[i]),
    );
    let len = e
        .checked_sub(&s)
        .ok_or_else(|| TypeError::new("slice bounds overflow"))?;
    match len.as_constant() {
        Some(n) if n <= 0 => {
            return Err(TypeError::new(format!(
                "slice [{start}, {end}) of dimension {} is empty",
                t.shape[i]
            ))
            .help("the end is exclusive and must be past the start"))
        }
        _ => {}
    }
    if let Some(n) = whole.checked_sub(&e).and_then(|r| r.as_constant()) {
        if n < 0 {
            let size = whole.to_string();
            return Err(TypeError::new(format!(
                "slice [{start}, {end}) runs past the end of dimension {}{}",
                t.shape[i],
                if size == t.shape[i].to_string() {
                    String::new()
                } else {
                    format!(" (size {size})")
                }
            ))
            .help("the end is exclusive: at most the dimension's size"));
        }
    }
    let Some(dim) = sizes.name(&len) else {
        return Err(TypeError::new(format!(
            "slice [{start}, {end}) of dimension {} has {len} elements, which no dimension symbol names",
            t.shape[i]
        ))
        .help(name_it_help(&len)));
    };
    let mut out = t.clone();
    out.shape[i] = dim;
    Ok(Type::Tensor(out))
}

/// `concat[D](a, b, …)`: operands of one dtype, rank and parallel state, equal in every
/// dimension but `D` (resolved against the first operand), which must be unpartitioned; the
/// result's `D` is the sum, a literal or the normal form of a dimension symbol.
fn concat(ts: &[&TensorType], d: &DimRef, sizes: &SizeDefs) -> TResult<Type> {
    let [first, rest @ ..] = ts else {
        return err("`concat` needs at least two operands");
    };
    if rest.is_empty() {
        return err("`concat` needs at least two operands")
            .map_err(|e| e.help("a single operand is the value itself"));
    }
    if first.rank() == 0 {
        return err("`concat` of scalars: operands need a dimension to join along");
    }
    let i = resolve_dim(&first.shape, d)?;
    if let Some(a) = first.par.partitioner_of(i) {
        return Err(TypeError::new(format!(
            "concat along dimension {}, which is partitioned along `{a}`",
            first.shape[i]
        ))
        .help("concatenate whole dimensions: partition another dimension, or join before partitioning"));
    }
    let mut total = sizes.normal(&first.shape[i]);
    for (k, t) in rest.iter().enumerate() {
        let which = k + 1;
        if t.dtype != first.dtype {
            return Err(TypeError::new(format!(
                "concat operand {which} is {}, operand 0 is {}",
                t.dtype, first.dtype
            ))
            .help("convert it with `cast(x) to=DTYPE`"));
        }
        if t.rank() != first.rank() {
            return Err(TypeError::new(format!(
                "concat operand {which} has shape {}, operand 0 has {}: ranks differ",
                shape_text(&t.shape),
                shape_text(&first.shape)
            ))
            .help("reshape or broadcast the operands to one rank"));
        }
        for (j, (a, b)) in first.shape.iter().zip(&t.shape).enumerate() {
            if j != i && a != b {
                return Err(TypeError::new(format!(
                    "concat operand {which} has shape {}, operand 0 has {}: dimension {j} differs ({b} against {a})",
                    shape_text(&t.shape),
                    shape_text(&first.shape)
                ))
                .help(format!("operands may differ only along the concatenated dimension {i}")));
            }
        }
        if t.par != first.par {
            return Err(TypeError::new(format!(
                "concat operands differ in parallel state: operand 0 has {}, operand {which} has {}",
                state_text(first),
                state_text(t)
            ))
            .help("tile every operand the same way (the same partition, replicate and partial entries)"));
        }
        total = total
            .checked_add(&sizes.normal(&t.shape[i]))
            .ok_or_else(|| TypeError::new("concat size overflows"))?;
    }
    let Some(dim) = sizes.name(&total) else {
        return Err(TypeError::new(format!(
            "concatenating along dimension {i} gives {total} elements, which no dimension symbol names"
        ))
        .help(name_it_help(&total)));
    };
    let mut out = (*first).clone();
    out.shape[i] = dim;
    Ok(Type::Tensor(out))
}

/// Whether two shapes hold as many elements at every size of their symbols: the products of
/// their normal forms agree (`BxHD` and `BxNHxD` with `HD = NH*D`).
fn same_element_count(a: &[Dim], b: &[Dim], sizes: &SizeDefs) -> bool {
    match (sizes.count(a), sizes.count(b)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

fn matmul(a: &TensorType, b: &TensorType, acc: Option<DType>, tiled: bool) -> TResult<Type> {
    let op = if tiled { "tile_matmul" } else { "matmul" };
    if a.rank() < 2 || b.rank() < 2 {
        return err(format!(
            "`{op}` needs operands of rank 2 or more, found {} and {}",
            shape_text(&a.shape),
            shape_text(&b.shape)
        ));
    }
    let (ra, rb) = (a.rank(), b.rank());
    if a.shape[ra - 1] != b.shape[rb - 2] {
        return Err(TypeError::new(format!(
            "`{op}` contraction dimensions differ: {} has {} but {} has {}",
            shape_text(&a.shape),
            a.shape[ra - 1],
            shape_text(&b.shape),
            b.shape[rb - 2]
        ))
        .help("the product contracts the last dimension of the lhs with the second-to-last of the rhs; transpose an operand"));
    }
    if !a.dtype.is_float() || !b.dtype.is_float() {
        return err(format!(
            "`{op}` needs floating-point operands, found {} and {}",
            a.dtype, b.dtype
        ));
    }
    let dtype = match acc {
        Some(t) if !t.is_float() => return err("`acc` must be a floating-point dtype"),
        Some(t) => t,
        None => promote(a.dtype, b.dtype)?,
    };
    let batch = broadcast_shapes(&[&a.shape[..ra - 2], &b.shape[..rb - 2]])?;
    let nb = batch.len();
    let mut shape = batch;
    shape.push(a.shape[ra - 2].clone());
    shape.push(b.shape[rb - 1].clone());
    let axes: BTreeSet<&Sym> = a.par.axes().chain(b.par.axes()).collect();
    let mut par = BTreeMap::new();
    for axis in axes {
        let (Some(ka), Some(kb)) = (a.par.get(axis), b.par.get(axis)) else {
            let (has, lacks) = if a.par.get(axis).is_some() {
                ("lhs", "rhs")
            } else {
                ("rhs", "lhs")
            };
            return Err(TypeError::new(format!("the {has} of `{op}` is on parallel axis `{axis}` but the {lacks} is not"))
                .help(format!("operands pair tiles at equal coordinates: replicate[{axis}] or partition the {lacks} too")));
        };
        // Map a batch dimension of an operand to the result's batch index.
        let batch_out = |rank: usize, d: usize| -> Option<usize> {
            (d + 2 < rank).then(|| d + nb - (rank - 2))
        };
        let batch_absent = |t: &TensorType, out_b: usize| -> bool {
            let rank = t.rank();
            let off = nb as isize - (rank as isize - 2);
            let local = out_b as isize - off;
            local < 0 || t.shape[local as usize].is_one()
        };
        let k = match (ka, kb) {
            (ParKind::Replicate, ParKind::Replicate) => ParKind::Replicate,
            (ParKind::Partial, ParKind::Replicate) | (ParKind::Replicate, ParKind::Partial) => ParKind::Partial,
            (ParKind::Partition(i), ParKind::Partition(j)) if i == ra - 1 && j == rb - 2 => {
                if !tiled {
                    return Err(TypeError::new(format!("operands of `matmul` are partitioned along the contraction dimension by `{axis}`"))
                        .help("matmul is tensor-level; a tiled product is `tile_matmul`, whose K-partitioned result is partial"));
                }
                ParKind::Partial
            }
            (ParKind::Partition(i), ParKind::Partition(j))
                if batch_out(ra, i).is_some() && batch_out(ra, i) == batch_out(rb, j) =>
            {
                ParKind::Partition(batch_out(ra, i).unwrap_or(0))
            }
            (ParKind::Partition(i), ParKind::Replicate) if batch_out(ra, i).is_some_and(|o| batch_absent(b, o)) => {
                ParKind::Partition(batch_out(ra, i).unwrap_or(0))
            }
            (ParKind::Replicate, ParKind::Partition(j)) if batch_out(rb, j).is_some_and(|o| batch_absent(a, o)) => {
                ParKind::Partition(batch_out(rb, j).unwrap_or(0))
            }
            (ParKind::Partition(i), ParKind::Replicate) if i == ra - 2 => {
                if !tiled {
                    return Err(TypeError::new(format!("the lhs of `matmul` is partitioned along M by `{axis}`"))
                        .help("matmul is tensor-level; use tile_matmul on tiles (or batch-partition only)"));
                }
                ParKind::Partition(nb)
            }
            (ParKind::Replicate, ParKind::Partition(j)) if j == rb - 1 => {
                if !tiled {
                    return Err(TypeError::new(format!("the rhs of `matmul` is partitioned along N by `{axis}`"))
                        .help("matmul is tensor-level; use tile_matmul on tiles (or batch-partition only)"));
                }
                ParKind::Partition(nb + 1)
            }
            _ => {
                return Err(TypeError::new(format!(
                    "`{op}` cannot pair lhs {} with rhs {}",
                    kind_text(a, ka, axis),
                    kind_text(b, kb, axis)
                ))
                .help(format!(
                    "valid views on one axis: M-partition × replicate, replicate × N-partition, K-partition × K-partition (gives partial), batch × batch, replicate × replicate{}",
                    if tiled { "" } else { " (matmul itself takes batch partitions only)" }
                )))
            }
        };
        par.insert(*axis, k);
    }
    Ok(Type::Tensor(TensorType {
        dtype,
        shape,
        par: ParState(par),
    }))
}

fn reduce(
    input: &Type,
    over: &ReduceOver,
    reducer: &ReducerRef,
    keep_dims: bool,
    env: &TypeEnv,
) -> TResult<Type> {
    match (reducer, over) {
        (ReducerRef::Builtin(b), ReduceOver::Axis(d)) => {
            let t = tensor(input)?;
            let i = resolve_dim(&t.shape, d)?;
            if t.dtype == DType::I1 {
                return err(format!("@{} does not apply to i1 values", b.name()));
            }
            let mut shape = t.shape.clone();
            let mut par = t.par.clone();
            if let Some(axis) = t.par.partitioner_of(i).map(str::to_string) {
                // Reducing a partitioned dimension leaves one contribution per tile.
                par.0.insert(axis.into(), ParKind::Partial);
            }
            if keep_dims {
                shape[i] = Dim::lit(1);
            } else {
                shape.remove(i);
                par = par.remap_dims(|d| if d > i { Some(d - 1) } else { Some(d) });
            }
            Ok(Type::Tensor(TensorType {
                dtype: t.dtype,
                shape,
                par,
            }))
        }
        (ReducerRef::Builtin(b), ReduceOver::Parallel(p)) => {
            let t = tensor(input)?;
            match t.par.get(p) {
                Some(ParKind::Partial) => {
                    let mut out = t.clone();
                    out.par.0.remove(p);
                    Ok(Type::Tensor(out))
                }
                other => Err(TypeError::new(format!(
                    "reduce parallel={p} with @{} needs partial({p}), but the operand has {}",
                    b.name(),
                    match other {
                        Some(k) => kind_text(t, k, p),
                        None => state_text(t),
                    }
                ))
                .help(match other {
                    Some(ParKind::Partition(_)) => format!("join slices with combination[DIM,{p}](…), or fold them with a user reducer"),
                    _ => format!("partial({p}) comes from reducing or contracting a dimension partitioned along `{p}`"),
                })),
            }
        }
        (ReducerRef::User(name), _) => {
            if keep_dims {
                return Err(
                    TypeError::new("`keep_dims` applies to built-in reducers only")
                        .help("a user reducer's result has the shape of its state"),
                );
            }
            let def = env
                .reducer(name)
                .ok_or_else(|| TypeError::new(format!("unknown reducer `@{name}`")))?;
            let items = reducer_items(def, input, over)?;
            instantiate(def, items, env).map(|(t, _)| t)
        }
    }
}

/// The item types a user reducer sees for `reduce INPUT over`: slices along a dimension (the
/// dimension removed) or the per-coordinate values of a parallel axis (tiles show `(K/p)`).
pub fn reducer_items(
    def: &ReducerDef,
    input: &Type,
    over: &ReduceOver,
) -> TResult<Vec<TensorType>> {
    let name = &def.name;
    let fields: Vec<&TensorType> = match input {
        Type::Tensor(t) => vec![t],
        Type::Tuple(fs) => fs.iter().map(tensor).collect::<TResult<_>>()?,
    };
    if fields.len() != def.item.len() {
        return err(format!(
            "@{name} takes an item of {} field(s), but the operand has {}",
            def.item.len(),
            fields.len()
        ));
    }
    let mut items = Vec::new();
    for f in fields {
        items.push(match over {
            ReduceOver::Axis(d) => {
                let i = resolve_dim(&f.shape, d)?;
                let mut shape = f.shape.clone();
                shape.remove(i);
                let mut par = f.par.clone();
                if let Some(axis) = f.par.partitioner_of(i).map(str::to_string) {
                    par.0.insert(axis.into(), ParKind::Partial);
                }
                let par = par.remap_dims(|d| if d > i { Some(d - 1) } else { Some(d) });
                TensorType {
                    dtype: f.dtype,
                    shape,
                    par,
                }
            }
            ReduceOver::Parallel(p) => {
                let Some(k) = f.par.get(p) else {
                    return err(format!(
                        "reduce parallel={p} needs every item field on axis `{p}`, but one has {}",
                        state_text(f)
                    ));
                };
                let mut t = f.clone();
                if let ParKind::Partition(i) = k {
                    t.shape[i] = t.shape[i].split_by(p);
                }
                t.par.0.remove(p);
                t
            }
        });
    }
    Ok(items)
}

/// The type of every node of a reducer's body for one use (at the state's fixed point).
pub fn reducer_body_types(
    def: &ReducerDef,
    input: &Type,
    over: &ReduceOver,
    env: &TypeEnv,
) -> TResult<Vec<Type>> {
    let items = reducer_items(def, input, over)?;
    instantiate(def, items, env).map(|(_, types)| types)
}

/// Types a reducer for one use: the state starts as f32 scalars replicated over the items'
/// parallel axes and is refined by typing the body until it reaches a fixed point.
fn instantiate(
    def: &ReducerDef,
    items: Vec<TensorType>,
    env: &TypeEnv,
) -> TResult<(Type, Vec<Type>)> {
    let key_types: Vec<Type> = items.iter().cloned().map(Type::Tensor).collect();
    let key = (def.name.clone(), key_types);
    let cached = |env: &TypeEnv| {
        env.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&key)
            .cloned()
    };
    if let Some(hit) = cached(env) {
        return hit;
    }
    if ACTIVE_REDUCERS.with(|a| a.borrow().contains(&def.name)) {
        return err(format!("reducer @{} uses itself", def.name))
            .map_err(|e| e.help("reducers cannot be recursive"));
    }
    ACTIVE_REDUCERS.with(|a| a.borrow_mut().push(def.name.clone()));
    let result = instantiate_uncached(def, &items, env);
    ACTIVE_REDUCERS.with(|a| a.borrow_mut().pop());
    env.cache
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(key, result.clone());
    result
}

fn instantiate_uncached(
    def: &ReducerDef,
    items: &[TensorType],
    env: &TypeEnv,
) -> TResult<(Type, Vec<Type>)> {
    let mut outer = BTreeMap::new();
    for t in items {
        for a in t.par.axes() {
            outer.insert(*a, ParKind::Replicate);
        }
    }
    let mut state: Vec<TensorType> = def
        .state
        .iter()
        .map(|_| TensorType {
            dtype: DType::F32,
            shape: vec![],
            par: ParState(outer.clone()),
        })
        .collect();
    for _round in 0..8 {
        let mut params: Vec<Type> = state.iter().cloned().map(Type::Tensor).collect();
        params.extend(items.iter().cloned().map(Type::Tensor));
        let types = type_body(&def.body, &params, env).map_err(|(span, mut e)| {
            e.span = e.span.or(Some(span));
            e.message = format!("in reducer @{}: {}", def.name, e.message);
            e
        })?;
        let Some(&result_id) = def.body.results.first() else {
            return err(format!("reducer @{} returns nothing", def.name));
        };
        let result = &types[result_id.index()];
        let next: Vec<TensorType> = match result {
            Type::Tuple(fs) if def.state.len() > 1 => fs
                .iter()
                .map(|f| tensor(f).cloned())
                .collect::<TResult<_>>()?,
            Type::Tensor(t) if def.state.len() == 1 => vec![t.clone()],
            Type::Tuple(fs) if def.state.len() == 1 && fs.len() == 1 => {
                vec![tensor(&fs[0])?.clone()]
            }
            other => {
                return Err(TypeError::new(format!(
                    "reducer @{} has {} state field(s) but its body returns {other}",
                    def.name,
                    def.state.len()
                ))
                .help("return tuple(…) with one value per state field"))
            }
        };
        if next.len() != state.len() {
            return err(format!(
                "reducer @{} returns {} field(s) for a state of {}",
                def.name,
                next.len(),
                state.len()
            ));
        }
        if next == state {
            let t = if state.len() == 1 {
                Type::Tensor(state.remove(0))
            } else {
                Type::Tuple(state.into_iter().map(Type::Tensor).collect())
            };
            return Ok((t, types));
        }
        state = next;
    }
    Err(TypeError::new(format!(
        "the state type of reducer @{} does not settle",
        def.name
    ))
    .help("each state field's type must be the same before and after one step of the body"))
}

/// Types every node of a body given its parameter types. On failure returns the failing
/// node's span with the error.
pub fn type_body(
    body: &Body,
    params: &[Type],
    env: &TypeEnv,
) -> Result<Vec<Type>, (Span, TypeError)> {
    let mut types: Vec<Type> = Vec::with_capacity(body.nodes.len());
    let placeholder = Type::Tuple(vec![]);
    let mut param_index = 0;
    for id in body.ids() {
        let n = body.node(id);
        let t = if n.kind == ExprKind::Param {
            let t = params.get(param_index).cloned();
            param_index += 1;
            t.ok_or_else(|| (n.span, TypeError::new("reducer parameter without a type")))?
        } else {
            let ops: Vec<&Type> = n
                .kind
                .operands()
                .iter()
                .map(|o| types.get(o.index()).unwrap_or(&placeholder))
                .collect();
            let kind = resolve_field_name(body, &n.kind, env).map_err(|e| (n.span, e))?;
            let t = infer(
                kind.as_ref().unwrap_or(&n.kind),
                &ops,
                n.annot.as_ref(),
                env,
            )
            .map_err(|e| (n.span, e))?;
            if let Some(a) = &n.annot {
                if !n.kind.needs_annotation() && a != &t {
                    return Err((n.span, annotation_mismatch(a, &t)));
                }
            }
            t
        };
        types.push(t);
    }
    Ok(types)
}

pub fn annotation_mismatch(declared: &Type, inferred: &Type) -> TypeError {
    TypeError::new(format!(
        "declared type {declared} does not match the inferred type {inferred}"
    ))
    .help("fix the annotation or the expression; annotations are checked, never coerced")
}

/// `get[sum](r)` names a state field of the reducer that produced `r`; resolve it to an index.
pub fn resolve_field_name(
    body: &Body,
    kind: &ExprKind,
    env: &TypeEnv,
) -> TResult<Option<ExprKind>> {
    let ExprKind::Get(FieldRef::Name(field), x) = kind else {
        return Ok(None);
    };
    let producer = &body.node(*x).kind;
    if let ExprKind::Reduce {
        reducer: ReducerRef::User(r),
        ..
    } = producer
    {
        if let Some(def) = env.reducer(r) {
            return match def.state.iter().position(|s| s == field) {
                Some(i) => Ok(Some(ExprKind::Get(FieldRef::Index(i), *x))),
                None => Err(
                    TypeError::new(format!("reducer @{r} has no state field `{field}`"))
                        .help(format!("its state fields are: {}", def.state.join(", "))),
                ),
            };
        }
    }
    Err(TypeError::new(format!(
        "field `{field}` can only be named on the result of a reducer with that state field"
    ))
    .help("use a field index: `get[0](t)`"))
}
