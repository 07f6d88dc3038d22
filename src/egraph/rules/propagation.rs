//! Propagating parallelism (paper §4.3): partitions and replicas move to the inputs of
//! pointwise, layout and reduction operators; combinations move to their outputs. Operands
//! that broadcast along a partitioned dimension are replicated; rank-0 values stay as they
//! are (implicitly replicated), and a rank-0 value an operator computes is also offered
//! replicated explicitly, so that a tile can compute it (`computed_scalar`).

use super::*;
use crate::ir::{ParKind, ReducerRef};

#[rustfmt::skip]
pub static RULES: &[Rule] = &[
    // name                              family                 equation
    Rule { name: "pointwise-partition-in",   family: Family::Propagation, equation: "partition[d,a](f(x, y)) = f(partition[d,a](x), partition[d,a](y) | replicate[a](y))", root: Root::Partition, find: pointwise_partition_in, reach: Reach::Node },
    Rule { name: "pointwise-replicate-in",   family: Family::Propagation, equation: "replicate[a](f(x, y)) = f(replicate[a](x), replicate[a](y))", root: Root::Replicate, find: pointwise_replicate_in, reach: Reach::Node },
    Rule { name: "pointwise-replicate-out",  family: Family::Propagation, equation: "f(replicate[a](x), replicate[a](y)) = replicate[a](f(x, y))", root: Root::Pointwise, find: pointwise_replicate_out, reach: Reach::Node },
    Rule { name: "pointwise-combination-out", family: Family::Propagation, equation: "f(combination[d,a](x), y) = combination[d,a](f(x, partition[d,a](y) | replicate[a](y)))", root: Root::Pointwise, find: pointwise_combination_out, reach: Reach::Node },
    Rule { name: "transpose-partition-in",   family: Family::Propagation, equation: "partition[d,a](transpose[P](x)) = transpose[P](partition[P[d],a](x))", root: Root::Partition, find: transpose_partition_in, reach: Reach::Node },
    Rule { name: "transpose-replicate-in",   family: Family::Propagation, equation: "replicate[a](transpose[P](x)) = transpose[P](replicate[a](x))", root: Root::Replicate, find: transpose_replicate_in, reach: Reach::Node },
    Rule { name: "transpose-combination-out", family: Family::Propagation, equation: "transpose[P](combination[d,a](x)) = combination[P⁻¹(d),a](transpose[P](x))", root: Root::Transpose, find: transpose_combination_out, reach: Reach::Node },
    Rule { name: "reduce-partition-in",      family: Family::Propagation, equation: "partition[d,a](reduce X axis=K) = reduce partition[d',a](X) axis=K  (d kept)", root: Root::Partition, find: reduce_partition_in, reach: Reach::Node },
    Rule { name: "reduce-replicate-in",      family: Family::Propagation, equation: "replicate[a](reduce X axis=K) = reduce replicate[a](X) axis=K", root: Root::Replicate, find: reduce_replicate_in, reach: Reach::Node },
    Rule { name: "reduce-combination-out",   family: Family::Propagation, equation: "reduce combination[d,a](X) axis=K = combination[d',a](reduce X axis=K)  (d ≠ K)", root: Root::ReduceAxis, find: reduce_combination_out, reach: Reach::Node },
    Rule { name: "replicate-across-reduction", family: Family::Propagation, equation: "replicate[q](reduce X parallel=p) = reduce replicate[q](X) parallel=p  (q ≠ p)", root: Root::Replicate, find: replicate_across_reduction, reach: Reach::Node },
    Rule { name: "partition-across-reduction", family: Family::Propagation, equation: "partition[d,q](reduce X parallel=p) = reduce partition[d,q](X) parallel=p  (built-in reducer)", root: Root::Partition, find: partition_across_reduction, reach: Reach::Node },
    Rule { name: "tile-matmul-replicate-in", family: Family::Propagation, equation: "replicate[a](tile_matmul(A,B)) = tile_matmul(replicate[a](A), replicate[a](B))", root: Root::Replicate, find: tile_matmul_replicate_in, reach: Reach::Node },
];

/// A rank-0 value without parallel state: typing replicates it implicitly.
fn is_scalar_literal(t: &TensorType) -> bool {
    t.shape.is_empty() && t.par.is_empty()
}

/// A rank-0 value some operator computes (no literal, fill or input in its class): a global
/// norm, a loss, a clip coefficient. Left implicit, a tile reads it from memory, so its
/// operators are kernels of their own, one per scalar; replicated explicitly
/// (`replicate[a](x)`), the replica can move into them (`pointwise-replicate-in`) and each
/// tile computes the scalar chain from the values it is built of. Both forms are offered.
/// A constant expression (a count of ones, `1.0 / 4096.0`) is not one: the lowering
/// computes it inline wherever it is read.
fn computed_scalar(eg: &EGraph, x: Id) -> bool {
    tensor_type(eg, x).is_some_and(is_scalar_literal)
        && nodes(eg, x).iter().all(|n| !n.children.is_empty())
        && !constant_class(eg, x, 8)
}

/// Whether some e-node of `x` is a constant expression: a literal, fill or iota, or an
/// operator of constant expressions, looked for `depth` operators deep (each class judged
/// once: `seen`; one met again on its own path counts as not constant).
fn constant_class(eg: &EGraph, x: Id, depth: u32) -> bool {
    fn go(eg: &EGraph, x: Id, depth: u32, seen: &mut rustc_hash::FxHashMap<Id, bool>) -> bool {
        if let Some(&known) = seen.get(&x) {
            return known;
        }
        seen.insert(x, false);
        let constant = nodes(eg, x).iter().any(|n| match n.op {
            Op::Constant(..) | Op::Fill(..) | Op::Iota(..) => true,
            Op::Input(..) => false,
            _ => {
                depth > 0
                    && !n.children.is_empty()
                    && n.children.iter().all(|k| go(eg, *k, depth - 1, seen))
            }
        });
        seen.insert(x, constant);
        constant
    }
    go(eg, x, depth, &mut rustc_hash::FxHashMap::default())
}

/// `f`'s operand views, and where some operand is a computed scalar, the same views with
/// those replicated along every axis of the result (`computed_scalar`; `class`'s type: the
/// other operands carry those axes, so the scalar must too). The views as given only where
/// some other operand carries the axes (`implicit`): a pointwise operator of scalars alone
/// is no replica.
fn push_with_scalar_replicas(
    eg: &EGraph,
    class: Id,
    f: &ENode,
    views: Vec<Term>,
    implicit: bool,
    out: &mut Out,
) {
    let axes: Option<Vec<Sym>> = tensor_type(eg, class).and_then(|t| {
        t.par
            .0
            .iter()
            .map(|(a, k)| (!matches!(k, ParKind::Partial)).then_some(*a))
            .collect()
    });
    if let Some(axes) = axes.filter(|_| f.children.iter().any(|x| computed_scalar(eg, *x))) {
        let replicated: Vec<Term> = f
            .children
            .iter()
            .zip(&views)
            .map(|(x, v)| {
                if computed_scalar(eg, *x) {
                    axes.iter()
                        .fold(cls(*x), |t, a| node(Op::Replicate(*a), vec![t]))
                } else {
                    v.clone()
                }
            })
            .collect();
        out.push(node(f.op.clone(), replicated));
    }
    if implicit {
        out.push(node(f.op.clone(), views));
    }
}

/// The view of pointwise operand `x` for output dimension `d` (`out_dim`) of rank
/// `out_rank` along `a`: partitioned if it spans the dimension, replicated if it broadcasts
/// along it. An extent 1 broadcasts only against a larger dimension: where the output's
/// dimension is a literal 1 too (a one-row batch written `1xH`), every operand with it
/// spans it and is partitioned with the output.
fn operand_view(
    eg: &EGraph,
    x: Id,
    d: usize,
    out_rank: usize,
    out_dim: &Dim,
    a: Sym,
) -> Option<Term> {
    let t = tensor_type(eg, x)?;
    if is_scalar_literal(t) {
        return Some(cls(x));
    }
    if t.par.get(&a).is_some() {
        return None;
    }
    let off = out_rank as isize - t.rank() as isize;
    let l = d as isize - off;
    if l >= 0 && (!t.shape[l as usize].is_one() || out_dim.is_one()) {
        let l = l as usize;
        if t.par.partitioner_of(l).is_some() {
            return None;
        }
        Some(node(Op::Partition(l, a), vec![cls(x)]))
    } else {
        Some(node(Op::Replicate(a), vec![cls(x)]))
    }
}

fn pointwise_partition_in(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::Partition(d, a) = &n.op else { return };
    let inner = n.children[0];
    let Some(ti) = tensor_type(eg, inner) else {
        return;
    };
    for f in nodes(eg, inner) {
        if !Op::is_pointwise(&f.op) {
            continue;
        }
        let views: Option<Vec<Term>> = f
            .children
            .iter()
            .map(|x| operand_view(eg, *x, *d, ti.rank(), &ti.shape[*d], *a))
            .collect();
        if let Some(views) = views {
            push_with_scalar_replicas(eg, class, f, views, true, out);
        }
    }
}

fn pointwise_replicate_in(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::Replicate(a) = &n.op else { return };
    for f in nodes(eg, n.children[0]) {
        // With only literals as operands nothing would carry the replica.
        if !Op::is_pointwise(&f.op)
            || f.children.iter().all(|x| {
                tensor_type(eg, *x).is_some_and(is_scalar_literal) && !computed_scalar(eg, *x)
            })
        {
            continue;
        }
        let views: Option<Vec<Term>> = f
            .children
            .iter()
            .map(|x| {
                let t = tensor_type(eg, *x)?;
                if is_scalar_literal(t) {
                    Some(cls(*x))
                } else if t.par.get(a).is_none() {
                    Some(node(Op::Replicate(*a), vec![cls(*x)]))
                } else {
                    None
                }
            })
            .collect();
        let implicit = f
            .children
            .iter()
            .any(|x| tensor_type(eg, *x).is_some_and(|t| !is_scalar_literal(t)));
        if let Some(views) = views {
            push_with_scalar_replicas(eg, class, f, views, implicit, out);
        }
    }
}

/// The class `y` with `replicate[a](y)` in class `x`, if any.
fn replicated_source(eg: &EGraph, x: Id, a: Sym) -> Option<Id> {
    nodes(eg, x).iter().find_map(|m| match &m.op {
        Op::Replicate(b) if *b == a => Some(m.children[0]),
        _ => None,
    })
}

fn pointwise_replicate_out(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    if !Op::is_pointwise(&n.op) {
        return;
    }
    // Candidate axes: those some operand is replicated along.
    let mut axes: Vec<&Sym> = Vec::new();
    for x in &n.children {
        for m in nodes(eg, *x) {
            if let Op::Replicate(a) = &m.op {
                if !axes.contains(&a) {
                    axes.push(a);
                }
            }
        }
    }
    for a in axes {
        let srcs: Option<Vec<Term>> = n
            .children
            .iter()
            .map(|x| {
                if tensor_type(eg, *x).is_some_and(is_scalar_literal) {
                    Some(cls(*x))
                } else {
                    replicated_source(eg, *x, *a).map(cls)
                }
            })
            .collect();
        if let Some(srcs) = srcs {
            out.push(node(Op::Replicate(*a), vec![node(n.op.clone(), srcs)]));
        }
    }
}

fn pointwise_combination_out(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    if !Op::is_pointwise(&n.op) {
        return;
    }
    let Some(tout) = tensor_type(eg, class) else {
        return;
    };
    let rank = tout.rank();
    for (i, x) in n.children.iter().enumerate() {
        let Some(tx) = tensor_type(eg, *x) else {
            continue;
        };
        for m in nodes(eg, *x) {
            let Op::Combination(dl, a) = &m.op else {
                continue;
            };
            let d = dl + rank - tx.rank();
            // A tiled extent-1 dimension cannot broadcast against a larger one.
            if tx.shape[*dl].is_one() && !tout.shape[d].is_one() {
                continue;
            }
            let mut ops = Vec::new();
            let mut ok = true;
            for (j, y) in n.children.iter().enumerate() {
                if j == i {
                    ops.push(cls(m.children[0]));
                    continue;
                }
                // Another operand combined the same way contributes its tiles directly.
                let ty = tensor_type(eg, *y);
                let same = ty.and_then(|ty| {
                    let l = d as isize - (rank as isize - ty.rank() as isize);
                    nodes(eg, *y).iter().find_map(|k| match &k.op {
                        Op::Combination(dk, b) if b == a && *dk as isize == l => {
                            Some(k.children[0])
                        }
                        _ => None,
                    })
                });
                match same {
                    Some(src) => ops.push(cls(src)),
                    None => match operand_view(eg, *y, d, rank, &tout.shape[d], *a) {
                        Some(v) => ops.push(v),
                        None => ok = false,
                    },
                }
            }
            if ok {
                out.push(node(Op::Combination(d, *a), vec![node(n.op.clone(), ops)]));
            }
        }
    }
}

fn transpose_partition_in(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Partition(d, a) = &n.op else { return };
    for t in nodes(eg, n.children[0]) {
        let Op::Transpose(perm) = &t.op else { continue };
        let x = t.children[0];
        let Some(tx) = tensor_type(eg, x) else {
            continue;
        };
        if tx.par.partitioner_of(perm[*d]).is_some() {
            continue;
        }
        out.push(node(
            Op::Transpose(perm.clone()),
            vec![node(Op::Partition(perm[*d], *a), vec![cls(x)])],
        ));
    }
}

fn transpose_replicate_in(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Replicate(a) = &n.op else { return };
    for t in nodes(eg, n.children[0]) {
        let Op::Transpose(perm) = &t.op else { continue };
        out.push(node(
            Op::Transpose(perm.clone()),
            vec![node(Op::Replicate(*a), vec![cls(t.children[0])])],
        ));
    }
}

fn transpose_combination_out(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Transpose(perm) = &n.op else { return };
    for c in nodes(eg, n.children[0]) {
        let Op::Combination(d, a) = &c.op else {
            continue;
        };
        let Some(nd) = perm.iter().position(|p| p == d) else {
            continue;
        };
        out.push(node(
            Op::Combination(nd, *a),
            vec![node(Op::Transpose(perm.clone()), vec![cls(c.children[0])])],
        ));
    }
}

fn reduce_partition_in(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Partition(d, a) = &n.op else { return };
    for r in nodes(eg, n.children[0]) {
        let Op::ReduceAxis {
            dim,
            reducer,
            keep_dims,
        } = &r.op
        else {
            continue;
        };
        if *keep_dims && d == dim {
            continue;
        }
        let x = r.children[0];
        let Some(tx) = tensor_type(eg, x) else {
            continue;
        };
        let src = if *keep_dims || d < dim { *d } else { d + 1 };
        if tx.par.get(a).is_some() || tx.par.partitioner_of(src).is_some() {
            continue;
        }
        let op = Op::ReduceAxis {
            dim: *dim,
            reducer: reducer.clone(),
            keep_dims: *keep_dims,
        };
        out.push(node(op, vec![node(Op::Partition(src, *a), vec![cls(x)])]));
    }
}

fn reduce_replicate_in(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Replicate(a) = &n.op else { return };
    for r in nodes(eg, n.children[0]) {
        if let Op::ReduceAxis { .. } = &r.op {
            out.push(node(
                r.op.clone(),
                vec![node(Op::Replicate(*a), vec![cls(r.children[0])])],
            ));
        }
    }
}

fn reduce_combination_out(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::ReduceAxis { dim, keep_dims, .. } = &n.op else {
        return;
    };
    // A reducer with a tuple state reduces to a tuple, which no combination holds.
    if tensor_type(eg, class).is_none() {
        return;
    }
    for c in nodes(eg, n.children[0]) {
        let Op::Combination(d, a) = &c.op else {
            continue;
        };
        if d == dim {
            continue;
        }
        let nd = if *keep_dims || d < dim { *d } else { d - 1 };
        out.push(node(
            Op::Combination(nd, *a),
            vec![node(n.op.clone(), vec![cls(c.children[0])])],
        ));
    }
}

fn replicate_across_reduction(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Replicate(q) = &n.op else { return };
    for r in nodes(eg, n.children[0]) {
        let Op::ReduceParallel { axis, .. } = &r.op else {
            continue;
        };
        if axis != q {
            out.push(node(
                r.op.clone(),
                vec![node(Op::Replicate(*q), vec![cls(r.children[0])])],
            ));
        }
    }
}

fn partition_across_reduction(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Partition(d, q) = &n.op else { return };
    for r in nodes(eg, n.children[0]) {
        let Op::ReduceParallel {
            axis,
            reducer: ReducerRef::Builtin(_),
        } = &r.op
        else {
            continue;
        };
        let x = r.children[0];
        if axis == q || tensor_type(eg, x).is_none_or(|t| t.par.partitioner_of(*d).is_some()) {
            continue;
        }
        out.push(node(
            r.op.clone(),
            vec![node(Op::Partition(*d, *q), vec![cls(x)])],
        ));
    }
}

fn tile_matmul_replicate_in(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Replicate(a) = &n.op else { return };
    for m in nodes(eg, n.children[0]) {
        if let Op::TileMatMul(_) = &m.op {
            let rep = |x: Id| node(Op::Replicate(*a), vec![cls(x)]);
            out.push(node(
                m.op.clone(),
                vec![rep(m.children[0]), rep(m.children[1])],
            ));
        }
    }
}
