//! Parallel refinement (paper Table "Core equality rules", middle): tensor-level operators
//! as computations on tiles plus the operations that combine their results.

use super::*;
use crate::ir::{BuiltinReducer, ParKind, ReducerRef};

#[rustfmt::skip]
pub static RULES: &[Rule] = &[
    // name                  family               equation
    Rule { name: "matmul-tile",     family: Family::Refinement, equation: "matmul(A,B) = tile_matmul(A,B)", root: Root::MatMul, find: matmul_tile, reach: Reach::Node },
    Rule { name: "matmul-split-m",  family: Family::Refinement, equation: "matmul(A,B) = combination[M,m](tile_matmul(partition[M,m](A), replicate[m](B)))", root: Root::MatMul, find: matmul_split_m, reach: Reach::Node },
    Rule { name: "matmul-split-n",  family: Family::Refinement, equation: "matmul(A,B) = combination[N,n](tile_matmul(replicate[n](A), partition[N,n](B)))", root: Root::MatMul, find: matmul_split_n, reach: Reach::Node },
    Rule { name: "matmul-split-k",  family: Family::Refinement, equation: "matmul(A,B) = reduce tile_matmul(partition[K,k](A), partition[K,k](B)) parallel=k reducer=@add", root: Root::MatMul, find: matmul_split_k, reach: Reach::Node },
    Rule { name: "matmul-split-mn", family: Family::Refinement, equation: "matmul(A,B) = combination[M,m](combination[N,n](tile_matmul(replicate[n](partition[M,m](A)), partition[N,n](replicate[m](B)))))", root: Root::MatMul, find: matmul_split_mn, reach: Reach::Node },
    Rule { name: "matmul-split-mk", family: Family::Refinement, equation: "matmul(A,B) = combination[M,m](reduce tile_matmul(partition[K,k](partition[M,m](A)), partition[K,k](replicate[m](B))) parallel=k reducer=@add)", root: Root::MatMul, find: matmul_split_mk, reach: Reach::Node },
    Rule { name: "matmul-split-nk", family: Family::Refinement, equation: "matmul(A,B) = combination[N,n](reduce tile_matmul(partition[K,k](replicate[n](A)), partition[K,k](partition[N,n](B))) parallel=k reducer=@add)", root: Root::MatMul, find: matmul_split_nk, reach: Reach::Node },
    Rule { name: "matmul-split-mnk", family: Family::Refinement, equation: "matmul(A,B) = combination[M,m](combination[N,n](reduce tile_matmul(partition[K,k](replicate[n](partition[M,m](A))), partition[K,k](partition[N,n](replicate[m](B)))) parallel=k reducer=@add))", root: Root::MatMul, find: matmul_split_mnk, reach: Reach::Node },
    Rule { name: "matmul-split-batch", family: Family::Refinement, equation: "matmul(A,B) = combination[Bt,b](matmul(partition[Bt,b](A), partition[Bt,b](B)))  (replicate for a broadcast operand)", root: Root::MatMul, find: matmul_split_batch, reach: Reach::Node },
    Rule { name: "reduce-split-kept", family: Family::Refinement, equation: "reduce X axis=K = combination[M,m](reduce partition[M,m](X) axis=K)  (M a kept dimension)", root: Root::ReduceAxis, find: reduce_split_kept, reach: Reach::Node },
    Rule { name: "reduce-split-reduced", family: Family::Refinement, equation: "reduce X axis=K reducer=@r = reduce (reduce partition[K,k](X) axis=K reducer=@r) parallel=k reducer=@r  (@r associative)", root: Root::ReduceAxis, find: reduce_split_reduced, reach: Reach::Node },
];

/// Operands and dimensions of a matmul e-node.
struct MatMul<'a> {
    a: Id,
    b: Id,
    ta: &'a TensorType,
    tb: &'a TensorType,
    out: &'a TensorType,
    acc: Option<crate::ir::DType>,
}

fn matmul<'a>(eg: &'a EGraph, class: Id, n: &ENode) -> Option<MatMul<'a>> {
    let Op::MatMul(acc) = n.op else { return None };
    let (a, b) = (n.children[0], n.children[1]);
    Some(MatMul {
        a,
        b,
        ta: tensor_type(eg, a)?,
        tb: tensor_type(eg, b)?,
        out: tensor_type(eg, class)?,
        acc,
    })
}

fn part(d: usize, axis: &str, t: Term) -> Term {
    node(Op::Partition(d, axis.into()), vec![t])
}

fn rep(axis: &str, t: Term) -> Term {
    node(Op::Replicate(axis.into()), vec![t])
}

fn comb(d: usize, axis: &str, t: Term) -> Term {
    node(Op::Combination(d, axis.into()), vec![t])
}

fn sum_over(axis: &str, t: Term) -> Term {
    node(
        Op::ReduceParallel {
            axis: axis.into(),
            reducer: ReducerRef::Builtin(BuiltinReducer::Add),
        },
        vec![t],
    )
}

/// Axes for the M, N and K dimensions of a matmul, when each is refinable and fresh.
fn mnk_axes(m: &MatMul) -> (Option<String>, Option<String>, Option<String>) {
    let states = [&m.ta.par, &m.tb.par];
    let pick = |d: &Dim| axis_for(d).filter(|a| fresh(a, &states));
    let (ra, rb) = (m.ta.rank(), m.tb.rank());
    let am = pick(&m.ta.shape[ra - 2]);
    let an = pick(&m.tb.shape[rb - 1]);
    let ak = pick(&m.ta.shape[ra - 1]);
    // Distinct dimensions with the same symbol (QxQ products) would share an axis: skip.
    let distinct = |x: &Option<String>, y: &Option<String>| x.is_none() || y.is_none() || x != y;
    if !distinct(&am, &an) || !distinct(&am, &ak) || !distinct(&an, &ak) {
        return (None, None, None);
    }
    (am, an, ak)
}

/// The matmul's operand partitions must allow tiles: tile_matmul only on operands whose
/// existing state is batch-only (the tensor-level matmul guarantees that).
fn tile(m: &MatMul, a: Term, b: Term) -> Term {
    node(Op::TileMatMul(m.acc), vec![a, b])
}

fn matmul_tile(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    if let Some(m) = matmul(eg, class, n) {
        out.push(tile(&m, cls(m.a), cls(m.b)));
    }
}

fn matmul_split_m(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (Some(am), _, _) = mnk_axes(&m) else {
        return;
    };
    let (ra, ro) = (m.ta.rank(), m.out.rank());
    out.push(comb(
        ro - 2,
        &am,
        tile(&m, part(ra - 2, &am, cls(m.a)), rep(&am, cls(m.b))),
    ));
}

fn matmul_split_n(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (_, Some(an), _) = mnk_axes(&m) else {
        return;
    };
    let (rb, ro) = (m.tb.rank(), m.out.rank());
    out.push(comb(
        ro - 1,
        &an,
        tile(&m, rep(&an, cls(m.a)), part(rb - 1, &an, cls(m.b))),
    ));
}

fn matmul_split_k(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (_, _, Some(ak)) = mnk_axes(&m) else {
        return;
    };
    let (ra, rb) = (m.ta.rank(), m.tb.rank());
    out.push(sum_over(
        &ak,
        tile(&m, part(ra - 1, &ak, cls(m.a)), part(rb - 2, &ak, cls(m.b))),
    ));
}

fn matmul_split_mn(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (Some(am), Some(an), _) = mnk_axes(&m) else {
        return;
    };
    let (ra, rb, ro) = (m.ta.rank(), m.tb.rank(), m.out.rank());
    let a = rep(&an, part(ra - 2, &am, cls(m.a)));
    let b = part(rb - 1, &an, rep(&am, cls(m.b)));
    out.push(comb(ro - 2, &am, comb(ro - 1, &an, tile(&m, a, b))));
}

fn matmul_split_mk(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (Some(am), _, Some(ak)) = mnk_axes(&m) else {
        return;
    };
    let (ra, rb, ro) = (m.ta.rank(), m.tb.rank(), m.out.rank());
    let a = part(ra - 1, &ak, part(ra - 2, &am, cls(m.a)));
    let b = part(rb - 2, &ak, rep(&am, cls(m.b)));
    out.push(comb(ro - 2, &am, sum_over(&ak, tile(&m, a, b))));
}

fn matmul_split_nk(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (_, Some(an), Some(ak)) = mnk_axes(&m) else {
        return;
    };
    let (ra, rb, ro) = (m.ta.rank(), m.tb.rank(), m.out.rank());
    let a = part(ra - 1, &ak, rep(&an, cls(m.a)));
    let b = part(rb - 2, &ak, part(rb - 1, &an, cls(m.b)));
    out.push(comb(ro - 1, &an, sum_over(&ak, tile(&m, a, b))));
}

fn matmul_split_mnk(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (Some(am), Some(an), Some(ak)) = mnk_axes(&m) else {
        return;
    };
    let (ra, rb, ro) = (m.ta.rank(), m.tb.rank(), m.out.rank());
    let a = part(ra - 1, &ak, rep(&an, part(ra - 2, &am, cls(m.a))));
    let b = part(rb - 2, &ak, part(rb - 1, &an, rep(&am, cls(m.b))));
    out.push(comb(
        ro - 2,
        &am,
        comb(ro - 1, &an, sum_over(&ak, tile(&m, a, b))),
    ));
}

fn matmul_split_batch(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (ra, rb, ro) = (m.ta.rank(), m.tb.rank(), m.out.rank());
    let nb = ro - 2;
    for ob in 0..nb {
        if m.out.par.partitioner_of(ob).is_some() {
            continue;
        }
        let Some(axis) = axis_for(&m.out.shape[ob]).filter(|a| fresh(a, &[&m.ta.par, &m.tb.par]))
        else {
            continue;
        };
        // An operand's batch dim aligned to `ob`, if it has one of full size.
        let local = |rank: usize, t: &TensorType| -> Option<usize> {
            let off = nb as isize - (rank as isize - 2);
            let l = ob as isize - off;
            (l >= 0 && !t.shape[l as usize].is_one()).then_some(l as usize)
        };
        let view = |rank: usize, t: &TensorType, id: Id| match local(rank, t) {
            Some(d) if t.par.partitioner_of(d).is_none() => Some(part(d, &axis, cls(id))),
            Some(_) => None,
            None => Some(rep(&axis, cls(id))),
        };
        let (Some(a), Some(b)) = (view(ra, m.ta, m.a), view(rb, m.tb, m.b)) else {
            continue;
        };
        out.push(comb(ob, &axis, node(Op::MatMul(m.acc), vec![a, b])));
    }
}

fn reduce_split_kept(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::ReduceAxis {
        dim,
        reducer,
        keep_dims,
    } = &n.op
    else {
        return;
    };
    let x = n.children[0];
    let (Some(tx), Some(_)) = (tensor_type(eg, x), tensor_type(eg, class)) else {
        return;
    };
    for d in 0..tx.rank() {
        if d == *dim || tx.par.partitioner_of(d).is_some() || tx.shape[d].is_one() {
            continue;
        }
        let Some(axis) = axis_for(&tx.shape[d]).filter(|a| fresh(a, &[&tx.par])) else {
            continue;
        };
        if tx
            .shape
            .iter()
            .filter(|s| axis_for(s).as_deref() == Some(axis.as_str()))
            .count()
            > 1
        {
            continue;
        }
        let out_d = if *keep_dims || d < *dim { d } else { d - 1 };
        let inner = node(
            Op::ReduceAxis {
                dim: *dim,
                reducer: reducer.clone(),
                keep_dims: *keep_dims,
            },
            vec![part(d, &axis, cls(x))],
        );
        out.push(comb(out_d, &axis, inner));
    }
}

fn reduce_split_reduced(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::ReduceAxis {
        dim,
        reducer: r @ ReducerRef::Builtin(_),
        keep_dims,
    } = &n.op
    else {
        return;
    };
    let x = n.children[0];
    let Some(tx) = tensor_type(eg, x) else { return };
    if tx.par.partitioner_of(*dim).is_some() || tx.par.0.values().any(|k| *k == ParKind::Partial) {
        return;
    }
    let Some(axis) = axis_for(&tx.shape[*dim]).filter(|a| fresh(a, &[&tx.par])) else {
        return;
    };
    let inner = node(
        Op::ReduceAxis {
            dim: *dim,
            reducer: r.clone(),
            keep_dims: *keep_dims,
        },
        vec![part(*dim, &axis, cls(x))],
    );
    out.push(node(
        Op::ReduceParallel {
            axis: axis.into(),
            reducer: r.clone(),
        },
        vec![inner],
    ));
}
