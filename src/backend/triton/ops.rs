//! Operators on blocks: pointwise math, matrix products, block reductions and reducer
//! bodies inlined on tiles.

use super::kernel::{broadcast, dim_position, index_for, is_simple, BlockDim, KernelEmitter, Val};
use super::names::{builtin_identity, compute_tl, dtype_tl, ident, lit, PRODUCT_COMBINE};
use crate::ir::*;

/// `r` over dimension `i` of tile `x` of dtype `dtype`: the overhang replaced by the identity
/// first.
pub(super) fn reduce_tile(
    x: &str,
    dims: &[BlockDim],
    i: usize,
    (r, dtype): (BuiltinReducer, DType),
    keep_dims: bool,
) -> Result<Val, String> {
    let dim = dims
        .get(i)
        .ok_or("reduction dimension out of range")?
        .clone();
    let x = match &dim.mask {
        Some(m) => format!(
            "tl.where({m}{}, {x}, {})",
            index_for(dims.len(), i),
            lit(builtin_identity(r), dtype)
        ),
        None => x.to_string(),
    };
    let f = match r {
        BuiltinReducer::Add => "tl.sum",
        BuiltinReducer::Max => "tl.max",
        BuiltinReducer::Min => "tl.min",
        BuiltinReducer::Mul => "tl.reduce",
    };
    let combine = match r {
        BuiltinReducer::Mul => format!(", combine_fn={PRODUCT_COMBINE}"),
        _ => String::new(),
    };
    let mut out = dims.to_vec();
    if keep_dims {
        out[i] = BlockDim {
            len: "1".into(),
            offs: "tl.arange(0, 1)".into(),
            mask: None,
            name: None,
        };
    } else {
        out.remove(i);
    }
    let kd = if keep_dims { "True" } else { "False" };
    Ok(if dims.len() == 1 && !keep_dims {
        Val::Tile {
            expr: format!("{f}({x}, axis=0{combine})"),
            dims: out,
        }
    } else {
        Val::Tile {
            expr: format!("{f}({x}, axis={i}{combine}, keep_dims={kd})"),
            dims: out,
        }
    })
}

impl KernelEmitter<'_, '_> {
    /// A reducer body on tiles, inline.
    pub(super) fn inline_reducer(
        &mut self,
        def: &ReducerDef,
        args: Vec<Val>,
    ) -> Result<Val, String> {
        let b = &def.body;
        let mut vals: Vec<Option<Val>> = vec![None; b.nodes.len()];
        for (p, a) in b.params.iter().zip(args) {
            vals[p.index()] = Some(a);
        }
        for (i, node) in b.nodes.iter().enumerate() {
            if vals[i].is_some() {
                continue;
            }
            let ops: Vec<Val> = node
                .kind
                .operands()
                .iter()
                .map(|o| vals[o.index()].clone().ok_or("reducer operand missing"))
                .collect::<Result<_, _>>()?;
            let v = self.op(&node.kind, ops, node.annot.as_ref(), &dim_position)?;
            let v = match v {
                Val::Tile { expr, dims } if !is_simple(&expr) => {
                    let name =
                        self.tmp(&node.name.clone().map(|n| ident(&n)).unwrap_or("r".into()));
                    self.line(true, format!("{name} = {expr}"));
                    Val::Tile { expr: name, dims }
                }
                v => v,
            };
            vals[i] = Some(v);
        }
        let results: Vec<Val> = b
            .results
            .iter()
            .map(|r| vals[r.index()].clone().ok_or("reducer result missing"))
            .collect::<Result<_, _>>()?;
        Ok(if results.len() == 1 {
            results.into_iter().next().unwrap_or(Val::Tuple(vec![]))
        } else {
            Val::Tuple(results)
        })
    }

    pub(super) fn op(
        &mut self,
        kind: &ExprKind,
        vals: Vec<Val>,
        ty: Option<&Type>,
        resolve: &dyn Fn(&DimRef, &[BlockDim]) -> Option<usize>,
    ) -> Result<Val, String> {
        let tile = |i: usize| -> Result<(String, Vec<BlockDim>), String> {
            let (e, d) = vals.get(i).ok_or("missing operand")?.tile()?;
            Ok((e.to_string(), d.to_vec()))
        };
        // The result's dtype (f32 where unknown: a reducer body's unannotated values).
        let dtype = match ty {
            Some(Type::Tensor(t)) => t.dtype,
            _ => DType::F32,
        };
        Ok(match kind {
            // A scalar where it is one (a literal, a rank-0 constant), broadcast by its readers;
            // a block of its shape otherwise, which a reduction can reduce.
            ExprKind::Constant(v) if !matches!(ty, Some(Type::Tensor(t)) if !t.shape.is_empty()) => {
                Val::Tile {
                    expr: lit(*v, dtype),
                    dims: vec![],
                }
            }
            ExprKind::Constant(v) | ExprKind::Fill(v) => {
                let Some(Type::Tensor(t)) = ty else {
                    return Err("fill without a type".into());
                };
                let dims = self.dims_of(t);
                let lens: Vec<String> = dims.iter().map(|d| d.len.clone()).collect();
                Val::Tile {
                    expr: format!(
                        "tl.full([{}], {}, {})",
                        lens.join(", "),
                        lit(*v, dtype),
                        compute_tl(dtype)
                    ),
                    dims,
                }
            }
            ExprKind::Iota(d) => {
                // Read whole in the kernel (no view): each element's index along `d`, from
                // the offsets of that block dimension, broadcast over the others.
                let Some(Type::Tensor(t)) = ty else {
                    return Err("iota without a type".into());
                };
                let dims = self.dims_of(t);
                let i = resolve(d, &dims).ok_or("iota of an unknown dimension")?;
                let lens: Vec<String> = dims.iter().map(|d| d.len.clone()).collect();
                // Offsets are int32: an i32 iota keeps them (exact), a float one converts.
                Val::Tile {
                    expr: format!(
                        "tl.broadcast_to(({}){}.to({}), [{}])",
                        dims[i].offs,
                        index_for(dims.len(), i),
                        compute_tl(dtype),
                        lens.join(", ")
                    ),
                    dims,
                }
            }
            ExprKind::Broadcast(..) => {
                let Some(Type::Tensor(t)) = ty else {
                    return Err("broadcast without a type".into());
                };
                let (x, xd) = tile(0)?;
                let dims = self.dims_of(t);
                let lens: Vec<String> = dims.iter().map(|d| d.len.clone()).collect();
                // Right-aligned: the operand's dimensions are the result's last ones (a size-1
                // one is a block of 1 that `broadcast_to` stretches); new leading ones are
                // `None` indices. A scalar (perhaps a Python literal) is added to zeros.
                let extra = dims
                    .len()
                    .checked_sub(xd.len())
                    .ok_or("a broadcast to a lower rank")?;
                let expr = if xd.is_empty() {
                    format!(
                        "(tl.zeros([{}], {}) + ({x}))",
                        lens.join(", "),
                        compute_tl(dtype)
                    )
                } else {
                    let x = if extra == 0 {
                        x
                    } else {
                        let kept = vec![":"; xd.len()].join(", ");
                        format!("({x})[{}{kept}]", "None, ".repeat(extra))
                    };
                    format!("tl.broadcast_to({x}, [{}])", lens.join(", "))
                };
                Val::Tile { expr, dims }
            }
            ExprKind::Tuple(_) => Val::Tuple(vals),
            ExprKind::Get(field, _) => {
                let i = match field {
                    FieldRef::Index(i) => *i,
                    FieldRef::Name(_) => return Err("a named field outside a reducer".into()),
                };
                match vals.into_iter().next() {
                    Some(Val::Tuple(v)) => v.get(i).cloned().ok_or("field out of range")?,
                    _ => return Err("get on a tile".into()),
                }
            }
            ExprKind::Unary(u, _) => {
                let (x, dims) = tile(0)?;
                let expr = match u {
                    UnaryOp::Exp => format!("tl.exp({x})"),
                    UnaryOp::Log => format!("tl.log({x})"),
                    UnaryOp::Sqrt => format!("tl.sqrt({x})"),
                    UnaryOp::Rsqrt => format!("tl.rsqrt({x})"),
                    UnaryOp::Reciprocal => format!("(1.0 / {x})"),
                    UnaryOp::Neg => format!("(-{x})"),
                    UnaryOp::Abs => format!("tl.abs({x})"),
                    UnaryOp::Tanh => format!("(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)"),
                    UnaryOp::Sigmoid => format!("tl.sigmoid({x})"),
                    UnaryOp::Silu => format!("({x} * tl.sigmoid({x}))"),
                    UnaryOp::Gelu => {
                        format!("(0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476)))")
                    }
                    UnaryOp::Square => format!("({x} * {x})"),
                };
                Val::Tile { expr, dims }
            }
            ExprKind::Binary(b, _, _) => {
                let ((x, dx), (y, dy)) = (tile(0)?, tile(1)?);
                let dims = broadcast(&[&dx, &dy]);
                let expr = match b {
                    BinaryOp::Add => format!("({x} + {y})"),
                    BinaryOp::Subtract => format!("({x} - {y})"),
                    BinaryOp::Multiply => format!("({x} * {y})"),
                    // Integer division truncates toward zero, as the interpreter's rounding
                    // of the quotient to i32 does.
                    BinaryOp::Divide if dtype == DType::I32 => format!("({x} // {y})"),
                    BinaryOp::Divide => format!("({x} / {y})"),
                    BinaryOp::Maximum => format!("tl.maximum({x}, {y})"),
                    BinaryOp::Minimum => format!("tl.minimum({x}, {y})"),
                    // exp∘log of an exact integer power may land an ulp below it (7.9999
                    // for 2³): a result within rounding error of an integer is that
                    // integer, anything else truncates as the interpreter's cast does.
                    BinaryOp::Pow if dtype == DType::I32 => {
                        // `* 1.0` converts a tensor and a literal alike (`(3).to(…)` is
                        // no Triton).
                        let r = pow_f32(&format!("(({x}) * 1.0)"), &format!("(({y}) * 1.0)"));
                        format!(
                            "tl.where(tl.abs({r} - tl.floor({r} + 0.5)) <= 1e-5 * tl.abs({r}) + 1e-6, \
                             tl.floor({r} + 0.5), {r}).to(tl.int32)"
                        )
                    }
                    BinaryOp::Pow => pow_f32(&x, &y),
                    BinaryOp::Less => format!("({x} < {y})"),
                    BinaryOp::LessEqual => format!("({x} <= {y})"),
                    BinaryOp::Greater => format!("({x} > {y})"),
                    BinaryOp::GreaterEqual => format!("({x} >= {y})"),
                    BinaryOp::Equal => format!("({x} == {y})"),
                    BinaryOp::NotEqual => format!("({x} != {y})"),
                    BinaryOp::And => format!("({x} & {y})"),
                    BinaryOp::Or => format!("({x} | {y})"),
                };
                Val::Tile { expr, dims }
            }
            ExprKind::Select(..) => {
                let ((c, dc), (x, dx), (y, dy)) = (tile(0)?, tile(1)?, tile(2)?);
                Val::Tile {
                    expr: format!("tl.where({c}, {x}, {y})"),
                    dims: broadcast(&[&dc, &dx, &dy]),
                }
            }
            ExprKind::Cast(d, _) => {
                let (x, dims) = tile(0)?;
                let expr = match d {
                    DType::BF16 | DType::F16 => {
                        format!("{x}.to({}).to(tl.float32)", dtype_tl(*d))
                    }
                    DType::F32 => format!("{x}.to(tl.float32)"),
                    DType::I32 => format!("{x}.to(tl.int32)"),
                    DType::I1 => format!("({x} != 0)"),
                };
                Val::Tile { expr, dims }
            }
            ExprKind::Transpose(perm, _) => {
                let (x, dims) = tile(0)?;
                let new: Vec<BlockDim> = perm
                    .iter()
                    .map(|p| dims.get(*p).cloned().ok_or("bad permutation"))
                    .collect::<Result<_, _>>()?;
                let expr = if perm.as_slice() == [1, 0] {
                    format!("tl.trans({x})")
                } else {
                    format!(
                        "tl.permute({x}, ({}))",
                        perm.iter().map(|p| format!("{p},")).collect::<String>()
                    )
                };
                Val::Tile { expr, dims: new }
            }
            ExprKind::TileMatMul { .. } | ExprKind::MatMul { .. } => {
                let ((a, da), (b, db)) = (tile(0)?, tile(1)?);
                let (ra, rb) = (da.len(), db.len());
                if ra < 2 || rb < 2 {
                    return Err("a matrix product of a scalar block".into());
                }
                let a = match &da[ra - 1].mask {
                    Some(m) => format!("tl.where({m}{}, {a}, 0.0)", index_for(ra, ra - 1)),
                    None => a,
                };
                let b = match &db[rb - 2].mask {
                    Some(m) => format!("tl.where({m}{}, {b}, 0.0)", index_for(rb, rb - 2)),
                    None => b,
                };
                // Batch dimensions broadcast (a rank-2 weight against batched activations,
                // a batch dimension of 1 against a full one).
                let batch = broadcast(&[&da[..ra - 2], &db[..rb - 2]]);
                let mut dims: Vec<BlockDim> = batch.clone();
                dims.push(da[ra - 2].clone());
                dims.push(db[rb - 1].clone());
                let r = dims.len();
                let (m, k, n) = (&da[ra - 2].len, &da[ra - 1].len, &db[rb - 1].len);
                if [m, k, n].iter().any(|l| l.as_str() == "1") {
                    // `tl.dot` needs 16 rows, columns and depth (a decode step has one query
                    // row, batched or not): multiply broadcast operands and sum over the
                    // depth instead. Blocks of different ranks broadcast from the right.
                    let expand_a = format!("[{}None]", ":, ".repeat(ra));
                    let expand_b = format!("[{}None, :, :]", ":, ".repeat(rb - 2));
                    return Ok(Val::Tile {
                        expr: format!("tl.sum(({a}){expand_a} * ({b}){expand_b}, axis={})", r - 1),
                        dims,
                    });
                }
                // Operands in the program's dtype (bf16 feeds tensor cores); f32 under the
                // interpreter, whose bf16 dot is wrong.
                let opts = self.ctx.opts;
                let (a, b) = match self.dot_dtypes.take() {
                    _ if opts.interpret => (a, b),
                    _ if opts.dot_bf16 => (
                        format!("{a}.to(tl.bfloat16)"),
                        format!("{b}.to(tl.bfloat16)"),
                    ),
                    Some((x, y)) if x == y && x != DType::F32 => (
                        format!("{a}.to({})", dtype_tl(x)),
                        format!("{b}.to({})", dtype_tl(y)),
                    ),
                    _ => (a, b),
                };
                for len in [m, k, n] {
                    if let Some(name) = len.strip_prefix("P_") {
                        self.ctx.dot_padded.borrow_mut().insert(name.to_string());
                    }
                }
                let out_shape: Vec<&str> = dims.iter().map(|d| d.len.as_str()).collect();
                let expr = if rb == 2 || db[..rb - 2].iter().all(|d| d.len == "1") {
                    // One weight for every batch entry: the batch dimensions fold into the
                    // rows of one 2-d `tl.dot` (a block reshape is exact: same lengths back).
                    let b = if rb == 2 {
                        b
                    } else {
                        format!("tl.reshape({b}, ({k}, {n}))")
                    };
                    if ra == 2 && rb == 2 {
                        format!("tl.dot({a}, {b}, out_dtype=tl.float32)")
                    } else {
                        let rows: Vec<&str> = da[..ra - 1].iter().map(|d| d.len.as_str()).collect();
                        let dot = format!(
                            "tl.dot(tl.reshape({a}, ({}, {k})), {b}, out_dtype=tl.float32)",
                            rows.join(" * ")
                        );
                        format!("tl.reshape({dot}, ({}))", out_shape.join(", "))
                    }
                } else {
                    // Leading dimensions batch: each operand broadcast to the common batch
                    // where it lacks a dimension (or has 1), then one 3-d `tl.dot` over
                    // their product.
                    let lens =
                        |ds: &[BlockDim]| ds.iter().map(|d| d.len.clone()).collect::<Vec<_>>();
                    let full = |x: String, ds: &[BlockDim], tail: [&str; 2]| -> String {
                        let own = &ds[..ds.len() - 2];
                        if lens(own) == lens(&batch) {
                            return x;
                        }
                        let extra = batch.len() - own.len();
                        let kept = vec![":"; ds.len()].join(", ");
                        let shape: Vec<String> = lens(&batch)
                            .into_iter()
                            .chain(tail.iter().map(|t| t.to_string()))
                            .collect();
                        format!(
                            "tl.broadcast_to(({x})[{}{kept}], [{}])",
                            "None, ".repeat(extra),
                            shape.join(", ")
                        )
                    };
                    let a = full(a, &da, [m, k]);
                    let b = full(b, &db, [k, n]);
                    let batch_len = lens(&batch).join(" * ");
                    format!(
                        "tl.reshape(tl.dot(tl.reshape({a}, ({batch_len}, {m}, {k})), tl.reshape({b}, ({batch_len}, {k}, {n})), out_dtype=tl.float32), ({}))",
                        out_shape.join(", ")
                    )
                };
                Val::Tile { expr, dims }
            }
            ExprKind::Reduce {
                over: ReduceOver::Axis(d),
                reducer,
                keep_dims,
                ..
            } => {
                let parts = match reducer {
                    ReducerRef::Builtin(r) => vec![*r],
                    ReducerRef::User(n) => self
                        .ctx
                        .info
                        .reducer(n)
                        .and_then(ReducerDef::as_product)
                        .ok_or("a reducer body folding a tile dimension with another user reducer is not lowered yet")?,
                };
                // A product of built-in reducers reduces each field of its tuple on its own.
                let fields: Vec<&Val> = match vals.first() {
                    Some(Val::Tuple(fs)) => fs.iter().collect(),
                    Some(v) => vec![v],
                    None => return Err("missing operand".into()),
                };
                if fields.len() != parts.len() {
                    return Err("a reducer whose arity differs from its operand's".into());
                }
                let mut out = Vec::new();
                for (v, r) in fields.into_iter().zip(parts) {
                    let (x, dims) = v.tile()?;
                    let i = resolve(d, dims).ok_or("a reduction over an unknown dimension")?;
                    if r == BuiltinReducer::Mul {
                        self.ctx.uses_product.set(true);
                    }
                    let field_dtype = match ty {
                        Some(Type::Tuple(ts)) => match ts.get(out.len()) {
                            Some(Type::Tensor(t)) => t.dtype,
                            _ => DType::F32,
                        },
                        _ => dtype,
                    };
                    out.push(reduce_tile(x, dims, i, (r, field_dtype), *keep_dims)?);
                }
                if matches!(ty, Some(Type::Tuple(_))) {
                    Val::Tuple(out)
                } else {
                    out.pop().ok_or("missing operand")?
                }
            }
            ExprKind::Reshape(..) => {
                // Only of unpadded blocks (`lower::lowerable`): the same elements, row-major.
                let Some(Type::Tensor(t)) = ty else {
                    return Err("reshape without a type".into());
                };
                let (x, _) = tile(0)?;
                let dims = self.dims_of(t);
                let lens: Vec<String> = dims.iter().map(|d| d.len.clone()).collect();
                Val::Tile {
                    expr: format!("tl.reshape({x}, ({},))", lens.join(", ")),
                    dims,
                }
            }
            ExprKind::Partition(..) | ExprKind::Replicate(..) => {
                return Err("a view of a value computed in the kernel".into())
            }
            ExprKind::Combination(..) | ExprKind::Collection(..) => {
                return Err("a store read inside its own kernel".into())
            }
            other => return Err(format!("`{}` is not lowered yet", other.op_name())),
        })
    }
}

/// `x ** y` as the interpreter's `powf` gives it, from `exp(y · log |x|)`: a negative base
/// takes the sign of an odd integer exponent and is NaN for a non-integer one (plain
/// `exp(y · log x)` is NaN for every negative base), `y = 0` gives 1 (also for a zero or NaN
/// base), a zero base gives 0 or ∞ by the exponent's sign.
fn pow_f32(x: &str, y: &str) -> String {
    format!(
        "tl.where({y} == 0.0, 1.0, tl.where({x} < 0.0, tl.where(tl.floor({y}) == {y}, \
         tl.where(tl.floor({y} * 0.5) * 2.0 == {y}, 1.0, -1.0), float('nan')), 1.0) \
         * tl.exp({y} * tl.log(tl.abs({x}))))"
    )
}
