//! The e-graph as extraction sees it (`ExtractGraph`), and the cost estimates that order the
//! worklist.

use super::canon::{is_compute, is_view, operand_swap, type_info, KeyInfo};
use super::kernels::light;
use super::reach::{add, members};
use super::{Choice, NONE};
use crate::egraph::graph::TypedEGraph;
use crate::egraph::lang::{ENode, Op};
use crate::ir::Type;
use crate::lower::lowerable::{node_refusal, Operand};
use crate::lower::tiled;
use egg::Id;
use rustc_hash::FxHashMap;

/// The e-graph as extraction sees it: dense class indices, and per class only the e-nodes
/// that can appear in a lowerable program.
pub struct ExtractGraph<'a> {
    pub g: &'a TypedEGraph,
    /// Canonical e-class id per dense index, in id order.
    pub ids: Vec<Id>,
    /// Valid e-nodes per class: (e-node, children as dense indices).
    pub nodes: Vec<Vec<(ENode, Vec<u32>)>>,
    pub roots: Vec<u32>,
    /// Classes reachable from each class through valid e-nodes (itself included), as bitsets.
    pub(super) reach: Vec<Vec<u64>>,
    /// Per class, the classes with a valid e-node that reads it, each once.
    pub(super) parents: Vec<Vec<u32>>,
    /// Per class, the classes of its cheapest program (its e-node of least cheapest cost,
    /// and theirs below it), itself included, as bitsets: a hole's share of the search's
    /// priority (see `hole_estimate`).
    pub(super) cheapest: Vec<Vec<u64>>,
    /// Classes whose value is known at compile time (built from fill/constant/iota only).
    pub(super) constant: Vec<bool>,
    /// Classes holding an input.
    pub(super) input: Vec<bool>,
    /// Each valid e-node's own cost, its children not included (except the recomputation a
    /// replica of a computed tile implies, estimated from the child's cheapest cost).
    pub(super) pick_cost: Vec<Vec<u64>>,
    /// Facts of each class's type that canonical forms and validity checks consult.
    pub(super) info: Vec<KeyInfo>,
    /// Per class, the valid view e-nodes (`partition`, `replicate`) that read it: (class,
    /// e-node index).
    pub(super) view_users: Vec<Vec<(u32, u32)>>,
    /// Per tuple-typed class, who can read its components (see `dead_component`).
    pub(super) components: Vec<Option<ComponentReaders>>,
    /// Per class, the `get[i](t)` e-nodes it holds: (tuple class t, i, e-node index).
    pub(super) gets_held: Vec<Vec<(u32, usize, u32)>>,
    /// Per tiled class, whether some completion computes a reduction or a matrix product in
    /// its tile computation (down to its loads); per untiled class, whether every e-node is
    /// a pointwise kernel whatever the picks below it: see `has_pointwise_kernel`.
    pub(super) heavy_tile: Vec<bool>,
    pub(super) pointwise_only: Vec<bool>,
    /// E-nodes left out because `lower` refuses them whatever program holds them
    /// (`lower::lowerable::node_refusal`), and the first one's reason: the search never
    /// expands a program with one.
    pub unlowerable: usize,
    pub first_unlowerable: Option<String>,
    /// Per class, the e-nodes early compaction branches on: all but the operand swaps of an
    /// earlier e-node (`b * a` after `a * b`, both in the e-graph by commutativity). A swap's
    /// program is ≈ₚ the original's — the same canonical form and hole context, the same
    /// validity — so its branch is pruned before it is pushed, and a class whose e-nodes are
    /// one and its swap is resolved by unit propagation.
    pub(super) unswapped: Vec<Vec<u32>>,
    /// Built with every stored grid: a tiled class keeps its `combination` e-nodes even
    /// where another operator may read it, and the search refuses a program in which one
    /// does (`validity::store_read_in_kernel`).
    pub(super) every_grid: bool,
}

/// How a program can read the components of a tuple-typed class: whole (it is a result, or
/// some e-node other than `get` takes it), or component `i` through the one e-node
/// `get[i](t)` of the e-graph: (class, e-node index), `None` where no valid e-node reads it.
pub(super) struct ComponentReaders {
    pub(super) whole: bool,
    pub(super) gets: Vec<Option<(u32, u32)>>,
}

impl<'a> ExtractGraph<'a> {
    /// Keeps the e-nodes of a lowerable program: no tensor-level `matmul`, none that `lower`
    /// refuses whatever program holds it (`lower::lowerable`), and only e-nodes all of whose
    /// children have some finite acyclic lowerable term. Fails when a result has none.
    pub fn new(g: &'a TypedEGraph) -> Result<ExtractGraph<'a>, String> {
        Self::build(g, true, false, false)
    }

    /// [`ExtractGraph::new`] keeping the combinations of tiles that only other combinations
    /// read: stores along two grid axes (`extract{stored-grids=true}`). Early compaction is
    /// not known to be exact with them: on the saturated softmax–matmul core it finds a class
    /// fewer than compaction after completion (tests/extract_compaction.rs).
    pub fn with_stored_grids(g: &'a TypedEGraph) -> Result<ExtractGraph<'a>, String> {
        Self::build(g, true, true, false)
    }

    /// [`ExtractGraph::with_stored_grids`] keeping every combination of tiles: a tile stored
    /// along two grid axes whose class another program reads inside a kernel (see `build`).
    pub fn with_every_stored_grid(g: &'a TypedEGraph) -> Result<ExtractGraph<'a>, String> {
        Self::build(g, true, true, true)
    }

    /// [`ExtractGraph::new`] keeping the e-nodes `lower` refuses on their own: the search
    /// builds programs with them and the backend refuses them once complete (to measure what
    /// leaving them out saves).
    pub fn with_unlowerable_enodes(g: &'a TypedEGraph) -> Result<ExtractGraph<'a>, String> {
        Self::build(g, false, false, false)
    }

    fn build(
        g: &'a TypedEGraph,
        prune_unlowerable: bool,
        stored_grids: bool,
        every_grid: bool,
    ) -> Result<ExtractGraph<'a>, String> {
        let eg = &g.egraph;
        let mut ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
        ids.sort();
        let index: FxHashMap<Id, u32> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (*id, i as u32))
            .collect();
        let mut nodes: Vec<Vec<(ENode, Vec<u32>)>> = ids
            .iter()
            .map(|id| {
                let mut v: Vec<(ENode, Vec<u32>)> = eg[*id]
                    .nodes
                    .iter()
                    .filter(|n| !matches!(n.op, Op::MatMul { .. }))
                    // A slice or concat of tiles cuts or joins blocks in a kernel, which
                    // lowering refuses; its class holds the view of tensor-level values
                    // (`slice-partition-in`, `concat-partition-in`) that loads read through.
                    .filter(|n| {
                        !(matches!(n.op, Op::Slice(..) | Op::Concat(_))
                            && tiled(eg[*id].data.as_ref()))
                    })
                    .map(|n| {
                        let kids = n.children.iter().map(|k| index[&eg.find(*k)]).collect();
                        (n.clone(), kids)
                    })
                    .collect();
                v.sort_by(|a, b| a.0.cmp(&b.0));
                v
            })
            .collect();
        // A tensor-level value that has a tiled implementation (a `combination` of tiles) is
        // computed by it: as with matmul, the default-tiled tensor-level operator is skipped.
        // Values without one keep their default tiling, and so do values whose combinations
        // have no term left (their tiles need a slice or concat of tiles, filtered above).
        let finite = crate::ir::finite::bottom_up(&operand_lists(&nodes)).finite;
        for (c, ns) in nodes.iter_mut().enumerate() {
            let untiled = !tiled(eg[ids[c]].data.as_ref());
            let combined = ns.iter().any(|(n, kids)| {
                matches!(n.op, Op::Combination(..)) && kids.iter().all(|k| finite[*k as usize])
            });
            if untiled && combined {
                ns.retain(|(n, _)| !is_compute(&n.op));
            }
        }
        // A combination whose result is still tiled and that another operator reads is
        // computed inside one kernel, which then spans the combined dimension in one block:
        // the same kernel as the program that never split that dimension. Where the class has
        // another implementation (after saturation, the unsplit one), such splits are no
        // candidates of their own; a hand-tiled program whose only form combines inside a
        // kernel keeps it. With `stored_grids`, a class only combinations read is part of a
        // store: combining it along one axis and then another stores each tile of a
        // two-dimensional grid (`lower::plan`), a kernel of its own. That is judged per class:
        // a class some operator of *any* program reads loses its combinations, which leaves
        // `BxTxH · HxH` with no stored `(b, t)` grid (the batch tile is what another
        // program's reduction reads). `every_grid` keeps every combination and has the search
        // refuse a program in which another operator reads one (`store_read_in_kernel`): more
        // programs, searched when the others have no legal schedule.
        if !every_grid {
            // Stored grids alone: a class an operator other than a combination reads, in
            // any program, loses its combinations.
            let mut read_by_other = vec![!stored_grids; nodes.len()];
            for ns in &nodes {
                for (n, kids) in ns {
                    if !matches!(n.op, Op::Combination(..)) {
                        for k in kids {
                            read_by_other[*k as usize] = true;
                        }
                    }
                }
            }
            for (c, ns) in nodes.iter_mut().enumerate() {
                let in_kernel = |n: &ENode| matches!(n.op, Op::Combination(..));
                if tiled(eg[ids[c]].data.as_ref())
                    && read_by_other[c]
                    && ns.iter().any(|(n, _)| !in_kernel(n))
                {
                    ns.retain(|(n, _)| !in_kernel(n));
                }
            }
        }
        // E-nodes `lower` refuses in any program are never picked.
        let (unlowerable, first_unlowerable) = if prune_unlowerable {
            prune_unlowerable_enodes(g, &ids, &mut nodes)
        } else {
            (0, None)
        };
        // Classes with a finite term, bottom-up from the leaves.
        let finite = crate::ir::finite::bottom_up(&operand_lists(&nodes)).finite;
        for ns in &mut nodes {
            ns.retain(|(_, k)| k.iter().all(|k| finite[*k as usize]));
        }
        // Exploration order (it decides which candidates come first when a limit stops the
        // search, never which exist): cheapest first by an estimate of the work a candidate
        // does (see `node_cost`).
        // Constant classes (computable from fill/constant/iota alone) cost nothing at run time.
        let constant = constant_classes(g, &ids, &nodes);
        // A value known at compile time is computed one way, folded from the constants it
        // is built of: its tiled, parallel or stored implementations compute the same
        // numbers at run time and are no candidates of their own.
        for (c, ns) in nodes.iter_mut().enumerate() {
            if constant[c] {
                ns.retain(|(n, kids)| {
                    !is_view(&n.op)
                        && !matches!(n.op, Op::Combination(..) | Op::Collection(_))
                        && kids.iter().all(|k| constant[*k as usize])
                });
            }
        }
        let cost = |n: &ENode, c: usize| -> u64 {
            if constant[c]
                && n.children
                    .iter()
                    .all(|k| constant[index[&eg.find(*k)] as usize])
            {
                return 1;
            }
            let ty = |id: Id| eg[eg.find(id)].data.as_ref();
            let operands: Vec<Option<&Type>> = n.children.iter().map(|k| ty(*k)).collect();
            node_cost(&n.op, eg[ids[c]].data.as_ref(), &operands, &g.bindings)
        };
        let mut best = vec![u64::MAX; ids.len()];
        // A replica of a computed tile is computed once per coordinate of the new axis.
        let replicas = |n: &ENode| -> u64 {
            match (&n.op, n.children.as_slice()) {
                (Op::Replicate(_), [k]) if tiled(eg[eg.find(*k)].data.as_ref()) => {
                    AXIS_COUNT as u64
                }
                _ => 1,
            }
        };
        let total = |n: &ENode, kids: &[u32], c: usize, best: &[u64]| {
            let widest = kids.iter().map(|k| best[*k as usize]).max().unwrap_or(0);
            cost(n, c).saturating_add(widest.saturating_mul(replicas(n)))
        };
        loop {
            let mut changed = false;
            for (c, ns) in nodes.iter().enumerate() {
                for (n, kids) in ns {
                    let t = total(n, kids, c, &best);
                    if t < best[c] {
                        best[c] = t;
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        for (c, ns) in nodes.iter_mut().enumerate() {
            ns.sort_by(|a, b| {
                total(&a.0, &a.1, c, &best)
                    .cmp(&total(&b.0, &b.1, c, &best))
                    .then_with(|| a.0.cmp(&b.0))
            });
        }
        let pick_cost: Vec<Vec<u64>> = nodes
            .iter()
            .enumerate()
            .map(|(c, ns)| {
                ns.iter()
                    .map(|(n, kids)| {
                        let extra = replicas(n) - 1;
                        kids.iter().fold(cost(n, c), |t, k| {
                            t.saturating_add(best[*k as usize].saturating_mul(extra))
                        })
                    })
                    .collect()
            })
            .collect();
        // Children of a finite class's cheapest e-node are cheaper still, so in order of
        // cheapest cost each class's children come first (an infinite class keeps itself).
        let words = ids.len().div_ceil(64);
        let mut cheapest = vec![vec![0u64; words]; ids.len()];
        let mut by_cost: Vec<usize> = (0..ids.len()).collect();
        by_cost.sort_by_key(|c| (best[*c], *c));
        let mut done = vec![false; ids.len()];
        for c in by_cost {
            cheapest[c][c / 64] |= 1 << (c % 64);
            if let Some((_, kids)) = nodes[c].first().filter(|_| best[c] != u64::MAX) {
                for k in kids.iter().map(|k| *k as usize).filter(|k| done[*k]) {
                    let (below, at) = if k < c {
                        let (lo, hi) = cheapest.split_at_mut(c);
                        (&lo[k], &mut hi[0])
                    } else {
                        let (lo, hi) = cheapest.split_at_mut(k);
                        (&hi[0], &mut lo[c])
                    };
                    for (w, b) in at.iter_mut().zip(below) {
                        *w |= b;
                    }
                }
            }
            done[c] = true;
        }
        let roots: Vec<u32> = g.roots.iter().map(|r| index[&eg.find(*r)]).collect();
        if let Some(r) = roots.iter().find(|r| !finite[**r as usize]) {
            let refused = match &first_unlowerable {
                Some(why) => format!(", or an e-node `lower` refuses in any program: {why}"),
                None => String::new(),
            };
            return Err(format!(
                "result e-class %{} has no lowerable program (every term uses a tensor-level matmul or a cycle{refused})",
                ids[*r as usize]
            ));
        }
        let reach = reachability(&nodes);
        let mut view_users = vec![Vec::new(); ids.len()];
        for (q, ns) in nodes.iter().enumerate() {
            for (j, (n, kids)) in ns.iter().enumerate() {
                if is_view(&n.op) {
                    view_users[kids[0] as usize].push((q as u32, j as u32));
                }
            }
        }
        let info: Vec<KeyInfo> = ids
            .iter()
            .map(|id| type_info(eg[*id].data.as_ref()))
            .collect();
        let mut components: Vec<Option<ComponentReaders>> = ids
            .iter()
            .map(|id| match eg[*id].data.as_ref() {
                Some(Type::Tuple(ts)) => Some(ComponentReaders {
                    whole: false,
                    gets: vec![None; ts.len()],
                }),
                _ => None,
            })
            .collect();
        for r in &roots {
            if let Some(t) = components[*r as usize].as_mut() {
                t.whole = true;
            }
        }
        for (q, ns) in nodes.iter().enumerate() {
            for (j, (n, kids)) in ns.iter().enumerate() {
                for k in kids {
                    let Some(t) = components[*k as usize].as_mut() else {
                        continue;
                    };
                    let reader = Some((q as u32, j as u32));
                    match n.op {
                        // One `get[i](t)` per e-graph; were there two, reading stays open.
                        Op::Get(i) if t.gets.get(i).is_some_and(|g| g.is_none()) => {
                            t.gets[i] = reader
                        }
                        _ => t.whole = true,
                    }
                }
            }
        }
        let mut gets_held: Vec<Vec<(u32, usize, u32)>> = vec![Vec::new(); ids.len()];
        for (t, readers) in components.iter().enumerate() {
            for (i, get) in readers.iter().flat_map(|r| r.gets.iter().enumerate()) {
                if let Some((b, j)) = get {
                    gets_held[*b as usize].push((t as u32, i, *j));
                }
            }
        }
        let is_tiled = |c: usize| info[c].tiled;
        // Least fixpoint: heavy by an e-node of its own, or through a tiled operand.
        let mut heavy_tile = vec![false; ids.len()];
        loop {
            let mut changed = false;
            for (c, ns) in nodes.iter().enumerate() {
                if heavy_tile[c] || !is_tiled(c) {
                    continue;
                }
                let heavy = ns.iter().any(|(n, kids)| {
                    (is_compute(&n.op) && !light(&n.op))
                        || kids.iter().any(|k| heavy_tile[*k as usize])
                });
                if heavy {
                    heavy_tile[c] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        let pointwise_only = nodes
            .iter()
            .enumerate()
            .map(|(c, ns)| {
                !is_tiled(c)
                    && !constant[c]
                    && !roots.contains(&(c as u32))
                    && ns.iter().all(|(n, kids)| {
                        // A reshape here is a view (the class is untiled, no constant, no
                        // result): no kernel of its own.
                        (light(&n.op) && is_compute(&n.op) && !matches!(n.op, Op::Reshape(_)))
                            || (matches!(n.op, Op::Combination(..) | Op::Collection(_))
                                && kids.iter().all(|k| !heavy_tile[*k as usize]))
                    })
            })
            .collect();
        let unswapped = nodes
            .iter()
            .map(|ns| {
                (0..ns.len())
                    .filter(|&i| !ns[..i].iter().any(|earlier| operand_swap(earlier, &ns[i])))
                    .map(|i| i as u32)
                    .collect()
            })
            .collect();
        Ok(ExtractGraph {
            g,
            unlowerable,
            first_unlowerable,
            every_grid,
            info,
            components,
            gets_held,
            unswapped,
            heavy_tile,
            pointwise_only,
            ids,
            cheapest,
            pick_cost,
            input: nodes
                .iter()
                .map(|ns| ns.iter().any(|(n, _)| matches!(n.op, Op::Input(..))))
                .collect(),
            constant,
            parents: {
                let mut parents: Vec<Vec<u32>> = vec![Vec::new(); nodes.len()];
                for (c, ns) in nodes.iter().enumerate() {
                    for k in ns.iter().flat_map(|(_, kids)| kids) {
                        let ps = &mut parents[*k as usize];
                        if ps.last() != Some(&(c as u32)) {
                            ps.push(c as u32);
                        }
                    }
                }
                parents
            },
            nodes,
            roots,
            reach,
            view_users,
        })
    }

    pub(super) fn op(&self, c: u32, choice: &Choice) -> Option<&(ENode, Vec<u32>)> {
        let n = choice[c as usize];
        (n != NONE).then(|| &self.nodes[c as usize][n as usize])
    }
}

/// Removes from `nodes` the e-nodes `lower::lowerable::node_refusal` refuses, given their
/// class's type and their operand classes' types and constancy: how many, and the first
/// reason. Constancy is judged as `lower` judges it on a program (a class some e-node of
/// which folds from constants is computed that way: see the constant classes of `build`).
fn prune_unlowerable_enodes(
    g: &TypedEGraph,
    ids: &[Id],
    nodes: &mut [Vec<(ENode, Vec<u32>)>],
) -> (usize, Option<String>) {
    let eg = &g.egraph;
    let info = crate::verify::ModuleInfo::of_typed_egraph(&g.egraph.analysis.env);
    let constant = constant_classes(g, ids, nodes);
    let ty = |c: u32| eg[ids[c as usize]].data.as_ref();
    let (mut count, mut first) = (0, None);
    for (c, ns) in nodes.iter_mut().enumerate() {
        ns.retain(|(n, kids)| {
            let operands: Vec<Operand> = kids
                .iter()
                .map(|k| Operand {
                    ty: ty(*k),
                    constant: constant[*k as usize],
                })
                .collect();
            let why = node_refusal(&info, &n.to_expr_kind(), ty(c as u32), &operands);
            if let Some(why) = why {
                count += 1;
                first.get_or_insert(why);
                return false;
            }
            true
        });
    }
    (count, first)
}

/// Classes whose value is known at compile time: some e-node builds it from constants alone
/// (fill/constant/iota leaves and operators on constants; no input, view or store).
fn constant_classes(g: &TypedEGraph, ids: &[Id], nodes: &[Vec<(ENode, Vec<u32>)>]) -> Vec<bool> {
    let eg = &g.egraph;
    let mut constant = vec![false; ids.len()];
    loop {
        let mut changed = false;
        for (c, ns) in nodes.iter().enumerate() {
            if constant[c] || tiled(eg[ids[c]].data.as_ref()) {
                continue;
            }
            let folds = ns.iter().any(|(n, kids)| {
                !matches!(n.op, Op::Input(..))
                    && (!is_compute(&n.op) || !kids.is_empty())
                    && !is_view(&n.op)
                    && !matches!(n.op, Op::Combination(..) | Op::Collection(_))
                    && kids.iter().all(|k| constant[*k as usize])
            });
            if folds {
                constant[c] = true;
                changed = true;
            }
        }
        if !changed {
            return constant;
        }
    }
}

/// Nominal coordinate count of a parallel axis (the real one is a schedule choice).
pub(super) const AXIS_COUNT: f64 = 4.0;
/// Cost of one element moved through global memory, relative to one operation.
pub(super) const MEMORY: f64 = 4.0;
/// Cost of a kernel launch.
pub(super) const LAUNCH: f64 = 1.0e4;
/// Work multiplier of what a kernel without grid axes computes (one program runs it). For
/// the order only: 10 s searches, 2026-11-28, against none: qknorm_mla 4,287.86 → 143.41 us,
/// differential attention 588.98 → 456.39, the corpus's ALiBi decode 78.88 → 121.20 (its
/// best kept a one-program fold of the bias), 28 others the same; 4 to 256 alike, but 4
/// left qknorm_mla at 4,323.71.
pub(super) const SERIAL: f64 = 16.0;

pub(super) fn extent(d: &crate::ir::Dim, bindings: &[crate::ir::Binding]) -> f64 {
    let base = match &d.base {
        crate::ir::DimBase::Lit(n) => *n as f64,
        crate::ir::DimBase::Sym(s) => bindings
            .iter()
            .find(|b| &b.name == s)
            .map_or(64.0, |b| b.value as f64),
        crate::ir::DimBase::Extent(_) => 64.0,
    };
    base / AXIS_COUNT.powi(d.splits.len() as i32)
}

/// Elements of a value over all its parallel coordinates: its logical size times the count of
/// every axis that does not partition it (replicas, partial contributions).
pub(super) fn volume(t: Option<&Type>, bindings: &[crate::ir::Binding]) -> f64 {
    match t {
        Some(Type::Tensor(t)) => {
            let copies = t
                .par
                .0
                .values()
                .filter(|k| !matches!(k, crate::ir::ParKind::Partition(_)))
                .count();
            t.shape.iter().map(|d| extent(d, bindings)).product::<f64>()
                * AXIS_COUNT.powi(copies as i32)
        }
        Some(Type::Tuple(ts)) => ts.iter().map(|t| volume(Some(t), bindings)).sum(),
        None => 0.0,
    }
}

/// The operand classes of every e-node of every class, for `finite::bottom_up`.
fn operand_lists(nodes: &[Vec<(ENode, Vec<u32>)>]) -> Vec<Vec<Vec<usize>>> {
    nodes
        .iter()
        .map(|ns| {
            ns.iter()
                .map(|(_, k)| k.iter().map(|k| *k as usize).collect())
                .collect()
        })
        .collect()
}

/// Estimated work of one e-node, for the exploration order only: operations over all parallel
/// coordinates, elements moved through global memory (loads, stores, and the operands and
/// result of a tensor-level operator) and a launch per kernel. A `replicate` of a computed
/// tile costs its volume: every replica recomputes it. Both estimates favour the candidates a
/// user wants first — fused kernels that compute each value once.
pub(super) fn node_cost(
    op: &Op,
    ty: Option<&Type>,
    operands: &[Option<&Type>],
    bindings: &[crate::ir::Binding],
) -> u64 {
    let out = volume(ty, bindings);
    let widest = operands
        .iter()
        .map(|t| volume(*t, bindings))
        .fold(out, f64::max);
    let is_tiled = tiled(ty);
    let from_memory = operands.iter().all(|t| !tiled(*t));
    // A tensor-level result computed from tiles ends a kernel.
    let exit = if !is_tiled && !from_memory {
        LAUNCH
    } else {
        0.0
    };
    let cost = match op {
        Op::Input(..) | Op::Constant(..) | Op::Fill(..) | Op::Iota(..) | Op::Tuple | Op::Get(_) => {
            1.0
        }
        // Replicated loads mostly hit in cache: global traffic is the logical size once.
        Op::Partition(..) | Op::Replicate(_) if from_memory => {
            let logical = match ty {
                Some(Type::Tensor(t)) => t.shape.iter().map(|d| extent(d, bindings)).product(),
                _ => out,
            };
            MEMORY * logical + (out - logical).max(0.0)
        }
        Op::Partition(..) | Op::Replicate(_) => 1.0,
        Op::Combination(..) | Op::Collection(_) => MEMORY * out + exit,
        // A tensor-level value computed from tiles without a combination: the kernel it ends
        // has no grid axis, one program does all of it (an attention whose every head folds
        // in one program). Its work counts as if serial.
        _ if exit > 0.0 => SERIAL * widest + exit,
        op if !is_tiled && from_memory && is_compute(op) => {
            LAUNCH + MEMORY * (out + operands.iter().map(|t| volume(*t, bindings)).sum::<f64>())
        }
        Op::TileMatMul(_) => {
            let contraction = match operands.first() {
                Some(Some(Type::Tensor(a))) => {
                    let last = a.shape.len().saturating_sub(1);
                    let split = a
                        .par
                        .0
                        .values()
                        .any(|k| *k == crate::ir::ParKind::Partition(last));
                    a.shape.get(last).map_or(1.0, |d| extent(d, bindings))
                        / if split { AXIS_COUNT } else { 1.0 }
                }
                _ => 1.0,
            };
            out * contraction + exit
        }
        _ => widest + exit,
    };
    cost.clamp(1.0, 1.0e15) as u64
}

/// Work of a partial program's resolved part: the pick costs of its reachable resolved
/// classes, each counted once. With `hole_estimate` added, the search's priority.
pub(super) fn picked_cost(x: &ExtractGraph, choice: &Choice, met: &[u32]) -> u64 {
    met.iter()
        .map(|c| *c as usize)
        .filter(|c| choice[*c] != NONE)
        .fold(0u64, |t, c| {
            t.saturating_add(x.pick_cost[c][choice[c] as usize])
        })
}

/// Estimated work of completing a program whose holes' cheapest programs cover `union`: each
/// unresolved class of it counted once, at the cost of its cheapest e-node. Counting a
/// subterm the holes share once matters: summing each hole's cheapest cost put a fused
/// program whose three reductions read one score tile (three holes) behind every program
/// that had stored the tile, and a 10 s run on MHA decode found no single-kernel candidate.
pub(super) fn hole_estimate(x: &ExtractGraph, choice: &Choice, union: &[u64]) -> u64 {
    let mut total = 0u64;
    for c in members(union) {
        if choice[c] == NONE {
            total = total.saturating_add(cheapest_pick(x, c as u32));
        }
    }
    total
}

/// The pick cost of class `c`'s cheapest e-node (the first: e-nodes are sorted by their
/// cheapest program's cost).
pub(super) fn cheapest_pick(x: &ExtractGraph, c: u32) -> u64 {
    x.pick_cost[c as usize].first().copied().unwrap_or(0)
}

/// Adds the cheapest program of class `c` to `union`.
pub(super) fn add_cheapest(x: &ExtractGraph, union: &mut [u64], c: u32) {
    for (w, b) in union.iter_mut().zip(&x.cheapest[c as usize]) {
        *w |= b;
    }
}

/// Transitive closure of the valid-node child relation, one bitset per class.
pub(super) fn reachability(nodes: &[Vec<(ENode, Vec<u32>)>]) -> Vec<Vec<u64>> {
    let n = nodes.len();
    let words = n.div_ceil(64);
    let mut reach = vec![vec![0u64; words]; n];
    for (c, r) in reach.iter_mut().enumerate() {
        let mut stack = vec![c as u32];
        while let Some(k) = stack.pop() {
            let k = k as usize;
            if !add(r, k) {
                continue;
            }
            for (_, kids) in &nodes[k] {
                stack.extend(kids);
            }
        }
    }
    reach
}
