//! Parallel refinement (paper Table "Core equality rules", middle): tensor-level operators
//! as computations on tiles plus the operations that combine their results.

use super::*;
use crate::ir::{BuiltinReducer, ParKind, ReducerRef};
use std::collections::HashMap;

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
    Rule { name: "refine-result",    family: Family::Refinement, equation: "R = combination[D,d](partition[D,d](R))  (R a pointwise or transpose result, a concat piece or a reshaped transpose, no rule tiled)", root: Root::Any, find: refine_result, reach: Reach::Late },
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

/// Axis names for the M, N and K dimensions of a matmul; `None` where a dimension is not
/// refinable (a literal 1, a tile dimension) or its axis is already used by an operand.
type Mnk = [Option<String>; 3];

/// The ways to name the M, N and K axes of a matmul, each named after its dimension. When
/// dimensions share a symbol (`SxD · DxD`, `SxD · DxS`) there is one naming per role that
/// keeps the plain name (`d`), the others taking `d_2`, `d_3` in M, N, K order: the role
/// that keeps it meets the refinements of the value it belongs to (a norm reducing the
/// left operand's `D` before a `DxD` projection meets a K named `d`; one reducing the
/// product's `D` after it meets an N named `d`). Namings with a repeated axis are dropped.
fn mnk_variants(m: &MatMul) -> Vec<Mnk> {
    let (ra, rb) = (m.ta.rank(), m.tb.rank());
    let bases = [
        axis_for(&m.ta.shape[ra - 2]),
        axis_for(&m.tb.shape[rb - 1]),
        axis_for(&m.ta.shape[ra - 1]),
    ];
    // Roles grouped by base name, in role order.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (r, b) in bases.iter().enumerate() {
        let Some(b) = b else { continue };
        match groups.iter_mut().find(|g| bases[g[0]].as_ref() == Some(b)) {
            Some(g) => g.push(r),
            None => groups.push(vec![r]),
        }
    }
    // One choice of the role keeping the plain name per group: a mixed-radix counter.
    let total: usize = groups.iter().map(Vec::len).product();
    let states = [&m.ta.par, &m.tb.par];
    let mut out: Vec<Mnk> = Vec::new();
    for mut choice in 0..total {
        let mut names: Mnk = Default::default();
        for g in &groups {
            let primary = g[choice % g.len()];
            choice /= g.len();
            let base = bases[g[0]].as_deref().unwrap_or_default();
            let mut next = 1;
            for &r in g {
                let i = if r == primary {
                    0
                } else {
                    next += 1;
                    next - 1
                };
                names[r] = Some(nth_axis(base, i)).filter(|a| fresh(a, &states));
            }
        }
        let named: Vec<&String> = names.iter().flatten().collect();
        let distinct = named
            .iter()
            .enumerate()
            .all(|(i, a)| !named[..i].contains(a));
        if distinct && !out.contains(&names) {
            out.push(names);
        }
    }
    out
}

/// The distinct namings of the roles `pick` selects (`[true, false, false]`: M only), among
/// those that name every selected role.
fn namings(m: &MatMul, pick: [bool; 3]) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = Vec::new();
    for v in mnk_variants(m) {
        let sel: Option<Vec<String>> = (0..3).filter(|&r| pick[r]).map(|r| v[r].clone()).collect();
        if let Some(sel) = sel {
            if !out.contains(&sel) {
                out.push(sel);
            }
        }
    }
    out
}

/// The matmul's operand partitions must allow tiles: tile_matmul only on operands whose
/// existing state is batch-only (the tensor-level matmul guarantees that).
fn tile(m: &MatMul, a: Term, b: Term) -> Term {
    node(Op::TileMatMul(m.acc), vec![a, b])
}

/// The sum over K tiles of the partial products. A product whose result is bf16 or f16
/// accumulates in f32 and rounds once; its partial sums are kept in f32 and the sum rounded
/// once too (`cast(reduce tile_matmul(…) acc=f32 parallel=k) to=bf16`). Rounding each partial
/// to bf16 and summing in bf16 lost bits the source keeps, and a softmax over such scores at
/// inputs of scale 30 was off by a relative 0.11.
fn k_sum(m: &MatMul, ak: &str, a: Term, b: Term) -> Term {
    use crate::ir::DType;
    match m.out.dtype {
        narrow @ (DType::BF16 | DType::F16) => {
            let partial = node(Op::TileMatMul(Some(DType::F32)), vec![a, b]);
            node(Op::Cast(narrow), vec![sum_over(ak, partial)])
        }
        _ => sum_over(ak, tile(m, a, b)),
    }
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
    let (ra, ro) = (m.ta.rank(), m.out.rank());
    for names in namings(&m, [true, false, false]) {
        let am = &names[0];
        out.push(comb(
            ro - 2,
            am,
            tile(&m, part(ra - 2, am, cls(m.a)), rep(am, cls(m.b))),
        ));
    }
}

fn matmul_split_n(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (rb, ro) = (m.tb.rank(), m.out.rank());
    for names in namings(&m, [false, true, false]) {
        let an = &names[0];
        out.push(comb(
            ro - 1,
            an,
            tile(&m, rep(an, cls(m.a)), part(rb - 1, an, cls(m.b))),
        ));
    }
}

fn matmul_split_k(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (ra, rb) = (m.ta.rank(), m.tb.rank());
    for names in namings(&m, [false, false, true]) {
        let ak = &names[0];
        out.push(k_sum(
            &m,
            ak,
            part(ra - 1, ak, cls(m.a)),
            part(rb - 2, ak, cls(m.b)),
        ));
    }
}

fn matmul_split_mn(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (ra, rb, ro) = (m.ta.rank(), m.tb.rank(), m.out.rank());
    for names in namings(&m, [true, true, false]) {
        let (am, an) = (&names[0], &names[1]);
        let a = rep(an, part(ra - 2, am, cls(m.a)));
        let b = part(rb - 1, an, rep(am, cls(m.b)));
        out.push(comb(ro - 2, am, comb(ro - 1, an, tile(&m, a, b))));
    }
}

fn matmul_split_mk(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (ra, rb, ro) = (m.ta.rank(), m.tb.rank(), m.out.rank());
    for names in namings(&m, [true, false, true]) {
        let (am, ak) = (&names[0], &names[1]);
        let a = part(ra - 1, ak, part(ra - 2, am, cls(m.a)));
        let b = part(rb - 2, ak, rep(am, cls(m.b)));
        out.push(comb(ro - 2, am, k_sum(&m, ak, a, b)));
    }
}

fn matmul_split_nk(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (ra, rb, ro) = (m.ta.rank(), m.tb.rank(), m.out.rank());
    for names in namings(&m, [false, true, true]) {
        let (an, ak) = (&names[0], &names[1]);
        let a = part(ra - 1, ak, rep(an, cls(m.a)));
        let b = part(rb - 2, ak, part(rb - 1, an, cls(m.b)));
        out.push(comb(ro - 1, an, k_sum(&m, ak, a, b)));
    }
}

fn matmul_split_mnk(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some(m) = matmul(eg, class, n) else {
        return;
    };
    let (ra, rb, ro) = (m.ta.rank(), m.tb.rank(), m.out.rank());
    for names in namings(&m, [true, true, true]) {
        let (am, an, ak) = (&names[0], &names[1], &names[2]);
        let a = part(ra - 1, ak, rep(an, part(ra - 2, am, cls(m.a))));
        let b = part(rb - 2, ak, part(rb - 1, an, rep(am, cls(m.b))));
        out.push(comb(ro - 2, am, comb(ro - 1, an, k_sum(&m, ak, a, b))));
    }
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
        let Some(axis) = axis_at(&m.out.shape, ob).filter(|a| fresh(a, &[&m.ta.par, &m.tb.par]))
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
    // A reduction of a constant (an `iota` of key positions) is computed where it is used.
    let leaf = nodes(eg, x)
        .iter()
        .any(|m| matches!(m.op, Op::Iota(..) | Op::Fill(..) | Op::Constant(..)));
    let only_literal_ones_ahead =
        !leaf && tx.par.is_empty() && tx.shape[..*dim].iter().all(Dim::is_one);
    for d in 0..tx.rank() {
        // A literal 1 is split only where it leads and every dimension ahead of the
        // reduced one is a literal 1 (a one-row batch, `1xV`): elsewhere — a decode query's
        // `1` beside its batch and heads, the size-1 dimensions `keep_dims` leaves behind,
        // those of the partial results a collection stacks, a constant, tiles — the grid
        // has axes already or needs none, and splitting would only multiply the e-classes.
        if d == *dim || tx.par.partitioner_of(d).is_some() {
            continue;
        }
        if tx.shape[d].is_one() && (d > 0 || !only_literal_ones_ahead) {
            continue;
        }
        let Some(axis) = axis_at_or_one(&tx.shape, d).filter(|a| fresh(a, &[&tx.par])) else {
            continue;
        };
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
    let Some(axis) = axis_at(&tx.shape, *dim).filter(|a| fresh(a, &[&tx.par])) else {
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

/// A function result computed by a pointwise operator (or a transpose) that, once the other rules have
/// saturated, no rule tiled (its class has no `combination`): tiles along each dimension,
/// which `pointwise-partition-in` carries into its operands. Without it such a result is a
/// kernel of its own (a residual sum returned beside its normalisation was 5 kernels);
/// with it, its tiles meet those of another result's kernel that reads the same operands,
/// and one kernel stores both. Only results, only untiled ones, and no constant (a mask
/// computed from `iota`, which is as cheap to write in one block as in any tiling): refining
/// every pointwise value would multiply the e-classes of every program.
fn refine_result(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    // A transpose result is a view of its operand: tiled, its kernel copies blocks (a head
    // split `transpose[1,2,0](reshape[MxNHxDH](k))` searched on its own had no other
    // implementation than one block of the whole tensor). Not a reshape: its tiles' class
    // would be the result's own; the extracted candidate tiles its copy instead
    // (`extract/output.rs::tile_view_results`).
    if !eg.analysis.late || !(Op::is_pointwise(&n.op) || matches!(n.op, Op::Transpose(_))) {
        return;
    }
    // Also a value a `concat` joins: the concatenation is a view its readers' tiles load, so
    // its pieces are stored, and a pointwise piece no rule tiled (RoPE's `neg` of half the
    // query) was one block of the whole tensor.
    let concatenated = || {
        eg[class]
            .parents()
            .any(|p| matches!(eg.id_to_node(p).op, Op::Concat(_)))
    };
    // And a transpose a `reshape` reads: the reshape views the transpose's buffer, so the
    // transpose is stored by a kernel of its own (GQA keys written
    // `reshape[NKVx1xDxT](transpose[0,2,1](k))` were one block of the whole tensor).
    let reshaped = || {
        matches!(n.op, Op::Transpose(_))
            && eg[class]
                .parents()
                .any(|p| matches!(eg.id_to_node(p).op, Op::Reshape(_)))
    };
    if !eg.analysis.results.iter().any(|r| eg.find(*r) == class) && !concatenated() && !reshaped() {
        return;
    }
    let Some(t) = tensor_type(eg, class) else {
        return;
    };
    if !t.par.is_empty()
        || nodes(eg, class)
            .iter()
            .any(|m| matches!(m.op, Op::Combination(..)))
        || constant(eg, class, &mut HashMap::default())
    {
        return;
    }
    for d in 0..t.rank() {
        if let Some(axis) = axis_at(&t.shape, d) {
            out.push(comb(d, &axis, part(d, &axis, cls(class))));
        }
    }
}

/// Whether class `c` is a constant expression: some e-node of it is a `fill`, `constant` or
/// `iota`, or an operator whose operands all are. `known` memoises the verdicts (a class
/// being decided counts as not constant, so a cycle through it decides nothing).
fn constant(eg: &EGraph, c: Id, known: &mut HashMap<Id, bool>) -> bool {
    let c = eg.find(c);
    if let Some(v) = known.get(&c) {
        return *v;
    }
    known.insert(c, false);
    let found = nodes(eg, c).iter().any(|m| match m.op {
        Op::Iota(..) | Op::Fill(..) | Op::Constant(..) => true,
        Op::Input(..) => false,
        _ => !m.children.is_empty() && m.children.iter().all(|k| constant(eg, *k, known)),
    });
    known.insert(c, found);
    found
}
