//! `slice` and `concat` of tensor-level values are *views*: no kernel computes them. A kernel
//! that reads one loads through it — a slice as its operand at shifted offsets (its base
//! offset with the original strides), a concat as one masked load per piece, each at its
//! piece's offsets, selected by index (`tl.where`). A view that is a function result is
//! written by a kernel of its own, which loads through it and stores; so is a view that a
//! tensor-level `reshape` reads (its elements are no row-major run of its operands'
//! buffers, so the reshape reads a buffer of the view's own: see `lower::reshape_views`).
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
/// expressions (a view of constants is one, computed on the tile where it is read) and that
/// no tensor-level `reshape` reads (that one is stored by a kernel of its own).
pub fn virtual_views(body: &Body, constant: &[bool]) -> Vec<bool> {
    let mut reshaped = vec![false; body.nodes.len()];
    for n in &body.nodes {
        if let ExprKind::Reshape(_, x) = n.kind {
            if !super::tiled(n.ty.as_ref()) {
                reshaped[x.index()] = true;
            }
        }
    }
    body.nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            is_view_op(&n.kind) && !super::tiled(n.ty.as_ref()) && !constant[i] && !reshaped[i]
        })
        .collect()
}

/// Whether readers of `base` load through it (a view with no buffer: a virtual view, or a
/// view of constants) rather than from a buffer.
pub fn loads_through(body: &Body, virtual_view: &[bool], constant: &[bool], base: NodeId) -> bool {
    let i = base.index();
    virtual_view[i] || (constant[i] && is_view_op(&body.node(base).kind))
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
