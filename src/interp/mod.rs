//! The reference interpreter: evaluates any verified program — tensor-level or tiled — on the
//! CPU.
//!
//! A value with parallel state is held as one dense tile per coordinate of its parallel axes
//! (axes sorted by name, coordinates row-major). Operations act tile by tile at matching
//! coordinates, exactly as the IR's semantics say, so a hand-tiled program is checked by
//! running its tiles, not by trusting a lowering. Narrow dtypes are emulated by rounding each
//! operation's result to its dtype; reductions accumulate in f64 and products in f32.

pub mod tensor;

use crate::diag::{Diagnostic, Span};
use crate::ir::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
pub use tensor::{Rng, Tensor};

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct InterpError {
    pub message: String,
    pub span: Option<Span>,
}

impl InterpError {
    fn at(span: Span, message: impl Into<String>) -> InterpError {
        InterpError {
            message: message.into(),
            span: Some(span),
        }
    }

    pub fn into_diagnostic(self) -> Diagnostic {
        match self.span {
            Some(s) => Diagnostic::error(s, self.message),
            None => Diagnostic::global(crate::diag::Severity::Error, self.message),
        }
    }
}

/// A tensor value with its tiles: one per coordinate of `axes` (sorted, with extents).
#[derive(Clone, Debug)]
pub struct TiledTensor {
    pub dtype: DType,
    pub axes: Vec<(String, usize)>,
    pub tiles: Vec<Arc<Tensor>>,
}

#[derive(Clone, Debug)]
pub enum Value {
    Tensor(TiledTensor),
    Tuple(Vec<Value>),
}

impl Value {
    fn tensor(&self) -> Result<&TiledTensor, String> {
        match self {
            Value::Tensor(t) => Ok(t),
            Value::Tuple(_) => Err("expected a tensor value, found a tuple".into()),
        }
    }

    /// The dense tensor of a value without parallel state.
    pub fn dense(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) if t.axes.is_empty() => t.tiles.first().map(|a| a.as_ref()),
            _ => None,
        }
    }

    /// All dense leaves of a value without parallel state, in field order.
    pub fn leaves(&self) -> Vec<(DType, &Tensor)> {
        match self {
            Value::Tensor(t) => t
                .tiles
                .iter()
                .take(1)
                .map(|x| (t.dtype, x.as_ref()))
                .collect(),
            Value::Tuple(fs) => fs.iter().flat_map(|f| f.leaves()).collect(),
        }
    }
}

impl TiledTensor {
    fn dense(dtype: DType, t: Tensor) -> TiledTensor {
        TiledTensor {
            dtype,
            axes: vec![],
            tiles: vec![Arc::new(t)],
        }
    }

    fn extent(&self, axis: &str) -> Option<usize> {
        self.axes.iter().find(|(a, _)| a == axis).map(|(_, e)| *e)
    }

    /// The tile at the coordinate given as a map from axis name to index; axes this value is
    /// not on are ignored (a rank-0 literal is implicitly replicated).
    fn tile_at(&self, coord: &BTreeMap<&str, usize>) -> &Arc<Tensor> {
        let mut lin = 0;
        for (a, e) in &self.axes {
            lin = lin * e + coord.get(a.as_str()).copied().unwrap_or(0);
        }
        &self.tiles[lin]
    }
}

/// Iterates the coordinates of `axes` row-major as name → index maps.
fn for_coords(axes: &[(String, usize)]) -> Vec<BTreeMap<&str, usize>> {
    let total: usize = axes.iter().map(|(_, e)| *e).product();
    (0..total)
        .map(|mut lin| {
            let mut m = BTreeMap::new();
            for (a, e) in axes.iter().rev() {
                m.insert(a.as_str(), lin % e);
                lin /= e;
            }
            m
        })
        .collect()
}

fn union_axes(ts: &[&TiledTensor]) -> Vec<(String, usize)> {
    let mut m: BTreeMap<String, usize> = BTreeMap::new();
    for t in ts {
        for (a, e) in &t.axes {
            m.insert(a.clone(), *e);
        }
    }
    m.into_iter().collect()
}

fn sorted_insert(axes: &[(String, usize)], axis: &str, extent: usize) -> Vec<(String, usize)> {
    let mut v = axes.to_vec();
    v.push((axis.to_string(), extent));
    v.sort();
    v
}

fn without(axes: &[(String, usize)], axis: &str) -> Vec<(String, usize)> {
    axes.iter().filter(|(a, _)| a != axis).cloned().collect()
}

/// Concrete sizes of dimension symbols and parallel-axis extents.
#[derive(Clone, Debug, Default)]
pub struct Sizes(pub HashMap<String, u64>);

impl Sizes {
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.get(name).copied()
    }

    pub fn eval_shape(&self, shape: &[Dim]) -> Result<Vec<usize>, String> {
        shape
            .iter()
            .map(|d| d.eval(&|n| self.get(n)).map(|v| v as usize))
            .collect()
    }

    /// Sizes for a function: its `where` bindings, then a default extent for every parallel axis
    /// it partitions with: the largest divisor, at most `max_extent`, of the partitioned sizes.
    pub fn for_function(f: &Function, max_extent: u64) -> Sizes {
        let bound = Sizes(
            f.bindings
                .iter()
                .map(|b| (b.name.clone(), b.value))
                .collect(),
        );
        let mut views: Vec<(String, Option<u64>)> = Vec::new();
        for n in &f.body.nodes {
            match &n.kind {
                ExprKind::Partition(d, a, x) => {
                    let size = match f.body.ty(*x) {
                        Some(Type::Tensor(t)) => crate::ir::resolve_dim(&t.shape, d)
                            .ok()
                            .and_then(|i| t.shape[i].eval(&|s| bound.get(s)).ok()),
                        _ => None,
                    };
                    views.push((a.to_string(), size));
                }
                ExprKind::Replicate(a, _)
                | ExprKind::Collection(a, _)
                | ExprKind::Combination(_, a, _) => views.push((a.to_string(), None)),
                ExprKind::Reduce {
                    over: ReduceOver::Parallel(a),
                    ..
                } => views.push((a.to_string(), None)),
                _ => {}
            }
        }
        bound.with_default_extents(&views, max_extent)
    }

    /// Adds an extent for every axis in `views` that has none: the largest divisor, at most
    /// `max_extent`, of all sizes the axis partitions (`Some(size)`), or 2 if it partitions
    /// nothing.
    pub fn with_default_extents(
        mut self,
        views: &[(String, Option<u64>)],
        max_extent: u64,
    ) -> Sizes {
        fn gcd(a: u64, b: u64) -> u64 {
            if b == 0 {
                a
            } else {
                gcd(b, a % b)
            }
        }
        let mut gcds: BTreeMap<&str, u64> = BTreeMap::new();
        for (a, size) in views {
            let g = gcds.entry(a.as_str()).or_insert(0);
            if let Some(s) = size {
                *g = gcd(*g, *s);
            }
        }
        for (a, g) in gcds {
            if self.get(a).is_some() {
                continue;
            }
            let e = if g > 0 {
                (1..=max_extent.min(g))
                    .rev()
                    .find(|d| g % d == 0)
                    .unwrap_or(1)
            } else {
                2
            };
            self.0.insert(a.to_string(), e);
        }
        self
    }
}

/// Random inputs for a function: standard normal values (uniform indices for i32, coin flips
/// for i1), rounded to each input's dtype, from a seed. `scale` multiplies float inputs (large
/// magnitudes probe numerical robustness).
pub fn random_inputs(
    f: &Function,
    sizes: &Sizes,
    seed: u64,
    scale: f32,
) -> Result<Vec<Value>, InterpError> {
    let mut out = Vec::new();
    for (i, p) in f.body.params.iter().enumerate() {
        let n = f.body.node(*p);
        let Some(Type::Tensor(t)) = n.annot.as_ref() else {
            return Err(InterpError::at(n.span, "input without a tensor type"));
        };
        let shape = sizes
            .eval_shape(&t.shape)
            .map_err(|e| InterpError::at(n.span, e))?;
        let mut tensor = Tensor::filled(shape, 0.0).map_err(|e| InterpError::at(n.span, e))?;
        let mut rng = Rng::new(
            seed.wrapping_mul(0x100_0000_01b3)
                .wrapping_add(i as u64 * 7919 + 1),
        );
        for x in tensor.data.iter_mut() {
            *x = match t.dtype {
                DType::I32 => rng.below(16) as f32,
                DType::I1 => (rng.below(2)) as f32,
                _ => rng.normal() as f32 * scale,
            };
        }
        tensor.round(t.dtype);
        out.push(Value::Tensor(TiledTensor::dense(t.dtype, tensor)));
    }
    Ok(out)
}

pub struct Interpreter<'m> {
    module: &'m Module,
    sizes: Sizes,
    /// The derived sizes of the function being run, to type reducer bodies per use.
    defs: SizeDefs,
    /// Computes bf16/f16 operations without rounding their results (inputs and constants
    /// keep their values): how far a narrow program is from exact arithmetic.
    exact_floats: bool,
}

fn dtype_of_binary(op: BinaryOp, a: DType, b: DType) -> DType {
    if op.is_comparison() || op.is_logical() {
        DType::I1
    } else {
        DType::promote(a, b).unwrap_or(DType::F32)
    }
}

pub(crate) fn unary_fn(op: UnaryOp) -> fn(f32) -> f32 {
    match op {
        UnaryOp::Exp => f32::exp,
        UnaryOp::Log => f32::ln,
        UnaryOp::Sqrt => f32::sqrt,
        UnaryOp::Rsqrt => |x| 1.0 / x.sqrt(),
        UnaryOp::Reciprocal => |x| 1.0 / x,
        UnaryOp::Neg => |x| -x,
        UnaryOp::Abs => f32::abs,
        UnaryOp::Tanh => f32::tanh,
        UnaryOp::Sigmoid => |x| 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Silu => |x| x / (1.0 + (-x).exp()),
        UnaryOp::Gelu => |x| 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh()),
        UnaryOp::Square => |x| x * x,
    }
}

pub(crate) fn binary_fn(op: BinaryOp) -> fn(f32, f32) -> f32 {
    match op {
        BinaryOp::Add => |x, y| x + y,
        BinaryOp::Subtract => |x, y| x - y,
        BinaryOp::Multiply => |x, y| x * y,
        BinaryOp::Divide => |x, y| x / y,
        BinaryOp::Maximum => |x, y| {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else {
                x.max(y)
            }
        },
        BinaryOp::Minimum => |x, y| {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else {
                x.min(y)
            }
        },
        BinaryOp::Pow => f32::powf,
        BinaryOp::Less => |x, y| (x < y) as u8 as f32,
        BinaryOp::LessEqual => |x, y| (x <= y) as u8 as f32,
        BinaryOp::Greater => |x, y| (x > y) as u8 as f32,
        BinaryOp::GreaterEqual => |x, y| (x >= y) as u8 as f32,
        BinaryOp::Equal => |x, y| (x == y) as u8 as f32,
        BinaryOp::NotEqual => |x, y| (x != y) as u8 as f32,
        BinaryOp::And => |x, y| (x != 0.0 && y != 0.0) as u8 as f32,
        BinaryOp::Or => |x, y| (x != 0.0 || y != 0.0) as u8 as f32,
    }
}

fn builtin_fold(r: BuiltinReducer) -> fn(f64, f64) -> f64 {
    match r {
        BuiltinReducer::Add => |a, b| a + b,
        BuiltinReducer::Mul => |a, b| a * b,
        BuiltinReducer::Max => |a, b| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        },
        BuiltinReducer::Min => |a, b| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        },
    }
}

impl<'m> Interpreter<'m> {
    pub fn new(module: &'m Module, sizes: Sizes) -> Interpreter<'m> {
        Interpreter {
            module,
            sizes,
            defs: SizeDefs::default(),
            exact_floats: false,
        }
    }

    /// Evaluates without rounding operations to bf16/f16 (see `exact_floats`).
    pub fn with_exact_floats(mut self) -> Self {
        self.exact_floats = true;
        self
    }

    /// The dtype an operation's result rounds to.
    fn rounding(&self, dtype: DType) -> DType {
        match dtype {
            DType::BF16 | DType::F16 if self.exact_floats => DType::F32,
            _ => dtype,
        }
    }

    pub fn sizes(&self) -> &Sizes {
        &self.sizes
    }

    /// Runs a verified function on the given inputs and returns its results.
    pub fn run(&self, f: &Function, inputs: &[Value]) -> Result<Vec<Value>, InterpError> {
        if inputs.len() != f.body.params.len() {
            return Err(InterpError::at(
                f.name_span,
                format!(
                    "`{}` takes {} inputs, got {}",
                    f.name,
                    f.body.params.len(),
                    inputs.len()
                ),
            ));
        }
        let defs = SizeDefs::from_bindings(&f.bindings);
        if defs != self.defs {
            let with_defs = Interpreter {
                module: self.module,
                sizes: self.sizes.clone(),
                defs,
                exact_floats: self.exact_floats,
            };
            return with_defs.eval_body(&f.body, inputs);
        }
        self.eval_body(&f.body, inputs)
    }

    fn eval_body(&self, body: &Body, params: &[Value]) -> Result<Vec<Value>, InterpError> {
        // Drop each value after its last use so large programs stay within memory.
        let mut last_use = vec![0usize; body.nodes.len()];
        for id in body.ids() {
            for o in body.node(id).kind.operands() {
                last_use[o.index()] = id.index();
            }
        }
        for r in &body.results {
            last_use[r.index()] = usize::MAX;
        }
        let mut values: Vec<Option<Value>> = vec![None; body.nodes.len()];
        let mut param_index = 0;
        for id in body.ids() {
            let n = body.node(id);
            let v = if matches!(n.kind, ExprKind::Input | ExprKind::Param) {
                let v = params
                    .get(param_index)
                    .cloned()
                    .ok_or_else(|| InterpError::at(n.span, "missing argument"))?;
                param_index += 1;
                v
            } else {
                let ops: Vec<&Value> = n
                    .kind
                    .operands()
                    .iter()
                    .map(|o| {
                        values[o.index()]
                            .as_ref()
                            .ok_or_else(|| InterpError::at(n.span, "operand value was dropped"))
                    })
                    .collect::<Result<_, _>>()?;
                self.eval_node(body, n, &ops)
                    .map_err(|e| InterpError::at(n.span, e))?
            };
            values[id.index()] = Some(v);
            for o in n.kind.operands() {
                if last_use[o.index()] == id.index() {
                    values[o.index()] = None;
                }
            }
        }
        body.results
            .iter()
            .map(|r| {
                values[r.index()]
                    .clone()
                    .ok_or_else(|| InterpError::at(body.results_span, "result was not computed"))
            })
            .collect()
    }

    fn leaf_tensor(&self, n: &Node) -> Result<(DType, Vec<usize>), String> {
        match &n.annot {
            Some(Type::Tensor(t)) => Ok((t.dtype, self.sizes.eval_shape(&t.shape)?)),
            _ => Err("leaf without a tensor type".into()),
        }
    }

    fn eval_node(&self, body: &Body, n: &Node, ops: &[&Value]) -> Result<Value, String> {
        use ExprKind::*;
        let tt = |t: TiledTensor| Ok(Value::Tensor(t));
        match &n.kind {
            Input | Param => Err("parameters are bound by the caller".into()),
            Call(f, _) => {
                let callee = self
                    .module
                    .funcs
                    .iter()
                    .find(|g| g.name == *f)
                    .ok_or_else(|| format!("no function `{f}` to call"))?;
                let args: Vec<Value> = ops.iter().map(|v| (*v).clone()).collect();
                let mut results = self.run(callee, &args).map_err(|e| e.message)?;
                Ok(if results.len() == 1 {
                    results.remove(0)
                } else {
                    Value::Tuple(results)
                })
            }
            Constant(v) | Fill(v) => {
                let (dt, shape) = self.leaf_tensor(n)?;
                let mut t = Tensor::filled(shape, *v as f32)?;
                t.round(dt);
                tt(TiledTensor::dense(dt, t))
            }
            Iota(d) => {
                let (dt, shape) = self.leaf_tensor(n)?;
                let Some(Type::Tensor(ty)) = &n.annot else {
                    return Err("iota without type".into());
                };
                let dim = crate::ir::resolve_dim(&ty.shape, d).map_err(|e| e.message)?;
                let mut t = Tensor::iota(shape, dim)?;
                t.round(dt);
                tt(TiledTensor::dense(dt, t))
            }
            Tuple(_) => Ok(Value::Tuple(ops.iter().map(|v| (*v).clone()).collect())),
            Get(field, x) => {
                let i = match field {
                    FieldRef::Index(i) => *i,
                    FieldRef::Name(name) => self.field_index(body, *x, name)?,
                };
                match ops[0] {
                    Value::Tuple(fs) => fs
                        .get(i)
                        .cloned()
                        .ok_or_else(|| format!("field {i} out of range")),
                    Value::Tensor(_) => Err("get on a tensor".into()),
                }
            }
            Partition(d, axis, _) => {
                let t = ops[0].tensor()?;
                let dim = self.tile_dim(n, body, d)?;
                let extent = self.axis_extent(axis)?;
                let axes = sorted_insert(&t.axes, axis, extent);
                let mut tiles = Vec::new();
                for c in for_coords(&axes) {
                    let src = t.tile_at(&c);
                    let full = src.shape[dim];
                    if full % extent != 0 {
                        return Err(format!("extent {extent} of axis `{axis}` does not divide dimension {d} of size {full}; set another extent with --set {axis}=N"));
                    }
                    let len = full / extent;
                    tiles.push(Arc::new(src.slice(dim, c[axis.as_str()] * len, len)));
                }
                tt(TiledTensor {
                    dtype: t.dtype,
                    axes,
                    tiles,
                })
            }
            Replicate(axis, _) => self.replicate(ops[0], axis),
            Combination(d, axis, _) => {
                let t = ops[0].tensor()?;
                let dim = self.tile_dim(n, body, d)?;
                let extent = t
                    .extent(axis)
                    .ok_or("combination over an axis the value is not on")?;
                let axes = without(&t.axes, axis);
                let mut tiles = Vec::new();
                for c in for_coords(&axes) {
                    let mut parts = Vec::new();
                    for j in 0..extent {
                        let mut cj = c.clone();
                        cj.insert(axis.as_str(), j);
                        parts.push(t.tile_at(&cj).as_ref());
                    }
                    tiles.push(Arc::new(Tensor::concat(&parts, dim)));
                }
                tt(TiledTensor {
                    dtype: t.dtype,
                    axes,
                    tiles,
                })
            }
            Collection(axis, _) => self.collect(ops[0], axis),
            Unary(op, _) => {
                let t = ops[0].tensor()?;
                let f = unary_fn(*op);
                let tiles = t
                    .tiles
                    .iter()
                    .map(|x| {
                        let mut r = Tensor::zip(&[x], |v| f(v[0]))?;
                        r.round(self.rounding(t.dtype));
                        Ok(Arc::new(r))
                    })
                    .collect::<Result<_, String>>()?;
                tt(TiledTensor {
                    dtype: t.dtype,
                    axes: t.axes.clone(),
                    tiles,
                })
            }
            Binary(op, ..) => {
                let (a, b) = (ops[0].tensor()?, ops[1].tensor()?);
                let f = binary_fn(*op);
                let dt = dtype_of_binary(*op, a.dtype, b.dtype);
                self.pointwise(&[a, b], dt, move |v| f(v[0], v[1]))
            }
            Select(..) => {
                let (c, a, b) = (ops[0].tensor()?, ops[1].tensor()?, ops[2].tensor()?);
                let dt = DType::promote(a.dtype, b.dtype).unwrap_or(DType::F32);
                self.pointwise(&[c, a, b], dt, |v| if v[0] != 0.0 { v[1] } else { v[2] })
            }
            Cast(to, _) => {
                let t = ops[0].tensor()?;
                let tiles = t
                    .tiles
                    .iter()
                    .map(|x| {
                        let mut r = (**x).clone();
                        r.round(self.rounding(*to));
                        Arc::new(r)
                    })
                    .collect();
                tt(TiledTensor {
                    dtype: *to,
                    axes: t.axes.clone(),
                    tiles,
                })
            }
            MatMul { acc, .. } | TileMatMul { acc, .. } => {
                let (a, b) = (ops[0].tensor()?, ops[1].tensor()?);
                let dt =
                    acc.unwrap_or_else(|| DType::promote(a.dtype, b.dtype).unwrap_or(DType::F32));
                let axes = union_axes(&[a, b]);
                let mut tiles = Vec::new();
                for c in for_coords(&axes) {
                    let mut r = Tensor::matmul(a.tile_at(&c), b.tile_at(&c))?;
                    r.round(self.rounding(dt));
                    tiles.push(Arc::new(r));
                }
                tt(TiledTensor {
                    dtype: dt,
                    axes,
                    tiles,
                })
            }
            Reduce {
                input,
                over,
                reducer,
                keep_dims,
            } => self.reduce(body, n, *input, ops[0], over, reducer, *keep_dims),
            Transpose(perm, _) => {
                let t = ops[0].tensor()?;
                let tiles = t
                    .tiles
                    .iter()
                    .map(|x| Arc::new(x.transpose(perm)))
                    .collect();
                tt(TiledTensor {
                    dtype: t.dtype,
                    axes: t.axes.clone(),
                    tiles,
                })
            }
            Reshape(shape, _) => {
                let t = ops[0].tensor()?;
                let target = self.sizes.eval_shape(shape)?;
                let tiles = t
                    .tiles
                    .iter()
                    .map(|x| {
                        if tensor::element_count(&target)? != x.data.len() {
                            return Err(format!(
                                "reshape to {target:?} changes the element count of a {:?} tile",
                                x.shape
                            ));
                        }
                        Ok(Arc::new(Tensor {
                            shape: target.clone(),
                            data: x.data.clone(),
                        }))
                    })
                    .collect::<Result<_, String>>()?;
                tt(TiledTensor {
                    dtype: t.dtype,
                    axes: t.axes.clone(),
                    tiles,
                })
            }
            Slice(d, start, end, _) => {
                let t = ops[0].tensor()?;
                let dim = self.tile_dim(n, body, d)?;
                let bound = |b: &Dim| b.eval(&|s| self.sizes.get(s)).map(|v| v as usize);
                let (s, e) = (bound(start)?, bound(end)?);
                let tiles = t
                    .tiles
                    .iter()
                    .map(|x| {
                        let full = x.shape[dim];
                        if s >= e || e > full {
                            let symbolic = if start.to_string() != s.to_string()
                                || end.to_string() != e.to_string()
                            {
                                format!(" ([{start}, {end}) at these sizes)")
                            } else {
                                String::new()
                            };
                            return Err(format!(
                                "slice [{s}, {e}){symbolic} is out of range for a dimension of size {full}"
                            ));
                        }
                        Ok(Arc::new(x.slice(dim, s, e - s)))
                    })
                    .collect::<Result<_, String>>()?;
                tt(TiledTensor {
                    dtype: t.dtype,
                    axes: t.axes.clone(),
                    tiles,
                })
            }
            Concat(d, _) => {
                let ts: Vec<&TiledTensor> =
                    ops.iter().map(|v| v.tensor()).collect::<Result<_, _>>()?;
                let dim = self.tile_dim(n, body, d)?;
                let axes = union_axes(&ts);
                let mut tiles = Vec::new();
                for c in for_coords(&axes) {
                    let parts: Vec<&Tensor> = ts.iter().map(|t| t.tile_at(&c).as_ref()).collect();
                    let like = |p: &Tensor| {
                        let mut s = p.shape.clone();
                        if let Some(x) = s.get_mut(dim) {
                            *x = 0;
                        }
                        s
                    };
                    if parts
                        .iter()
                        .any(|p| p.shape.len() != parts[0].shape.len() || like(p) != like(parts[0]))
                    {
                        return Err(format!(
                            "concat of tiles shaped {:?}: they differ off dimension {dim}",
                            parts.iter().map(|p| p.shape.clone()).collect::<Vec<_>>()
                        ));
                    }
                    tiles.push(Arc::new(Tensor::concat(&parts, dim)));
                }
                tt(TiledTensor {
                    dtype: ts[0].dtype,
                    axes,
                    tiles,
                })
            }
            Broadcast(shape, _) => {
                let t = ops[0].tensor()?;
                let target = self.sizes.eval_shape(shape)?;
                // The tile shape comes from the result type: a partitioned dimension is
                // divided by its axis extent, whatever the tile's size.
                let mut tile_target = target.clone();
                if let Some(Type::Tensor(ty)) = &n.ty {
                    for (axis, kind) in &ty.par.0 {
                        if let ParKind::Partition(d) = kind {
                            let e = self.axis_extent(axis)?;
                            if e == 0 || tile_target[*d] % e != 0 {
                                return Err(format!(
                                    "extent {e} of axis `{axis}` does not divide dimension {d}"
                                ));
                            }
                            tile_target[*d] /= e;
                        }
                    }
                } else {
                    return Err("broadcast needs its result type; run verify first".into());
                }
                let tiles = t
                    .tiles
                    .iter()
                    .map(|x| x.broadcast_to(&tile_target).map(Arc::new))
                    .collect::<Result<_, String>>()?;
                tt(TiledTensor {
                    dtype: t.dtype,
                    axes: t.axes.clone(),
                    tiles,
                })
            }
        }
    }

    fn axis_extent(&self, axis: &str) -> Result<usize, String> {
        self.sizes
            .get(axis)
            .map(|e| e as usize)
            .ok_or_else(|| format!("parallel axis `{axis}` has no extent; bind it with `where {axis} = N` or --set {axis}=N"))
    }

    /// The index of a dimension reference in the operand's shape (from the operand's type).
    fn tile_dim(&self, n: &Node, body: &Body, d: &DimRef) -> Result<usize, String> {
        let x = n.kind.operands()[0];
        match (d, body.ty(x)) {
            (_, Some(Type::Tensor(t))) => {
                crate::ir::resolve_dim(&t.shape, d).map_err(|e| e.message)
            }
            (DimRef::Index(i), _) => Ok(*i),
            (DimRef::Name(name), _) => Err(format!(
                "dimension {name} needs the operand's type; run verify first"
            )),
        }
    }

    fn field_index(&self, body: &Body, x: NodeId, name: &str) -> Result<usize, String> {
        if let ExprKind::Reduce {
            reducer: ReducerRef::User(r),
            ..
        } = &body.node(x).kind
        {
            if let Some(def) = self.module.reducer(r) {
                if let Some(i) = def.state.iter().position(|s| s == name) {
                    return Ok(i);
                }
            }
        }
        Err(format!("unknown field `{name}`"))
    }

    fn replicate(&self, v: &Value, axis: &str) -> Result<Value, String> {
        match v {
            Value::Tuple(fs) => Ok(Value::Tuple(
                fs.iter()
                    .map(|f| self.replicate(f, axis))
                    .collect::<Result<_, _>>()?,
            )),
            Value::Tensor(t) => {
                let extent = self.axis_extent(axis)?;
                let axes = sorted_insert(&t.axes, axis, extent);
                let tiles = for_coords(&axes)
                    .iter()
                    .map(|c| t.tile_at(c).clone())
                    .collect();
                Ok(Value::Tensor(TiledTensor {
                    dtype: t.dtype,
                    axes,
                    tiles,
                }))
            }
        }
    }

    fn collect(&self, v: &Value, axis: &str) -> Result<Value, String> {
        match v {
            Value::Tuple(fs) => Ok(Value::Tuple(
                fs.iter()
                    .map(|f| self.collect(f, axis))
                    .collect::<Result<_, _>>()?,
            )),
            Value::Tensor(t) => {
                let extent = t
                    .extent(axis)
                    .ok_or("collection over an axis the value is not on")?;
                let axes = without(&t.axes, axis);
                let mut tiles = Vec::new();
                for c in for_coords(&axes) {
                    let mut parts = Vec::new();
                    for j in 0..extent {
                        let mut cj = c.clone();
                        cj.insert(axis, j);
                        parts.push(t.tile_at(&cj).as_ref());
                    }
                    tiles.push(Arc::new(Tensor::stack(&parts)));
                }
                Ok(Value::Tensor(TiledTensor {
                    dtype: t.dtype,
                    axes,
                    tiles,
                }))
            }
        }
    }

    fn pointwise(
        &self,
        ts: &[&TiledTensor],
        dt: DType,
        f: impl Fn(&[f32]) -> f32 + Sync,
    ) -> Result<Value, String> {
        let axes = union_axes(ts);
        let mut tiles = Vec::new();
        for c in for_coords(&axes) {
            let args: Vec<&Tensor> = ts.iter().map(|t| t.tile_at(&c).as_ref()).collect();
            let mut r = Tensor::zip(&args, &f)?;
            r.round(self.rounding(dt));
            tiles.push(Arc::new(r));
        }
        Ok(Value::Tensor(TiledTensor {
            dtype: dt,
            axes,
            tiles,
        }))
    }

    /// The item at coordinate `j` of parallel axis `p` (a tile, a contribution or a replica).
    fn select_coord(v: &Value, p: &str, j: usize) -> Result<Value, String> {
        match v {
            Value::Tuple(fs) => Ok(Value::Tuple(
                fs.iter()
                    .map(|f| Self::select_coord(f, p, j))
                    .collect::<Result<_, _>>()?,
            )),
            Value::Tensor(t) => {
                let axes = without(&t.axes, p);
                let tiles = for_coords(&axes)
                    .into_iter()
                    .map(|mut c| {
                        c.insert(p, j);
                        t.tile_at(&c).clone()
                    })
                    .collect();
                Ok(Value::Tensor(TiledTensor {
                    dtype: t.dtype,
                    axes,
                    tiles,
                }))
            }
        }
    }

    /// The slice at index `k` of dimension `dim` of every tile, with the dimension removed.
    fn select_index(
        v: &Value,
        dims: &mut impl Iterator<Item = usize>,
        k: usize,
    ) -> Result<Value, String> {
        match v {
            Value::Tuple(fs) => Ok(Value::Tuple(
                fs.iter()
                    .map(|f| Self::select_index(f, dims, k))
                    .collect::<Result<_, _>>()?,
            )),
            Value::Tensor(t) => {
                let dim = dims.next().ok_or("missing reduced dimension")?;
                let tiles = t
                    .tiles
                    .iter()
                    .map(|x| {
                        let mut s = x.slice(dim, k, 1);
                        s.shape.remove(dim);
                        Arc::new(s)
                    })
                    .collect();
                Ok(Value::Tensor(TiledTensor {
                    dtype: t.dtype,
                    axes: t.axes.clone(),
                    tiles,
                }))
            }
        }
    }

    fn leaves_axes(v: &Value, out: &mut Vec<(String, usize)>) {
        match v {
            Value::Tensor(t) => out.extend(t.axes.iter().cloned()),
            Value::Tuple(fs) => fs.iter().for_each(|f| Self::leaves_axes(f, out)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        body: &Body,
        n: &Node,
        input: NodeId,
        v: &Value,
        over: &ReduceOver,
        reducer: &ReducerRef,
        keep_dims: bool,
    ) -> Result<Value, String> {
        match (reducer, over) {
            (ReducerRef::Builtin(r), ReduceOver::Axis(d)) => {
                let t = v.tensor()?;
                let dim = self.tile_dim(n, body, d)?;
                let f = builtin_fold(*r);
                let tiles = t
                    .tiles
                    .iter()
                    .map(|x| {
                        let mut y = x.reduce_dim(dim, r.identity(), f);
                        if !keep_dims {
                            y.shape.remove(dim);
                        }
                        y.round(self.rounding(t.dtype));
                        Arc::new(y)
                    })
                    .collect();
                Ok(Value::Tensor(TiledTensor {
                    dtype: t.dtype,
                    axes: t.axes.clone(),
                    tiles,
                }))
            }
            (ReducerRef::Builtin(r), ReduceOver::Parallel(p)) => {
                let t = v.tensor()?;
                let extent = t
                    .extent(p)
                    .ok_or("reduce over an axis the value is not on")?;
                let axes = without(&t.axes, p);
                let f = builtin_fold(*r);
                let mut tiles = Vec::new();
                for c in for_coords(&axes) {
                    let mut acc: Option<Vec<f64>> = None;
                    let mut shape = vec![];
                    for j in 0..extent {
                        let mut cj = c.clone();
                        cj.insert(p, j);
                        let tile = t.tile_at(&cj);
                        shape = tile.shape.clone();
                        let a = acc.get_or_insert_with(|| vec![r.identity(); tile.data.len()]);
                        for (x, y) in a.iter_mut().zip(&tile.data) {
                            *x = f(*x, *y as f64);
                        }
                    }
                    let mut out = Tensor {
                        shape,
                        data: acc
                            .unwrap_or_default()
                            .into_iter()
                            .map(|x| x as f32)
                            .collect(),
                    };
                    out.round(self.rounding(t.dtype));
                    tiles.push(Arc::new(out));
                }
                Ok(Value::Tensor(TiledTensor {
                    dtype: t.dtype,
                    axes,
                    tiles,
                }))
            }
            (ReducerRef::User(name), _) => {
                let def = self
                    .module
                    .reducer(name)
                    .ok_or_else(|| format!("unknown reducer @{name}"))?;
                // Reducers are typed per use; the body needs its types (dimension lookups).
                let input_ty = body
                    .ty(input)
                    .ok_or("reduce needs its operand's type; run verify first")?;
                let env = crate::verify::typing::TypeEnv::new(&self.module.reducers)
                    .with_sizes(self.defs.clone());
                let types = crate::verify::typing::reducer_body_types(def, input_ty, over, &env)
                    .map_err(|e| e.message)?;
                let mut typed = def.body.clone();
                for (n, t) in typed.nodes.iter_mut().zip(types) {
                    n.ty = Some(t);
                }
                // Items and the number of fold steps.
                let (steps, outer) = match over {
                    ReduceOver::Parallel(p) => {
                        let mut axes = Vec::new();
                        Self::leaves_axes(v, &mut axes);
                        let extent = axes
                            .iter()
                            .find(|(a, _)| a == p)
                            .map(|(_, e)| *e)
                            .ok_or("reduce over an axis the value is not on")?;
                        (extent, without(&union_of(&axes), p))
                    }
                    ReduceOver::Axis(_) => {
                        let dims = self.reduced_dims(body, input, over)?;
                        let len = self.reduced_len(v, &dims)?;
                        let mut axes = Vec::new();
                        Self::leaves_axes(v, &mut axes);
                        (len, union_of(&axes))
                    }
                };
                let dims = match over {
                    ReduceOver::Axis(_) => self.reduced_dims(body, input, over)?,
                    ReduceOver::Parallel(_) => vec![],
                };
                let coords = for_coords(&outer).len();
                let mut state: Vec<Value> = def
                    .init
                    .iter()
                    .map(|v| {
                        Value::Tensor(TiledTensor {
                            dtype: DType::F32,
                            axes: outer.clone(),
                            tiles: std::iter::repeat_n(Arc::new(Tensor::scalar(*v as f32)), coords)
                                .collect(),
                        })
                    })
                    .collect();
                for j in 0..steps {
                    let item = match over {
                        ReduceOver::Parallel(p) => Self::select_coord(v, p, j)?,
                        ReduceOver::Axis(_) => Self::select_index(v, &mut dims.iter().copied(), j)?,
                    };
                    let mut params = state.clone();
                    match item {
                        Value::Tuple(fs) if def.item.len() > 1 || matches!(v, Value::Tuple(_)) => {
                            params.extend(fs)
                        }
                        other => params.push(other),
                    }
                    let out = self
                        .eval_body(&typed, &params)
                        .map_err(|e| format!("in reducer @{name}: {}", e.message))?;
                    state = match out.into_iter().next() {
                        Some(Value::Tuple(fs)) if def.state.len() > 1 || fs.len() == 1 => fs,
                        Some(v) if def.state.len() == 1 => vec![v],
                        _ => {
                            return Err(format!(
                                "reducer @{name} returned the wrong number of state fields"
                            ))
                        }
                    };
                }
                Ok(if state.len() == 1 {
                    state.remove(0)
                } else {
                    Value::Tuple(state)
                })
            }
        }
    }

    /// For `reduce X axis=D` with a user reducer: D's index in each field of X.
    fn reduced_dims(
        &self,
        body: &Body,
        input: NodeId,
        over: &ReduceOver,
    ) -> Result<Vec<usize>, String> {
        let ReduceOver::Axis(d) = over else {
            return Ok(vec![]);
        };
        let ty = body
            .ty(input)
            .ok_or("reduce needs its operand's type; run verify first")?;
        let mut out = Vec::new();
        fn walk(t: &Type, d: &DimRef, out: &mut Vec<usize>) -> Result<(), String> {
            match t {
                Type::Tensor(t) => {
                    out.push(crate::ir::resolve_dim(&t.shape, d).map_err(|e| e.message)?);
                    Ok(())
                }
                Type::Tuple(fs) => fs.iter().try_for_each(|f| walk(f, d, out)),
            }
        }
        walk(ty, d, &mut out)?;
        Ok(out)
    }

    fn reduced_len(&self, v: &Value, dims: &[usize]) -> Result<usize, String> {
        let mut lens = Vec::new();
        fn walk(v: &Value, dims: &mut std::slice::Iter<usize>, lens: &mut Vec<usize>) {
            match v {
                Value::Tensor(t) => {
                    if let (Some(d), Some(tile)) = (dims.next(), t.tiles.first()) {
                        lens.push(tile.shape.get(*d).copied().unwrap_or(0));
                    }
                }
                Value::Tuple(fs) => fs.iter().for_each(|f| walk(f, dims, lens)),
            }
        }
        walk(v, &mut dims.iter(), &mut lens);
        match lens.first() {
            Some(&l) if lens.iter().all(|&x| x == l) => Ok(l),
            Some(_) => Err(format!(
                "item fields have different extents along the reduced dimension: {lens:?}"
            )),
            None => Err("nothing to reduce".into()),
        }
    }
}

fn union_of(axes: &[(String, usize)]) -> Vec<(String, usize)> {
    let m: BTreeMap<String, usize> = axes.iter().cloned().collect();
    m.into_iter().collect()
}

/// Relative L2 distance ‖got − want‖ / ‖want‖ over the element pairs (absolute when `want`
/// is zero there). A pair with a non-finite value is left out when `leave_out(got, want)`
/// says so, and otherwise makes the distance infinite; so do different shapes.
pub fn l2_distance(got: &Tensor, want: &Tensor, leave_out: impl Fn(f32, f32) -> bool) -> f64 {
    if got.shape != want.shape {
        return f64::INFINITY;
    }
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&g, &w) in got.data.iter().zip(&want.data) {
        if !g.is_finite() || !w.is_finite() {
            if leave_out(g, w) {
                continue;
            }
            return f64::INFINITY;
        }
        diff += (g as f64 - w as f64).powi(2);
        norm += (w as f64).powi(2);
    }
    if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

/// Relative L2 error of `got` against a *reference* `want`, over the elements where the
/// reference is finite; infinite where `got` is not finite at such an element. Where the
/// reference is not finite — it overflowed, or is `NaN` (a softmax over a fully masked row) —
/// nothing is required of `got`: rewrites are sound in real arithmetic, which IEEE overflow
/// is not (a product of `exp`s reassociated overflows to `inf · 0 = NaN` where the source gave
/// `inf`). What `check` and extract's net compare.
pub fn reference_error(got: &Tensor, want: &Tensor) -> f64 {
    l2_distance(got, want, |_, w| !w.is_finite())
}

/// Relative L2 error ‖got − want‖ / ‖want‖ (absolute when `want` is zero). Mismatched
/// non-finite values count as infinite error.
pub fn relative_l2(got: &Tensor, want: &Tensor) -> f64 {
    l2_distance(got, want, |g, w| {
        g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())
    })
}
