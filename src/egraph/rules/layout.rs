//! Transposes and broadcasts: layout operators moved through the algebra so that they do not
//! block it. A transpose of a product is the product of the transposes in reverse order,
//! which is what lets attention over keys written `k = C·W` (then transposed for `q·kᵀ`)
//! absorb `W` on the query side, `(q·Wᵀ)·Cᵀ`, as MLA does. Transposes move inward (towards
//! the leaves), never outward, and compose, so they cannot cycle. An explicit `broadcast`
//! feeding a pointwise operator that broadcasts implicitly is dropped, and broadcasts take
//! partitions, replicas and combinations through like any layout operator. A reshape of a
//! pointwise value is the pointwise operator of reshaped operands, so a result written
//! `reshape[BTxH](gelu(x))` is computed from a view of `x` and tiled like any pointwise
//! result, not stored whole and then copied.
//!
//! Every rule here is exact: it moves the same elements through the same operations in the
//! same order (a product's sum over K runs over the same pairs; a reduction reduces the same
//! sequence).

use super::*;

#[rustfmt::skip]
pub static RULES: &[Rule] = &[
    // name                             family                  equation
    Rule { name: "transpose-matmul",          family: Family::Algebraic,   equation: "transpose[..,1,0](matmul(A,B)) = matmul(transpose[..,1,0](B), transpose[..,1,0](A))", root: Root::Transpose, find: transpose_matmul, reach: Reach::Node },
    Rule { name: "transpose-pointwise",       family: Family::Algebraic,   equation: "transpose[P](f(x, y)) = f(transpose[P](x), transpose[P](y))  (literals and operands P leaves alone stay)", root: Root::Transpose, find: transpose_pointwise, reach: Reach::Node },
    Rule { name: "transpose-reduce",          family: Family::Algebraic,   equation: "transpose[P](reduce X axis=d) = reduce transpose[P'](X) axis=d'  (P' = P with the reduced dimension kept in place)", root: Root::Transpose, find: transpose_reduce, reach: Reach::Node },
    Rule { name: "transpose-compose",         family: Family::Algebraic,   equation: "transpose[P](transpose[Q](x)) = transpose[Q∘P](x), = x when Q∘P is the identity", root: Root::Transpose, find: transpose_compose, reach: Reach::Node },
    Rule { name: "reshape-pointwise",         family: Family::Algebraic,   equation: "reshape[S](f(x, y)) = f(reshape[S](x), reshape[S](y))  (f a pointwise chain over inputs; operands of its whole shape; literals stay)", root: Root::Reshape, find: reshape_pointwise, reach: Reach::Node },
    Rule { name: "broadcast-implicit",        family: Family::Algebraic,   equation: "f(broadcast[S](x), y) = f(x, y)  (when f broadcasts x to the same result)", root: Root::Pointwise, find: broadcast_implicit, reach: Reach::Node },
    Rule { name: "broadcast-partition-in",    family: Family::Propagation, equation: "partition[d,a](broadcast[S](x)) = broadcast[S](partition[d',a](x))  (d is a dimension of x)", root: Root::Partition, find: broadcast_partition_in, reach: Reach::Node },
    Rule { name: "broadcast-replicate-in",    family: Family::Propagation, equation: "replicate[a](broadcast[S](x)) = broadcast[S](replicate[a](x))", root: Root::Replicate, find: broadcast_replicate_in, reach: Reach::Node },
    Rule { name: "broadcast-combination-out", family: Family::Propagation, equation: "broadcast[S](combination[d,a](x)) = combination[d+off,a](broadcast[S](x))", root: Root::Broadcast, find: broadcast_combination_out, reach: Reach::Node },
];

/// True for a permutation that swaps the last two of its dimensions and keeps the others:
/// the transpose of a (batched) matrix.
fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2
        && perm[..r - 2].iter().enumerate().all(|(i, p)| *p == i)
        && perm[r - 2] == r - 1
        && perm[r - 1] == r - 2
}

/// The matrix transpose of a value of rank `rank`.
fn matrix_transpose(rank: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..rank).collect();
    p.swap(rank - 2, rank - 1);
    p
}

fn transpose(perm: Vec<usize>, x: Term) -> Term {
    node(Op::Transpose(perm), vec![x])
}

fn transpose_matmul(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Transpose(perm) = &n.op else { return };
    if !swaps_last_two(perm) {
        return;
    }
    for m in nodes(eg, n.children[0]) {
        let Op::MatMul(acc) = m.op else { continue };
        let (a, b) = (m.children[0], m.children[1]);
        let (Some(ta), Some(tb)) = (tensor_type(eg, a), tensor_type(eg, b)) else {
            continue;
        };
        // Tensor-level products only: tiles keep their own refinements.
        if ta.rank() < 2 || tb.rank() < 2 || !ta.par.is_empty() || !tb.par.is_empty() {
            continue;
        }
        let bt = transpose(matrix_transpose(tb.rank()), cls(b));
        let at = transpose(matrix_transpose(ta.rank()), cls(a));
        out.push(node(Op::MatMul(acc), vec![bt, at]));
    }
}

/// The permutation `perm` (of a result of rank `rank`) as it applies to an operand of rank
/// `r` aligned to the result's last dimensions, if the operand's own dimensions are
/// permuted among themselves; `None` when the transpose moves a result dimension the operand
/// broadcasts along onto one it spans (a row vector would have to become a column).
fn operand_perm(perm: &[usize], r: usize) -> Option<Vec<usize>> {
    let rank = perm.len();
    let off = rank - r;
    // Result dimension i of the transposed value is dimension perm[i] before it.
    let mut p = Vec::with_capacity(r);
    for &src in &perm[off..] {
        if src < off {
            return None;
        }
        p.push(src - off);
    }
    // The leading (broadcast) dimensions then stay among themselves: `perm` is a permutation.
    Some(p)
}

fn transpose_pointwise(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::Transpose(perm) = &n.op else { return };
    let Some(tout) = tensor_type(eg, class) else {
        return;
    };
    if !tout.par.is_empty() {
        return;
    }
    for f in nodes(eg, n.children[0]) {
        if !Op::is_pointwise(&f.op) {
            continue;
        }
        let views: Option<Vec<Term>> = f
            .children
            .iter()
            .map(|x| {
                let t = tensor_type(eg, *x)?;
                if !t.par.is_empty() || t.rank() > perm.len() {
                    return None;
                }
                if t.rank() == 0 {
                    return Some(cls(*x));
                }
                let p = operand_perm(perm, t.rank())?;
                if p.iter().enumerate().all(|(i, q)| i == *q) {
                    Some(cls(*x))
                } else {
                    Some(transpose(p, cls(*x)))
                }
            })
            .collect();
        if let Some(views) = views {
            out.push(node(f.op.clone(), views));
        }
    }
}

fn reshape_pointwise(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::Reshape(shape) = &n.op else { return };
    if tensor_type(eg, class).is_none_or(|t| !t.par.is_empty()) {
        return;
    }
    let Some(tin) = tensor_type(eg, n.children[0]) else {
        return;
    };
    if !tin.par.is_empty() {
        return;
    }
    for f in nodes(eg, n.children[0]) {
        // Only a pointwise chain over inputs: a computed operand (a product) is stored tiled
        // for the reshape to view, and the result's copy is tiled along two dimensions
        // (`extract/output.rs`); moved outward, a `cast` of a projection split into heads
        // became a pointwise result tiled along one dimension only, and had no legal schedule.
        if !Op::is_pointwise(&f.op) || !of_inputs(eg, n.children[0], 8) {
            continue;
        }
        // Element i of every operand is element i of the value: an operand broadcast along
        // some dimension has no reshape that keeps that (a literal has no dimension at all).
        let views: Option<Vec<Term>> = f
            .children
            .iter()
            .map(|x| {
                let t = tensor_type(eg, *x)?;
                if !t.par.is_empty() {
                    None
                } else if t.rank() == 0 {
                    Some(cls(*x))
                } else if t.shape == tin.shape {
                    Some(node(Op::Reshape(shape.clone()), vec![cls(*x)]))
                } else {
                    None
                }
            })
            .collect();
        if let Some(views) = views {
            out.push(node(f.op.clone(), views));
        }
    }
}

/// Whether class `c` holds a value computed by pointwise operators from inputs and literals
/// alone (within `depth` steps).
fn of_inputs(eg: &EGraph, c: Id, depth: usize) -> bool {
    nodes(eg, c).iter().any(|m| match &m.op {
        Op::Input(..) | Op::Constant(..) => true,
        op if Op::is_pointwise(op) && depth > 0 => {
            m.children.iter().all(|k| of_inputs(eg, *k, depth - 1))
        }
        _ => false,
    })
}

fn transpose_reduce(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::Transpose(perm) = &n.op else { return };
    if tensor_type(eg, class).is_none_or(|t| !t.par.is_empty()) {
        return;
    }
    for r in nodes(eg, n.children[0]) {
        let Op::ReduceAxis {
            dim,
            reducer,
            keep_dims,
        } = &r.op
        else {
            continue;
        };
        let x = r.children[0];
        if tensor_type(eg, x).is_none_or(|t| !t.par.is_empty()) {
            continue;
        }
        // With keep_dims the reduced dimension is a dimension of the result, moved by P;
        // without, it stays in place and P applies to the others around it.
        let (inner, new_dim) = if *keep_dims {
            let Some(nd) = perm.iter().position(|p| p == dim) else {
                continue;
            };
            (perm.clone(), nd)
        } else {
            let src = |j: usize| if j < *dim { j } else { j + 1 };
            let mut p: Vec<usize> = perm.iter().map(|&j| src(j)).collect();
            p.insert(*dim, *dim);
            (p, *dim)
        };
        let op = Op::ReduceAxis {
            dim: new_dim,
            reducer: reducer.clone(),
            keep_dims: *keep_dims,
        };
        out.push(node(op, vec![transpose(inner, cls(x))]));
    }
}

fn transpose_compose(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Transpose(p) = &n.op else { return };
    if p.iter().enumerate().all(|(i, q)| i == *q) {
        out.push(cls(n.children[0]));
        return;
    }
    for t in nodes(eg, n.children[0]) {
        let Op::Transpose(q) = &t.op else { continue };
        if q.len() != p.len() {
            continue;
        }
        // Dimension i of the outer result is dimension p[i] of the inner one, which is
        // dimension q[p[i]] of x.
        let composed: Vec<usize> = p.iter().map(|&i| q[i]).collect();
        if composed.iter().enumerate().all(|(i, c)| i == *c) {
            out.push(cls(t.children[0]));
        } else {
            out.push(transpose(composed, cls(t.children[0])));
        }
    }
}

/// The shape two operands broadcast to (aligned from the right), if they do.
fn broadcast_shapes(a: &[crate::ir::Dim], b: &[crate::ir::Dim]) -> Option<Vec<crate::ir::Dim>> {
    let r = a.len().max(b.len());
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let da = (i + a.len()).checked_sub(r).map(|j| &a[j]);
        let db = (i + b.len()).checked_sub(r).map(|j| &b[j]);
        out.push(match (da, db) {
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(x), Some(y)) if x.is_one() => y.clone(),
            (Some(x), Some(y)) if y.is_one() => x.clone(),
            (Some(_), Some(_)) => return None,
            (Some(x), None) | (None, Some(x)) => x.clone(),
            (None, None) => return None,
        });
    }
    Some(out)
}

fn broadcast_implicit(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    if !Op::is_pointwise(&n.op) || n.children.len() < 2 {
        return;
    }
    let Some(tout) = tensor_type(eg, class) else {
        return;
    };
    for (i, x) in n.children.iter().enumerate() {
        for b in nodes(eg, *x) {
            let Op::Broadcast(_) = &b.op else { continue };
            let src = b.children[0];
            let Some(tsrc) = tensor_type(eg, src) else {
                continue;
            };
            if !tsrc.par.is_empty() {
                continue;
            }
            // The operands' shapes with the broadcast's source in place of the broadcast.
            let mut shape: Vec<crate::ir::Dim> = Vec::new();
            let mut ok = true;
            for (j, y) in n.children.iter().enumerate() {
                let ty = if j == i {
                    tsrc
                } else {
                    match tensor_type(eg, *y) {
                        Some(t) => t,
                        None => {
                            ok = false;
                            break;
                        }
                    }
                };
                match broadcast_shapes(&shape, &ty.shape) {
                    Some(s) => shape = s,
                    None if shape.is_empty() && ty.shape.is_empty() => {}
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok && shape == tout.shape {
                let mut kids: Vec<Term> = n.children.iter().map(|c| cls(*c)).collect();
                kids[i] = cls(src);
                out.push(node(n.op.clone(), kids));
            }
        }
    }
}

fn broadcast_partition_in(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::Partition(d, a) = &n.op else { return };
    let Some(tout) = tensor_type(eg, class) else {
        return;
    };
    for b in nodes(eg, n.children[0]) {
        let Op::Broadcast(shape) = &b.op else {
            continue;
        };
        let x = b.children[0];
        let Some(tx) = tensor_type(eg, x) else {
            continue;
        };
        let off = shape.len() - tx.rank().min(shape.len());
        // Only a dimension the source spans: the tile of a broadcast dimension has no
        // source dimension to take it from.
        let Some(l) = d.checked_sub(off) else {
            continue;
        };
        if tx.shape[l] != tout.shape[*d] || tx.shape[l].is_one() {
            continue;
        }
        if tx.par.get(a).is_some() || tx.par.partitioner_of(l).is_some() {
            continue;
        }
        out.push(node(
            Op::Broadcast(shape.clone()),
            vec![node(Op::Partition(l, *a), vec![cls(x)])],
        ));
    }
}

fn broadcast_replicate_in(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Replicate(a) = &n.op else { return };
    for b in nodes(eg, n.children[0]) {
        let Op::Broadcast(shape) = &b.op else {
            continue;
        };
        let x = b.children[0];
        if tensor_type(eg, x).is_none_or(|t| t.par.get(a).is_some()) {
            continue;
        }
        out.push(node(
            Op::Broadcast(shape.clone()),
            vec![node(Op::Replicate(*a), vec![cls(x)])],
        ));
    }
}

fn broadcast_combination_out(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Broadcast(shape) = &n.op else { return };
    for c in nodes(eg, n.children[0]) {
        let Op::Combination(d, a) = &c.op else {
            continue;
        };
        let Some(tx) = tensor_type(eg, c.children[0]) else {
            continue;
        };
        let off = shape.len() - tx.rank().min(shape.len());
        // A combined dimension the broadcast stretches has no tiles to combine.
        if shape.get(d + off) != tx.shape.get(*d) {
            continue;
        }
        out.push(node(
            Op::Combination(d + off, *a),
            vec![node(Op::Broadcast(shape.clone()), vec![cls(c.children[0])])],
        ));
    }
}
