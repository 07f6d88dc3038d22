//! What lowering refuses whatever the context: an operator judged from itself, its type, its
//! operands' types and whether they are constant expressions, and the bodies of the reducers
//! it names — never from the rest of the program.
//!
//! [`node_refusal`] is the one place these refusals are decided. [`super::plan`] asks it for
//! every node of a function before partitioning it, and extraction asks it for every e-node
//! of the e-graph (`ExtractGraph::new`), which leaves a refused e-node unpickable: the search
//! never expands a program that holds one, instead of building it and having `plan` refuse
//! it. What depends on the program around a node (which kernel it lands in, whether an
//! operand is loaded or computed there, which axes the kernel combines whole, launch order)
//! stays with the plan's walk.
//!
//! The match over operators is exhaustive: a new operator must say here whether it lowers.

use crate::ir::*;
use crate::verify::ModuleInfo;

/// What [`node_refusal`] knows of an operand.
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    pub ty: Option<&'a Type>,
    /// A constant expression (built from `fill`, `constant` and `iota` only): computed where
    /// it is read, so it has no buffer of its own.
    pub constant: bool,
}

/// Why an operator cannot be lowered in any program, or `None`. `ty` is its type,
/// `operands` its operands in order.
pub fn node_refusal(
    info: &ModuleInfo,
    kind: &ExprKind,
    ty: Option<&Type>,
    operands: &[Operand],
) -> Option<String> {
    if let Some(n) = wide_literal(ty) {
        // Triton indexes blocks with 32-bit integers: refused before any block length is
        // derived from the dimension.
        return Some(format!(
            "a literal dimension of {n}, past Triton's 32-bit indices"
        ));
    }
    use ExprKind::*;
    match kind {
        Input
        | Param
        | Constant(_)
        | Fill(_)
        | Iota(_)
        | Tuple(_)
        | Get(..)
        | Partition(..)
        | Replicate(..)
        | Combination(..)
        | Collection(..)
        | Unary(..)
        | Binary(..)
        | Select(..)
        | Cast(..)
        | MatMul { .. }
        | TileMatMul { .. }
        | Transpose(..)
        | Broadcast(..) => None,
        Reduce { reducer, .. } => match reducer {
            ReducerRef::Builtin(_) => None,
            ReducerRef::User(name) => match info.reducer(name) {
                None => Some(format!("unknown reducer @{name}")),
                Some(def) => reducer_body_refusal(info, def),
            },
        },
        Reshape(..) => reshape_refusal(ty, operands.first().copied()),
        // A tensor-level slice or concat is a view loads read through (`lower::views`); one of
        // tiles would cut or join blocks in registers.
        Slice(..) | Concat(..) => match ty {
            Some(Type::Tensor(t)) if t.par.is_empty() => None,
            _ => Some(format!(
                "a `{}` of tiles (blocks are not cut or joined in registers): slice or concatenate the tensor-level values",
                kind.op_name()
            )),
        },
        Call(f, _) => Some(format!(
            "a call of `{f}`: extraction composes calls into one program (run `saturate,extract` first)"
        )),
    }
}

/// The first literal dimension of `ty` past `i32::MAX`.
fn wide_literal(ty: Option<&Type>) -> Option<u64> {
    let mut stack: Vec<&Type> = ty.into_iter().collect();
    while let Some(t) = stack.pop() {
        match t {
            Type::Tensor(t) => {
                if let Some(n) = t.shape.iter().find_map(|d| match d.base {
                    DimBase::Lit(n) if n > i32::MAX as u64 => Some(n),
                    _ => None,
                }) {
                    return Some(n);
                }
            }
            Type::Tuple(ts) => stack.extend(ts),
        }
    }
    None
}

/// A tensor-level reshape of a stored value is a view of its buffer (or, as a result, a copy
/// of it); a reshape of a tile is `tl.reshape` of its block, which keeps the elements only
/// where no dimension of either block is padded past its size. A constant expression has no
/// buffer to view (it is computed on the reader's block, dimension by dimension).
fn reshape_refusal(ty: Option<&Type>, operand: Option<Operand>) -> Option<String> {
    let operand = operand?;
    if operand.constant {
        return Some(
            "a reshape of a constant expression (`iota`, `fill`, `constant`): write it at the reshaped shape"
                .into(),
        );
    }
    let (Some(Type::Tensor(t)), Some(Type::Tensor(x))) = (ty, operand.ty) else {
        return Some("a reshape of a tuple".into());
    };
    if t.par.is_empty() && x.par.is_empty() {
        return None;
    }
    let unpadded = |t: &TensorType| {
        t.shape.iter().all(|d| {
            d.splits.is_empty()
                && matches!(d.base, DimBase::Lit(n) if n == 1 || (n >= MIN_WHOLE && n.is_power_of_two()))
        })
    };
    if unpadded(t) && unpadded(x) {
        return None;
    }
    Some(
        "a reshape of a tile whose blocks are padded (a dimension that is symbolic, split, or not a power of two of at least 16): reshape the tensor-level value before its views, or after its combination"
            .into(),
    )
}

/// The shortest block a whole literal dimension gets (`names::p2_name`): shorter ones are
/// padded to it.
const MIN_WHOLE: u64 = 16;

/// A user reducer's body is written inline on tiles (`backend::triton::ops`): each of its
/// operators must be one that writes a block from blocks. Its types are known only per use,
/// so what needs them is refused outright.
fn reducer_body_refusal(info: &ModuleInfo, def: &ReducerDef) -> Option<String> {
    use ExprKind::*;
    for node in &def.body.nodes {
        let why = match &node.kind {
            Param | Constant(_) | Fill(_) | Iota(_) | Tuple(_) | Get(FieldRef::Index(_), _)
            | Unary(..) | Binary(..) | Select(..) | Cast(..) | MatMul { .. }
            | TileMatMul { .. } | Transpose(..) | Broadcast(..) => None,
            Reduce {
                over: ReduceOver::Axis(_),
                reducer,
                ..
            } => match reducer {
                ReducerRef::Builtin(_) => None,
                ReducerRef::User(r) => match info.reducer(r) {
                    Some(d) if d.as_product().is_some() => None,
                    Some(_) => Some("folds a tile dimension with a user reducer that is no product of built-ins"),
                    None => Some("uses an unknown reducer"),
                },
            },
            Reduce { .. } => Some("folds a parallel axis"),
            Get(FieldRef::Name(_), _) => Some("reads a fold's field by name"),
            Reshape(..) => Some("reshapes a block (its shape is known only per use)"),
            Slice(..) | Concat(..) => Some("slices or joins a block"),
            Call(..) => Some("calls a function"),
            Input | Partition(..) | Replicate(..) | Combination(..) | Collection(..) => {
                Some("has a parallel view or store")
            }
        };
        if let Some(why) = why {
            return Some(format!(
                "the body of reducer @{} {why}, which is not lowered",
                def.name
            ));
        }
    }
    None
}

/// [`node_refusal`] for every node of a function, in node order: the first refused node and
/// why. `constant` says which nodes are constant expressions (`super::loads_and_constants`).
pub fn function_refusal(
    info: &ModuleInfo,
    f: &Function,
    constant: &[bool],
) -> Option<(NodeId, String)> {
    let body = &f.body;
    body.nodes.iter().enumerate().find_map(|(i, node)| {
        let operands: Vec<Operand> = node
            .kind
            .operands()
            .into_iter()
            .map(|o| Operand {
                ty: body.ty(o),
                constant: constant.get(o.index()).copied().unwrap_or(false),
            })
            .collect();
        node_refusal(info, &node.kind, node.ty.as_ref(), &operands)
            .map(|why| (NodeId(i as u32), why))
    })
}
