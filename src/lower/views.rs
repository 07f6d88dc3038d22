//! `slice` and `concat` of tensor-level values are *views*: no kernel computes them. A kernel
//! that reads one loads through it — a slice as its operand at shifted offsets (its base
//! offset with the original strides), a concat as one masked load per piece, each at its
//! piece's offsets, selected by index (`tl.where`). A view that is a function result is
//! written by a kernel of its own, which loads through it and stores.
//!
//! A `slice` or `concat` of tiles (inside a tiled region) is not a view: the kernel would have
//! to cut or join blocks it computed, which is refused (`walk`), so extraction keeps the form
//! where the view is of tensor-level values and the region loads through it.

use crate::ir::*;

/// Whether an operation is one that loads read through.
pub fn is_view_op(kind: &ExprKind) -> bool {
    matches!(kind, ExprKind::Slice(..) | ExprKind::Concat(..))
}

/// Which nodes are views: tensor-level `slice`s and `concat`s that are not constant
/// expressions (a view of constants is one, computed on the tile where it is read).
pub fn virtual_views(body: &Body, constant: &[bool]) -> Vec<bool> {
    body.nodes
        .iter()
        .enumerate()
        .map(|(i, n)| is_view_op(&n.kind) && !super::tiled(n.ty.as_ref()) && !constant[i])
        .collect()
}

/// The dimension a view slices or joins, as an index into its operands' shapes.
pub fn view_dim(body: &Body, kind: &ExprKind) -> Option<usize> {
    let (d, first) = match kind {
        ExprKind::Slice(d, _, _, x) => (d, *x),
        ExprKind::Concat(d, xs) => (d, *xs.first()?),
        _ => return None,
    };
    match body.ty(first) {
        Some(Type::Tensor(t)) => resolve_dim(&t.shape, d).ok(),
        _ => None,
    }
}
