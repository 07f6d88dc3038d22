//! Loads through `slice` and `concat` views (`crate::lower::views`): a slice loads its
//! operand with the block's offsets along the sliced dimension shifted by the slice's start;
//! a concat loads every piece with the offsets shifted to the piece's range and masked to it,
//! and picks, by index, the piece each element lies in.

use super::kernel::{index_for, BlockDim, KernelEmitter, Val};
use super::names::base_text;
use crate::ir::*;

/// A slice bound or a piece offset as a kernel expression (sizes are kernel arguments).
fn dim_text(d: &Dim) -> String {
    base_text(&d.base)
}

impl KernelEmitter<'_, '_> {
    /// The tile of view `base` at the block `dims` (offsets in the view's coordinates).
    pub(super) fn load_view(
        &mut self,
        base: NodeId,
        dims: Vec<BlockDim>,
        at: NodeId,
    ) -> Result<Val, (NodeId, String)> {
        let body = &self.ctx.f.body;
        let kind = body.nodes[base.index()].kind.clone();
        let Some(i) = crate::lower::views::view_dim(body, &kind) else {
            return Err((at, "a view of an unknown dimension".into()));
        };
        if i >= dims.len() {
            return Err((at, "a view whose block rank differs from its type".into()));
        }
        match kind {
            ExprKind::Slice(_, start, _, x) => {
                let mut shifted = dims.clone();
                shifted[i].offs = format!("({}) + {}", dims[i].offs, dim_text(&start));
                let v = self.load(x, shifted, at)?;
                let (expr, got) = v.tile().map_err(|m| (at, m))?;
                // The same data with the view's offsets (its elements' places in the slice).
                Ok(full_block(expr, got.len(), dims))
            }
            ExprKind::Concat(_, pieces) => {
                let rank = dims.len();
                let offs = dims[i].offs.clone();
                let mut start: Vec<String> = Vec::new();
                let mut picked: Option<String> = None;
                for p in pieces {
                    let len = match body.ty(p) {
                        Some(Type::Tensor(t)) => dim_text(&t.shape[i]),
                        _ => return Err((at, "a concat of a tuple".into())),
                    };
                    let from = if start.is_empty() {
                        "0".to_string()
                    } else {
                        start.join(" + ")
                    };
                    // Whole expressions, parenthesised: a block index (`[:, None]`) follows.
                    let inside = if start.is_empty() {
                        format!("(({offs}) < {len})")
                    } else {
                        format!("((({offs}) >= {from}) & (({offs}) < {from} + {len}))")
                    };
                    let mut piece = dims.clone();
                    piece[i].offs = format!("({offs}) - ({from})");
                    piece[i].mask = Some(match &dims[i].mask {
                        Some(m) => format!("(({m}) & {inside})"),
                        None => inside.clone(),
                    });
                    let v = self.load(p, piece, at)?;
                    let (expr, _) = v.tile().map_err(|m| (at, m))?;
                    picked = Some(match picked {
                        None => expr.to_string(),
                        Some(prev) => {
                            format!("tl.where({inside}{}, {expr}, {prev})", index_for(rank, i))
                        }
                    });
                    start.push(len);
                }
                let expr = picked.ok_or((at, "a concat of nothing".to_string()))?;
                // Pieces that are scalar constants select a block narrower than the view.
                Ok(full_block(&expr, 0, dims))
            }
            _ => Err((at, "not a view".into())),
        }
    }
}

/// A view's value as a block of the view's whole rank: an operand loaded as a scalar (a
/// constant) is broadcast, as the plan counts a view's block at the view's rank.
fn full_block(expr: &str, rank: usize, dims: Vec<BlockDim>) -> Val {
    let expr = if rank == dims.len() {
        expr.to_string()
    } else {
        let lens: Vec<&str> = dims.iter().map(|d| d.len.as_str()).collect();
        format!("tl.broadcast_to({expr}, [{}])", lens.join(", "))
    };
    Val::Tile { expr, dims }
}
