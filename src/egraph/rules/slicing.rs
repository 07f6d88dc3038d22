//! `slice` and `concat`: pointwise operators and products through them, a slice of a concat
//! that reads one piece, and the propagation that lets tiling cross them (a partition or
//! replica of another dimension moves into their operands; a combination of another
//! dimension moves out). The sliced or concatenated dimension itself is never partitioned
//! (typing), so nothing here splits it.
//!
//! Growth stays bounded: every rule moves a `slice` toward the inputs or a `concat` toward the
//! results (no rule reassembles a concat from pieces), so each slice or concat meets each
//! operator below or above it once.

use super::*;
use crate::ir::{Poly, SizeDefs};

#[rustfmt::skip]
pub static RULES: &[Rule] = &[
    // name                              family                 equation
    Rule { name: "pointwise-through-concat", family: Family::Algebraic, equation: "f(concat[d](a₁…aₙ), concat[d](b₁…bₙ), s) = concat[d](f(a₁,b₁,s) … f(aₙ,bₙ,s))  (pieces line up; s broadcasts along d)", root: Root::Pointwise, find: pointwise_through_concat, reach: Reach::Node },
    Rule { name: "slice-through-pointwise",  family: Family::Algebraic, equation: "slice[d,i,j](f(x, s)) = f(slice[d,i,j](x), s)  (s broadcasts along d)", root: Root::Slice, find: slice_through_pointwise, reach: Reach::Node },
    Rule { name: "slice-through-matmul",     family: Family::Algebraic, equation: "slice[M,i,j](matmul(A,B)) = matmul(slice[M,i,j](A), B); slice[N,i,j](matmul(A,B)) = matmul(A, slice[N,i,j](B))", root: Root::Slice, find: slice_through_matmul, reach: Reach::Node },
    Rule { name: "slice-of-concat",          family: Family::Structural, equation: "slice[d,i,j](concat[d](a₁…aₙ)) = slice[d,i−oₖ,j−oₖ](aₖ), = aₖ when [i,j) is its range (oₖ: aₖ's offset)", root: Root::Slice, find: slice_of_concat, reach: Reach::Node },
    Rule { name: "concat-partition-in",      family: Family::Propagation, equation: "partition[k,a](concat[d](x…)) = concat[d](partition[k,a](x)…)  (k ≠ d)", root: Root::Partition, find: concat_partition_in, reach: Reach::Node },
    Rule { name: "concat-replicate-in",      family: Family::Propagation, equation: "replicate[a](concat[d](x…)) = concat[d](replicate[a](x)…)", root: Root::Replicate, find: concat_replicate_in, reach: Reach::Node },
    Rule { name: "concat-combination-out",   family: Family::Propagation, equation: "concat[d](combination[k,a](x)…) = combination[k,a](concat[d](x…))  (k ≠ d)", root: Root::Concat, find: concat_combination_out, reach: Reach::Node },
    Rule { name: "slice-partition-in",       family: Family::Propagation, equation: "partition[k,a](slice[d,i,j](x)) = slice[d,i,j](partition[k,a](x))  (k ≠ d)", root: Root::Partition, find: slice_partition_in, reach: Reach::Node },
    Rule { name: "slice-replicate-in",       family: Family::Propagation, equation: "replicate[a](slice[d,i,j](x)) = slice[d,i,j](replicate[a](x))", root: Root::Replicate, find: slice_replicate_in, reach: Reach::Node },
    Rule { name: "slice-combination-out",    family: Family::Propagation, equation: "slice[d,i,j](combination[k,a](x)) = combination[k,a](slice[d,i,j](x))  (k ≠ d)", root: Root::Slice, find: slice_combination_out, reach: Reach::Node },
];

/// Where operand `t` sits against output dimension `d` of a rank-`rank` pointwise result:
/// `None` when it broadcasts along `d` (rank 0, too low a rank, or extent 1), else its own
/// index of that dimension.
fn local_dim(t: &TensorType, d: usize, rank: usize) -> Option<usize> {
    let l = d as isize - (rank as isize - t.rank() as isize);
    (l >= 0 && !t.shape[l as usize].is_one()).then_some(l as usize)
}

fn pointwise_through_concat(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    if !Op::is_pointwise(&n.op) {
        return;
    }
    let Some(rank) = tensor_type(eg, class).map(|t| t.rank()) else {
        return;
    };
    for (i, x) in n.children.iter().enumerate() {
        let Some(tx) = tensor_type(eg, *x) else {
            return;
        };
        for c in nodes(eg, *x) {
            let Op::Concat(lc) = c.op else { continue };
            let d = lc + rank - tx.rank();
            let extents: Vec<Option<Dim>> = c
                .children
                .iter()
                .map(|p| tensor_type(eg, *p).map(|t| t.shape[lc].clone()))
                .collect();
            // Per operand, its pieces (one per piece of `c`) or itself where it broadcasts.
            let mut operands: Vec<Vec<Term>> = Vec::new();
            for (j, y) in n.children.iter().enumerate() {
                if j == i {
                    operands.push(c.children.iter().map(|p| cls(*p)).collect());
                    continue;
                }
                let Some(ty) = tensor_type(eg, *y) else {
                    return;
                };
                let Some(l) = local_dim(ty, d, rank) else {
                    operands.push(vec![cls(*y); c.children.len()]);
                    continue;
                };
                // Another concat along the same dimension whose pieces line up with `c`'s.
                let lined = nodes(eg, *y).iter().find(|m| {
                    m.op == Op::Concat(l)
                        && m.children.len() == c.children.len()
                        && m.children
                            .iter()
                            .zip(&extents)
                            .all(|(p, e)| tensor_type(eg, *p).map(|t| &t.shape[l]) == e.as_ref())
                });
                match lined {
                    Some(m) => operands.push(m.children.iter().map(|p| cls(*p)).collect()),
                    None => break,
                }
            }
            if operands.len() != n.children.len() {
                continue;
            }
            let pieces = (0..c.children.len())
                .map(|k| {
                    node(
                        n.op.clone(),
                        operands.iter().map(|o| o[k].clone()).collect(),
                    )
                })
                .collect();
            out.push(node(Op::Concat(d), pieces));
            return;
        }
    }
}

fn slice_through_pointwise(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::Slice(d, s, e) = &n.op else { return };
    let Some(rank) = tensor_type(eg, class).map(|t| t.rank()) else {
        return;
    };
    for f in nodes(eg, n.children[0]) {
        if !Op::is_pointwise(&f.op) {
            continue;
        }
        let ops: Option<Vec<Term>> = f
            .children
            .iter()
            .map(|y| {
                let ty = tensor_type(eg, *y)?;
                match local_dim(ty, *d, rank) {
                    None => Some(cls(*y)),
                    Some(l) if ty.par.partitioner_of(l).is_none() => {
                        Some(node(Op::Slice(l, s.clone(), e.clone()), vec![cls(*y)]))
                    }
                    Some(_) => None,
                }
            })
            .collect();
        if let Some(ops) = ops {
            out.push(node(f.op.clone(), ops));
        }
    }
}

fn slice_through_matmul(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::Slice(d, s, e) = &n.op else { return };
    let Some(rank) = tensor_type(eg, class).map(|t| t.rank()) else {
        return;
    };
    for m in nodes(eg, n.children[0]) {
        let Op::MatMul(_) = &m.op else { continue };
        let (a, b) = (m.children[0], m.children[1]);
        let (Some(ta), Some(tb)) = (tensor_type(eg, a), tensor_type(eg, b)) else {
            continue;
        };
        let slice = |l: usize, x: Id| node(Op::Slice(l, s.clone(), e.clone()), vec![cls(x)]);
        if *d + 2 == rank && ta.par.partitioner_of(ta.rank() - 2).is_none() {
            out.push(node(m.op.clone(), vec![slice(ta.rank() - 2, a), cls(b)]));
        } else if *d + 1 == rank && tb.par.partitioner_of(tb.rank() - 1).is_none() {
            out.push(node(m.op.clone(), vec![cls(a), slice(tb.rank() - 1, b)]));
        }
    }
}

/// The dimension naming a size a slice bound can take: a literal (0 included) or a symbol.
fn bound(sizes: &SizeDefs, p: &Poly) -> Option<Dim> {
    match p.as_constant() {
        Some(0) => Some(Dim::lit(0)),
        Some(c) if c < 0 => None,
        _ => sizes.name(p),
    }
}

/// Whether `p` is at least 0 at every binding of its atoms (all coefficients non-negative).
fn non_negative(p: &Poly) -> bool {
    p.0.values().all(|c| *c > 0)
}

fn slice_of_concat(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Slice(d, s, e) = &n.op else { return };
    let sizes = eg.analysis.env.sizes();
    let (start, end) = (sizes.normal(s), sizes.normal(e));
    for c in nodes(eg, n.children[0]) {
        if c.op != Op::Concat(*d) {
            continue;
        }
        let mut offset = Poly::default();
        for p in &c.children {
            let Some(tp) = tensor_type(eg, *p) else { break };
            let Some(next) = offset.checked_add(&sizes.normal(&tp.shape[*d])) else {
                break;
            };
            if start == offset && end == next {
                out.push(cls(*p));
            } else {
                let inside = start
                    .checked_sub(&offset)
                    .filter(non_negative)
                    .zip(next.checked_sub(&end).filter(non_negative));
                let bounds = start.checked_sub(&offset).zip(end.checked_sub(&offset));
                if let (Some(_), Some((ls, le))) = (inside, bounds) {
                    if let (Some(ls), Some(le)) = (bound(sizes, &ls), bound(sizes, &le)) {
                        out.push(node(Op::Slice(*d, ls, le), vec![cls(*p)]));
                    }
                }
            }
            offset = next;
        }
    }
}

fn concat_partition_in(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Partition(k, a) = &n.op else { return };
    for c in nodes(eg, n.children[0]) {
        let Op::Concat(d) = c.op else { continue };
        if d == *k {
            continue;
        }
        let free = c.children.iter().all(|p| {
            tensor_type(eg, *p)
                .is_some_and(|t| t.par.get(a).is_none() && t.par.partitioner_of(*k).is_none())
        });
        if free {
            let pieces = c
                .children
                .iter()
                .map(|p| node(Op::Partition(*k, *a), vec![cls(*p)]))
                .collect();
            out.push(node(c.op.clone(), pieces));
        }
    }
}

fn concat_replicate_in(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Replicate(a) = &n.op else { return };
    for c in nodes(eg, n.children[0]) {
        if let Op::Concat(_) = c.op {
            let pieces = c
                .children
                .iter()
                .map(|p| node(Op::Replicate(*a), vec![cls(*p)]))
                .collect();
            out.push(node(c.op.clone(), pieces));
        }
    }
}

fn concat_combination_out(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Concat(d) = n.op else { return };
    let Some(first) = n.children.first() else {
        return;
    };
    for m in nodes(eg, *first) {
        let Op::Combination(k, a) = m.op else {
            continue;
        };
        if k == d {
            continue;
        }
        let inner: Option<Vec<Term>> = n
            .children
            .iter()
            .map(|p| {
                nodes(eg, *p)
                    .iter()
                    .find(|x| x.op == Op::Combination(k, a))
                    .map(|x| cls(x.children[0]))
            })
            .collect();
        if let Some(inner) = inner {
            out.push(node(Op::Combination(k, a), vec![node(n.op.clone(), inner)]));
        }
    }
}

fn slice_partition_in(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Partition(k, a) = &n.op else { return };
    for s in nodes(eg, n.children[0]) {
        let Op::Slice(d, ..) = &s.op else { continue };
        let x = s.children[0];
        let free = tensor_type(eg, x)
            .is_some_and(|t| t.par.get(a).is_none() && t.par.partitioner_of(*k).is_none());
        if d != k && free {
            out.push(node(
                s.op.clone(),
                vec![node(Op::Partition(*k, *a), vec![cls(x)])],
            ));
        }
    }
}

fn slice_replicate_in(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Replicate(a) = &n.op else { return };
    for s in nodes(eg, n.children[0]) {
        if let Op::Slice(..) = &s.op {
            out.push(node(
                s.op.clone(),
                vec![node(Op::Replicate(*a), vec![cls(s.children[0])])],
            ));
        }
    }
}

fn slice_combination_out(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Slice(d, ..) = &n.op else { return };
    for c in nodes(eg, n.children[0]) {
        let Op::Combination(k, a) = c.op else {
            continue;
        };
        if k != *d {
            out.push(node(
                Op::Combination(k, a),
                vec![node(n.op.clone(), vec![cls(c.children[0])])],
            ));
        }
    }
}
