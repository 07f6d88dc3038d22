//! Candidate extraction (paper §5.1, Algorithm 1).
//!
//! A *candidate* picks one e-node for every e-class reachable from the results and forms a
//! finite acyclic program. It must be lowerable: tensor-level `matmul` is never picked (its
//! tiled implementations are), and every other operator either lies in a tiled region or has
//! a default tiling. A *partial program* has picked e-nodes for some classes; the reachable
//! classes without a pick are its holes.
//!
//! Candidates are grouped by an equivalence ≈: programs that differ only in the operand
//! order of commutative pointwise operators (and, inside a kernel, the grouping of a chain of
//! one associative operator), in the order in which a value's parallel views
//! (`partition`/`replicate`) or a result's `combination`s are written, or in where a
//! `replicate` or `combination` sits relative to pointwise operators computed in a kernel, or
//! in where a kernel boundary cuts a pointwise chain (a tail applied before a store or after
//! the load: `Key::Epilogue`), are one class. Validity adds that each value is computed once
//! (`computed_once`), that no component of a fused reduction goes unread (`dead_component`),
//! and that the kernels have a launch order — each checked on partial programs as far as
//! their resolved classes decide it (`launch_order_impossible`), and on complete ones by
//! `lower`.
//! Matmul structure, reduction organisation and intermediate storage stay distinct. Each
//! partial program has a canonical form — holes named by their e-class, commutative operands
//! sorted, view chains as sorted sets — interned exactly (no hashing shortcuts). Two partial
//! programs are ≈ₚ when their canonical forms are equal and so are their hole contexts (the
//! canonical forms of the resolved classes a completion can read; see `hole_context`): then
//! they allow the same completions.
//!
//! Three modes, as in the paper's ablation: `None` outputs every complete candidate; `After`
//! constructs every candidate and keeps one per class; `Early` (Algorithm 1) prunes a partial
//! program before expanding it when a ≈ₚ one was taken. The worklist is cheapest-first by an
//! estimate of the work a program does (`node_cost`), so limits stop after the fused
//! candidates; `max_kernels` prunes by a kernel lower bound. The hole expanded next is the
//! one with the fewest e-nodes (forced picks first; `HoleOrder`). Which hole is chosen must
//! not change the classes found — every partial-program check holds for all completions,
//! validity is the same for ≈ programs, ≈ is a function of the parts' forms, and a complete
//! program is pruned only against one already output — and it changes the cost a lot:
//! rmsnorm_gemm takes 0.12 M expansions resolving holes in walk order, 0.05 M this way, for
//! the same 728 classes. A class with one e-node is resolved in the state that makes it
//! reachable (unit propagation), without an expansion of its own. Pruning uses a
//! finer relation than ≈, in which a fold over a stored collection keeps its own form: it is
//! ≈ to `reduce … parallel=` but gives another kernel graph, so launch order is not a function
//! of ≈, and pruning by ≈ lost classes (layernorm_gemm, before dead product components were
//! rejected: 6,563 classes in walk order against
//! 6,627 fewest-first). Complete programs are grouped by ≈.
//!
//! The search runs on one thread; complete programs are rebuilt as functions, checked and
//! lowered on a second (`LoweringQueue`), which decides and counts exactly as checking each
//! program in turn would (MHA decode: half the search's time went there; 22,336–22,660 →
//! 34,806 candidates in 10 s, RMSNorm–MLP exhaustive 3.33–3.39 → 2.43–2.45 s). Evaluating the next
//! partial programs in worklist order on the thread pool while taking them in order (output
//! unchanged) was measured slower on the 2-core development machine: the worklist is narrow
//! (about 2.3 programs to evaluate per step on rmsnorm_gemm), so each step paid a pool wake-up
//! for little work, and the shared interner that ids across threads need cost 12%
//! single-threaded (rmsnorm_gemm: 14.3 s with two threads against 10.0 s serial).

use super::graph::TypedEGraph;
use super::lang::{ENode, Op};
use crate::ir::{BinaryOp, Body, DType, ExprKind, Function, Node, NodeId, Sym, Type};
use crate::lower::tiled;
use egg::Id;
use rustc_hash::{FxHashMap, FxHashSet};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Compaction {
    None,
    After,
    Early,
}

impl Compaction {
    pub fn parse(s: &str) -> Option<Compaction> {
        match s {
            "none" => Some(Compaction::None),
            "after" => Some(Compaction::After),
            "early" => Some(Compaction::Early),
            _ => None,
        }
    }
}

/// Why extraction stopped.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum ExtractStop {
    /// Every partial program was expanded or pruned.
    Exhausted,
    CandidateLimit(usize),
    TimeLimit(f64),
    /// The process's resident memory reached this many MiB.
    MemoryLimit(usize),
}

impl std::fmt::Display for ExtractStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExtractStop::Exhausted => f.write_str("exhausted"),
            ExtractStop::CandidateLimit(n) => write!(f, "candidate limit ({n}) reached"),
            ExtractStop::TimeLimit(s) => write!(f, "time limit ({s} s) reached"),
            ExtractStop::MemoryLimit(m) => write!(f, "memory limit ({m} MiB) reached"),
        }
    }
}

/// One picked e-node index per class (dense class index); `NONE` marks a hole or an
/// unreachable class.
pub type Choice = Vec<u32>;
const NONE: u32 = u32::MAX;

#[derive(Clone, Debug)]
pub struct Candidate {
    /// (class, e-node) for each class the program resolves, in class order. Kept sparse: a
    /// dense `Choice` costs four bytes per e-graph class, and MHA decode's 50 K candidates of a
    /// 20 s run held 274 MB so.
    picks: Vec<(u32, u32)>,
    classes: u32,
    /// Estimated work (the exploration order's cost model), each picked e-node counted once.
    pub cost: u64,
}

impl Candidate {
    fn new(choice: &Choice, cost: u64) -> Candidate {
        Candidate {
            picks: (0..)
                .zip(choice)
                .filter(|(_, n)| **n != NONE)
                .map(|(c, n)| (c, *n))
                .collect(),
            classes: choice.len() as u32,
            cost,
        }
    }

    /// The program as a choice over every class.
    pub fn choice(&self) -> Choice {
        let mut choice = vec![NONE; self.classes as usize];
        for &(c, n) in &self.picks {
            choice[c as usize] = n;
        }
        choice
    }
}

#[derive(Clone, Debug)]
pub struct ExtractReport {
    pub stop: ExtractStop,
    /// Partial programs taken from the worklist and expanded (not pruned).
    pub expanded: usize,
    /// Programs taken from the worklist and walked: the expanded ones, the complete ones and
    /// those the checks after the walk prune.
    pub walked: usize,
    /// Complete candidates constructed.
    pub complete: usize,
    /// Complete programs rejected for having no kernel launch order.
    pub rejected: usize,
    /// Partial programs pruned because no completion has a launch order, and complete ones
    /// refused by the same test before they are rebuilt (see `launch_order_impossible`).
    pub no_launch_order: usize,
    /// Partial or complete programs pruned for needing more than `max_kernels` kernels.
    pub over_kernels: usize,
    /// Partial or complete programs pruned for recomputing a value they also store (see
    /// `computed_once`).
    pub recomputed: usize,
    /// Partial or complete programs pruned for a pointwise kernel (with
    /// `Extractor::no_pointwise_kernels`; see `has_pointwise_kernel`).
    pub pointwise_kernels: usize,
    /// Classes resolved by unit propagation (one e-node, so one way) in the state that made
    /// them reachable, instead of by an expansion of their own.
    pub forced: usize,
    /// Partial or complete programs pruned for a tuple reduction with a component no
    /// completion reads (see `dead_component`).
    pub dead_components: usize,
    /// Partial programs pruned as ≈ₚ one already taken (early compaction only).
    pub equivalent: usize,
    /// Complete programs the backend refused to lower (see `Extractor::lowerable`).
    pub not_lowerable: usize,
    /// The backend's reason for the first refusal.
    pub first_refusal: Option<String>,
    /// Distinct candidates (classes of ≈) among the complete ones.
    pub distinct: usize,
    pub seconds: f64,
    /// The output, in discovery order.
    pub candidates: Vec<Candidate>,
}

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
    reach: Vec<Vec<u64>>,
    /// Per class, the classes with a valid e-node that reads it, each once.
    parents: Vec<Vec<u32>>,
    /// Per class, the classes of its cheapest program (its e-node of least cheapest cost,
    /// and theirs below it), itself included, as bitsets: a hole's share of the search's
    /// priority (see `hole_estimate`).
    cheapest: Vec<Vec<u64>>,
    /// Classes whose value is known at compile time (built from fill/constant/iota only).
    constant: Vec<bool>,
    /// Classes holding an input.
    input: Vec<bool>,
    /// Each valid e-node's own cost, its children not included (except the recomputation a
    /// replica of a computed tile implies, estimated from the child's cheapest cost).
    pick_cost: Vec<Vec<u64>>,
    /// Facts of each class's type that canonical forms and validity checks consult.
    info: Vec<KeyInfo>,
    /// Per class, the valid view e-nodes (`partition`, `replicate`) that read it: (class,
    /// e-node index).
    view_users: Vec<Vec<(u32, u32)>>,
    /// Per tuple-typed class, who can read its components (see `dead_component`).
    components: Vec<Option<ComponentReaders>>,
    /// Per class, the `get[i](t)` e-nodes it holds: (tuple class t, i, e-node index).
    gets_held: Vec<Vec<(u32, usize, u32)>>,
    /// Per tiled class, whether some completion computes a reduction or a matrix product in
    /// its tile computation (down to its loads); per untiled class, whether every e-node is
    /// a pointwise kernel whatever the picks below it: see `has_pointwise_kernel`.
    heavy_tile: Vec<bool>,
    pointwise_only: Vec<bool>,
    /// Per class, the e-nodes early compaction branches on: all but the operand swaps of an
    /// earlier e-node (`b * a` after `a * b`, both in the e-graph by commutativity). A swap's
    /// program is ≈ₚ the original's — the same canonical form and hole context, the same
    /// validity — so its branch is pruned before it is pushed, and a class whose e-nodes are
    /// one and its swap is resolved by unit propagation.
    unswapped: Vec<Vec<u32>>,
}

/// How a program can read the components of a tuple-typed class: whole (it is a result, or
/// some e-node other than `get` takes it), or component `i` through the one e-node
/// `get[i](t)` of the e-graph: (class, e-node index), `None` where no valid e-node reads it.
struct ComponentReaders {
    whole: bool,
    gets: Vec<Option<(u32, u32)>>,
}

impl<'a> ExtractGraph<'a> {
    /// Keeps the e-nodes of a lowerable program: no tensor-level `matmul`, and only e-nodes
    /// all of whose children have some finite acyclic lowerable term. Fails when a result has
    /// none.
    pub fn new(g: &'a TypedEGraph) -> Result<ExtractGraph<'a>, String> {
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
        // Values without one keep their default tiling.
        for (c, ns) in nodes.iter_mut().enumerate() {
            let untiled = !tiled(eg[ids[c]].data.as_ref());
            if untiled && ns.iter().any(|(n, _)| matches!(n.op, Op::Combination(..))) {
                ns.retain(|(n, _)| !is_compute(&n.op));
            }
        }
        // A combination whose result is still tiled is computed inside one kernel, which then
        // spans the combined dimension in one block: the same kernel as the program that never
        // split that dimension. Where the class has another implementation (after saturation,
        // the unsplit one), such splits are no candidates of their own; a hand-tiled program
        // whose only form combines inside a kernel keeps it.
        for (c, ns) in nodes.iter_mut().enumerate() {
            let in_kernel = |n: &ENode| matches!(n.op, Op::Combination(..));
            if tiled(eg[ids[c]].data.as_ref()) && ns.iter().any(|(n, _)| !in_kernel(n)) {
                ns.retain(|(n, _)| !in_kernel(n));
            }
        }
        // Classes with a finite term, bottom-up from the leaves.
        let operands: Vec<Vec<Vec<usize>>> = nodes
            .iter()
            .map(|ns| {
                ns.iter()
                    .map(|(_, k)| k.iter().map(|k| *k as usize).collect())
                    .collect()
            })
            .collect();
        let finite = super::finite::bottom_up(&operands).finite;
        for ns in &mut nodes {
            ns.retain(|(_, k)| k.iter().all(|k| finite[*k as usize]));
        }
        // Exploration order (it decides which candidates come first when a limit stops the
        // search, never which exist): cheapest first by an estimate of the work a candidate
        // does (see `node_cost`).
        // Constant classes (computable from fill/constant/iota alone) cost nothing at run time.
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
                break;
            }
        }
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
            return Err(format!(
                "result e-class %{} has no lowerable program (every term uses a tensor-level matmul or a cycle)",
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
                        (light(&n.op) && is_compute(&n.op))
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

    fn op(&self, c: u32, choice: &Choice) -> Option<&(ENode, Vec<u32>)> {
        let n = choice[c as usize];
        (n != NONE).then(|| &self.nodes[c as usize][n as usize])
    }
}

/// Nominal coordinate count of a parallel axis (the real one is a schedule choice).
const AXIS_COUNT: f64 = 4.0;
/// Cost of one element moved through global memory, relative to one operation.
const MEMORY: f64 = 4.0;
/// Cost of a kernel launch.
const LAUNCH: f64 = 1.0e4;

fn extent(d: &crate::ir::Dim, bindings: &[crate::ir::Binding]) -> f64 {
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
fn volume(t: Option<&Type>, bindings: &[crate::ir::Binding]) -> f64 {
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

/// Estimated work of one e-node, for the exploration order only: operations over all parallel
/// coordinates, elements moved through global memory (loads, stores, and the operands and
/// result of a tensor-level operator) and a launch per kernel. A `replicate` of a computed
/// tile costs its volume: every replica recomputes it. Both estimates favour the candidates a
/// user wants first — fused kernels that compute each value once.
fn node_cost(
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
fn picked_cost(x: &ExtractGraph, choice: &Choice, met: &[u32]) -> u64 {
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
fn hole_estimate(x: &ExtractGraph, choice: &Choice, union: &[u64]) -> u64 {
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
fn cheapest_pick(x: &ExtractGraph, c: u32) -> u64 {
    x.pick_cost[c as usize].first().copied().unwrap_or(0)
}

/// Adds the cheapest program of class `c` to `union`.
fn add_cheapest(x: &ExtractGraph, union: &mut [u64], c: u32) {
    for (w, b) in union.iter_mut().zip(&x.cheapest[c as usize]) {
        *w |= b;
    }
}

/// Transitive closure of the valid-node child relation, one bitset per class.
fn reachability(nodes: &[Vec<(ENode, Vec<u32>)>]) -> Vec<Vec<u64>> {
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

/// A canonical term: holes by class, commutative operands sorted, view chains as sets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Hole(u32),
    Node(Op, Vec<u32>),
    /// A value under a chain of `partition`/`replicate` views, in canonical order.
    Views(u32, Vec<Op>),
    /// A value under a chain of `combination`s, in canonical order.
    Combinations(u32, Vec<Op>),
    /// A pointwise operator a kernel applied to a tile before storing it, written over the
    /// stored value: `combination(f(t))` as `f` of `combination(t)`. A kernel that loads it
    /// computes `f` itself (`views`), so where a kernel boundary cuts a pointwise chain is
    /// not part of the form; anywhere else it stays apart from the tensor-level `f`, which
    /// is a kernel of its own.
    Epilogue(Op, Vec<u32>),
}

fn commutative(op: &Op) -> bool {
    matches!(
        op,
        Op::Binary(
            BinaryOp::Add
                | BinaryOp::Multiply
                | BinaryOp::Maximum
                | BinaryOp::Minimum
                | BinaryOp::Equal
                | BinaryOp::NotEqual
                | BinaryOp::And
                | BinaryOp::Or
        )
    )
}

/// True when `b` is `a` with the operands of a commutative operator swapped.
fn operand_swap((a, a_kids): &(ENode, Vec<u32>), (b, b_kids): &(ENode, Vec<u32>)) -> bool {
    commutative(&a.op)
        && a.op == b.op
        && a_kids.len() == 2
        && b_kids.len() == 2
        && a_kids[0] == b_kids[1]
        && a_kids[1] == b_kids[0]
}

/// Operators that compute (as opposed to leaves, views, stores and tuple plumbing).
fn is_compute(op: &Op) -> bool {
    !matches!(
        op,
        Op::Input(..)
            | Op::Constant(..)
            | Op::Fill(..)
            | Op::Iota(..)
            | Op::Partition(..)
            | Op::Replicate(_)
            | Op::Combination(..)
            | Op::Collection(_)
            | Op::Tuple
            | Op::Get(_)
    )
}

fn is_view(op: &Op) -> bool {
    matches!(op, Op::Partition(..) | Op::Replicate(_))
}

/// Canonical order of a chain of views: replicates (by axis) before partitions; partitions by
/// dimension, keeping the written order of partitions of the same dimension (nested tilings
/// of one dimension do not commute).
fn view_rank(op: &Op) -> (u8, usize, &'static str) {
    match op {
        Op::Replicate(a) => (0, 0, a.as_str()),
        Op::Partition(d, _) => (1, *d, ""),
        Op::Combination(d, _) => (2, *d, ""),
        _ => (3, 0, ""),
    }
}

/// What normalisation needs to know of a canonical term: facts of its type. They are part of
/// a form's identity (`Interner::table`), so equal forms share them by construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct KeyInfo {
    /// Has a parallel state: computed inside a kernel (or a view of a load).
    tiled: bool,
    /// A rank-0 value without parallel state (a literal), which broadcasts to any tile.
    literal: bool,
    rank: usize,
    /// The element type of a tensor: an epilogue moves across a store only when it leaves
    /// the stored bytes alike.
    dtype: Option<DType>,
}

/// Exact interning of canonical terms: equal ids ⇔ equal canonical forms.
#[derive(Default)]
struct Interner {
    /// Ids by the hash of (key, facts); each key is stored once, in `keys`. Keyed with the
    /// facts too: a collection fold gives `reduce … parallel=` a tiled result where the
    /// operator itself may store it, and the two must not share a form (which one was
    /// interned first decided how replicas sank through it).
    /// (hash, id): the hash kept so that growing the table rehashes no key.
    table: hashbrown::HashTable<(u64, u32)>,
    keys: Vec<Key>,
    info: Vec<KeyInfo>,
    /// Keep a fold over a stored collection (one outside any kernel, read back by every
    /// tile) in its own form instead of that of `reduce … parallel=`: the finer relation
    /// early compaction prunes by (see `Extractor::run`).
    keep_stored_folds: bool,
    /// The walk's shortcut to `table`: a class's canonical id by what decides it.
    steps: StepMemo,
    /// Per class, the id of its hole (`NONE` until first met): every walk names each of its
    /// holes, and a hole's key is a function of its class alone.
    holes: Vec<u32>,
}

/// Canonical ids of walk steps. A class's canonical id is a function of its pick and the
/// canonical ids of its operands (or, for a chain of views or combinations, of the picks
/// along the chain and the id of its base): interning is a function of operand ids. Each
/// step is recorded under those u32s, so the next partial program that shares it — most of
/// a program is shared with its parent — finds the id without building, normalising and
/// hashing its key again.
#[derive(Default)]
struct StepMemo {
    /// Each step with its canonical id.
    steps: SliceTable,
    /// Per class (a step's first u32), the entry it was last looked up or recorded under:
    /// consecutive partial programs share most steps, and comparing with the last one is
    /// cheaper than hashing.
    last: Vec<Option<SliceEntry>>,
}

impl StepMemo {
    fn get(&mut self, step: &[u32]) -> Option<u32> {
        let c = step[0] as usize;
        let last = self.last.get(c).copied().flatten();
        if let Some(entry) = last.filter(|e| self.steps.slice(e) == step) {
            return Some(entry.value);
        }
        let entry = self.steps.find(step)?;
        self.remember(c, entry);
        Some(entry.value)
    }

    fn insert(&mut self, step: &[u32], id: u32) {
        let entry = self.steps.insert(step, id);
        self.remember(step[0] as usize, entry);
    }

    fn remember(&mut self, c: usize, entry: SliceEntry) {
        if c >= self.last.len() {
            self.last.resize(c + 1, None);
        }
        self.last[c] = Some(entry);
    }
}

/// Slices of u32s stored end to end in one arena, each with a u32 value, found by hash: the
/// walk's steps (`StepMemo`) and early compaction's seen-set, which hold millions of short
/// keys that would otherwise be a heap block each.
#[derive(Default)]
struct SliceTable {
    table: hashbrown::HashTable<SliceEntry>,
    arena: Vec<u32>,
}

#[derive(Clone, Copy)]
struct SliceEntry {
    /// The slice's hash, kept so that growing the table rehashes nothing.
    hash: u64,
    start: usize,
    len: u32,
    value: u32,
}

impl SliceTable {
    /// Its arena and table for `GrowthWatch` (a table's buckets also carry a control byte).
    fn tables(&self, out: &mut Vec<(usize, usize, usize)>) {
        out.push((self.arena.len(), self.arena.capacity(), 4));
        let entry = std::mem::size_of::<SliceEntry>() + 1;
        out.push((self.table.len(), self.table.capacity(), entry));
    }

    fn hash(key: &[u32]) -> u64 {
        use std::hash::BuildHasher;
        rustc_hash::FxBuildHasher.hash_one(key)
    }

    fn slice(&self, e: &SliceEntry) -> &[u32] {
        &self.arena[e.start..e.start + e.len as usize]
    }

    fn find(&self, key: &[u32]) -> Option<SliceEntry> {
        self.find_hashed(key, Self::hash(key))
    }

    /// `find`, given the key's `hash`.
    fn find_hashed(&self, key: &[u32], hash: u64) -> Option<SliceEntry> {
        self.table
            .find(hash, |e| e.hash == hash && self.slice(e) == key)
            .copied()
    }

    /// Records a key not in the table.
    fn insert(&mut self, key: &[u32], value: u32) -> SliceEntry {
        self.insert_hashed(key, Self::hash(key), value)
    }

    /// `insert`, given the key's `hash`.
    fn insert_hashed(&mut self, key: &[u32], hash: u64, value: u32) -> SliceEntry {
        let entry = SliceEntry {
            hash,
            start: self.arena.len(),
            len: key.len() as u32,
            value,
        };
        self.arena.extend_from_slice(key);
        self.table.insert_unique(entry.hash, entry, |e| e.hash);
        entry
    }
}

impl Interner {
    /// Its tables for `GrowthWatch`, the step memo's included.
    fn tables(&self, out: &mut Vec<(usize, usize, usize)>) {
        let key = std::mem::size_of::<Key>();
        out.push((self.keys.len(), self.keys.capacity(), key));
        let info = std::mem::size_of::<KeyInfo>();
        out.push((self.info.len(), self.info.capacity(), info));
        // (hash, id) and a control byte per bucket.
        out.push((self.table.len(), self.table.capacity(), 17));
        self.steps.steps.tables(out);
    }

    fn intern(&mut self, k: Key, info: KeyInfo) -> u32 {
        fn hash(k: &Key, info: KeyInfo) -> u64 {
            use std::hash::BuildHasher;
            rustc_hash::FxBuildHasher.hash_one((k, info))
        }
        let Interner {
            table,
            keys,
            info: infos,
            ..
        } = self;
        let h = hash(&k, info);
        let same = |&(_, id): &(u64, u32)| infos[id as usize] == info && keys[id as usize] == k;
        if let Some((_, id)) = table.find(h, same) {
            return *id;
        }
        let id = keys.len() as u32;
        keys.push(k);
        infos.push(info);
        table.insert_unique(h, (h, id), |e| e.0);
        id
    }

    fn key(&self, id: u32) -> Option<&Key> {
        self.keys.get(id as usize)
    }

    fn info(&self, id: u32) -> KeyInfo {
        self.info[id as usize]
    }

    /// An operator computed inside a kernel that replicas pass through (`replicate[n](f(x))`
    /// is `f(replicate[n](x))` for the replicated `axes`): `(op, operands)`.
    fn replica_transparent(&self, id: u32, axes: &[&Sym]) -> Option<(&Op, &[u32])> {
        match self.key(id) {
            Some(Key::Node(op, ks)) if self.info(id).tiled => {
                let transparent = match op {
                    Op::ReduceParallel { axis, .. } => !axes.contains(&axis),
                    op => {
                        is_pointwise(op)
                            || matches!(
                                op,
                                Op::ReduceAxis { .. } | Op::TileMatMul(_) | Op::Tuple | Op::Get(_)
                            )
                    }
                };
                transparent.then_some((op, ks.as_slice()))
            }
            _ => None,
        }
    }

    fn node(&mut self, op: Op, mut ks: Vec<u32>, info: KeyInfo) -> u32 {
        if is_pointwise(&op) {
            // A literal broadcasts to any tile: its replicas are the literal.
            for k in &mut ks {
                if let Some(Key::Views(b, chain)) = self.key(*k) {
                    if self.info(*b).literal && chain.iter().all(|v| matches!(v, Op::Replicate(_)))
                    {
                        *k = *b;
                    }
                }
            }
        }
        if commutative(&op) {
            // Inside a kernel, a chain of one associative operator is one operation over a
            // multiset of operands: `(a * b) * c` and `a * (c * b)` compute alike.
            if associative(&op) && info.tiled {
                let mut flat = Vec::with_capacity(ks.len());
                for k in ks {
                    match self.key(k) {
                        Some(Key::Node(inner, kk))
                            if chain_link(&op, info.tiled, inner, self.info(k).tiled) =>
                        {
                            flat.extend(kk.iter().copied())
                        }
                        _ => flat.push(k),
                    }
                }
                ks = flat;
            }
            ks.sort();
        }
        self.intern(Key::Node(op, ks), info)
    }

    /// `chain` (innermost first) applied to `base`, in normal form: nested chains merged and
    /// sorted, and replicas sunk through operators computed in the kernel (pointwise, tile
    /// reductions and products, folds over other axes, tuples) down to their operands —
    /// `replicate[n](f(x))` and `f(replicate[n](x))` are the same tile computation, the second
    /// one written per coordinate of `n`.
    fn views(&mut self, mut base: u32, mut chain: Vec<Op>) -> u32 {
        if chain.is_empty() {
            return base;
        }
        // Views of views: one chain, normalised as a whole (replicas added later may sink
        // where the earlier ones could not).
        if let Some(Key::Views(b, inner)) = self.key(base) {
            let mut all = inner.clone();
            all.extend(chain);
            chain = all;
            base = *b;
        }
        let info = self.info(base);
        if let Some(Key::Epilogue(op, ks)) = self.key(base) {
            // A loaded epilogue is computed by the loading kernel, on the loaded tiles.
            let (op, ks) = (op.clone(), ks.clone());
            let kids = self.operand_views(&ks, &chain);
            let tile = KeyInfo {
                tiled: true,
                literal: false,
                ..info
            };
            return self.node(op, kids, tile);
        }
        if replica_axes(&chain).len() == chain.len() {
            // The replicas the base lets through sink to its operands and the others stay
            // around it, each judged alone: a fold over `a` lets all but those along `a`
            // through, and the form must not depend on how the replicas were grouped.
            let (pass, stay): (Vec<Op>, Vec<Op>) = chain.iter().cloned().partition(
                |r| matches!(r, Op::Replicate(a) if self.replica_transparent(base, &[a]).is_some()),
            );
            let axes = replica_axes(&pass);
            if let Some((op, ks)) = self
                .replica_transparent(base, &axes)
                .filter(|_| !axes.is_empty())
            {
                let (op, ks) = (op.clone(), ks.to_vec());
                let kids = self.operand_views(&ks, &pass);
                let sunk = self.node(op, kids, info);
                return self.views(sunk, stay);
            }
        }
        let chain = normal_views(chain);
        if chain.is_empty() {
            return base;
        }
        let info = KeyInfo {
            tiled: true,
            literal: false,
            ..info
        };
        self.intern(Key::Views(base, chain), info)
    }

    /// `chain` applied to each operand of an operator moved inside the views, but literals,
    /// which broadcast to any tile as they are.
    fn operand_views(&mut self, ks: &[u32], chain: &[Op]) -> Vec<u32> {
        ks.iter()
            .map(|k| {
                if self.info(*k).literal {
                    *k
                } else {
                    self.views(*k, chain.to_vec())
                }
            })
            .collect()
    }

    /// `chain` of combinations (innermost first) applied to `base`, in normal form: nested
    /// chains merged and sorted. (Cancelling `combination[d,a](f(partition[d,a](x)))` against
    /// `f(x)` inside a kernel was tried: it made the canonical form depend on more than the
    /// forms of a program's parts, and early compaction then lost classes.)
    fn combinations(&mut self, mut base: u32, mut chain: Vec<Op>, info: KeyInfo) -> u32 {
        if let Some(Key::Combinations(b, inner)) = self.key(base) {
            let mut all = inner.clone();
            all.extend(chain);
            chain = all;
            base = *b;
        }
        chain.sort_by_key(view_rank);
        if chain.is_empty() {
            return base;
        }
        if !info.tiled {
            if let Some(id) = self.epilogue(base, &chain, info) {
                return id;
            }
        }
        self.intern(Key::Combinations(base, chain), info)
    }

    /// A store (`chain` combining `base` into a value without parallel state) of a pointwise
    /// operator on one tile and literals that keeps the tile's element type and rank: the
    /// operator as an `Epilogue` over the stored tile.
    fn epilogue(&mut self, base: u32, chain: &[Op], info: KeyInfo) -> Option<u32> {
        let Some(Key::Node(op, ks)) = self.key(base) else {
            return None;
        };
        if !is_pointwise(op) || matches!(op, Op::Cast(_)) || !self.info(base).tiled {
            return None;
        }
        let mut tiles = ks.iter().filter(|k| !self.info(**k).literal);
        let tile = *tiles.next()?;
        let t = self.info(tile);
        if tiles.next().is_some() || t.dtype != info.dtype || t.rank != info.rank || !t.tiled {
            return None;
        }
        let (op, mut ks) = (op.clone(), ks.clone());
        let stored = self.combinations(tile, chain.to_vec(), info);
        for k in &mut ks {
            if *k == tile {
                *k = stored;
            }
        }
        if commutative(&op) {
            ks.sort();
        }
        Some(self.intern(Key::Epilogue(op, ks), info))
    }

    /// `reduce (collection[a](x)) axis=0` inside a kernel (or its all-reduce form
    /// `reduce (replicate[a](collection[a](x))) axis=0`, or with other replicas) is a fold
    /// over `a` that the kernel computes as a loop over `a`, as it does
    /// `reduce x parallel=a`: the same form.
    fn collection_fold(&mut self, op: &Op, ks: &[u32], info: KeyInfo) -> Option<u32> {
        let Op::ReduceAxis {
            dim: 0,
            reducer,
            keep_dims: false,
        } = op
        else {
            return None;
        };
        if !info.tiled || ks.len() != 1 {
            return None;
        }
        // Replicas of the stack pass through the reduction (it is computed in the kernel), so
        // any chain of them, with `a` or not, ends up around the fold.
        let (stack, replicas) = match self.key(ks[0])? {
            Key::Views(b, chain) if chain.iter().all(|v| matches!(v, Op::Replicate(_))) => {
                (*b, chain.clone())
            }
            Key::Views(..) => return None,
            _ => (ks[0], Vec::new()),
        };
        let Some(Key::Node(Op::Collection(a), xs)) = self.key(stack) else {
            return None;
        };
        if self.keep_stored_folds && !self.info(stack).tiled {
            return None;
        }
        let fold = Op::ReduceParallel {
            axis: *a,
            reducer: reducer.clone(),
        };
        let x = *xs.first()?;
        let folded = self.node(fold, vec![x], info);
        Some(self.views(folded, replicas))
    }

    /// When every operand but literals is combined by the same chain: the operands under it.
    fn common_combinations(&self, ks: &[u32]) -> Option<(Vec<u32>, Vec<Op>)> {
        let mut chain: Option<&Vec<Op>> = None;
        let mut bases = Vec::with_capacity(ks.len());
        for k in ks {
            if self.info(*k).literal {
                bases.push(*k);
                continue;
            }
            let Some(Key::Combinations(b, ch)) = self.key(*k) else {
                return None;
            };
            if chain.is_some_and(|c| c != ch) {
                return None;
            }
            chain = Some(ch);
            bases.push(*b);
        }
        chain.map(|c| (bases, c.clone()))
    }
}

/// A chain of views (innermost first) in normal form: its transposes composed into one,
/// applied to the base first (`transpose[p](partition[d,a](x))` is
/// `partition[i,a](transpose[p](x))` where `p[i] = d`), then the partitions and replicates
/// sorted by `view_rank`. Transposing a loaded tile is a way of writing its load.
fn normal_views(chain: Vec<Op>) -> Vec<Op> {
    let mut perm: Option<Vec<usize>> = None;
    let mut rest: Vec<Op> = Vec::with_capacity(chain.len());
    for op in chain {
        match op {
            Op::Transpose(p) => {
                for v in &mut rest {
                    if let Op::Partition(d, a) = v {
                        if let Some(i) = p.iter().position(|x| x == d) {
                            *v = Op::Partition(i, *a);
                        }
                    }
                }
                perm = Some(match perm {
                    None => p,
                    Some(t) => p.iter().map(|&i| t.get(i).copied().unwrap_or(i)).collect(),
                });
            }
            v => rest.push(v),
        }
    }
    rest.sort_by_key(view_rank);
    let identity = |p: &Vec<usize>| p.iter().enumerate().all(|(i, &x)| i == x);
    match perm.filter(|p| !identity(p)) {
        Some(p) => std::iter::once(Op::Transpose(p)).chain(rest).collect(),
        None => rest,
    }
}

/// The axes of the `replicate` views of `chain`.
fn replica_axes(chain: &[Op]) -> Vec<&Sym> {
    chain
        .iter()
        .filter_map(|op| match op {
            Op::Replicate(a) => Some(a),
            _ => None,
        })
        .collect()
}

/// Whether a `child_op` child flattens into its `op` parent's chain in the canonical form:
/// the same associative operator, both computed in a kernel.
fn chain_link(op: &Op, tiled: bool, child_op: &Op, child_tiled: bool) -> bool {
    associative(op) && tiled && child_op == op && child_tiled
}

fn associative(op: &Op) -> bool {
    matches!(
        op,
        Op::Binary(BinaryOp::Add | BinaryOp::Multiply | BinaryOp::Maximum | BinaryOp::Minimum)
    )
}

fn is_pointwise(op: &Op) -> bool {
    matches!(op, Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast(_))
}

/// A transpose inside a kernel, which the canonical form treats as part of a view chain.
fn tile_transpose(op: &Op, info: KeyInfo) -> bool {
    matches!(op, Op::Transpose(_)) && info.tiled
}

fn class_info(x: &ExtractGraph, c: u32) -> KeyInfo {
    x.info[c as usize]
}

fn type_info(ty: Option<&Type>) -> KeyInfo {
    match ty {
        Some(Type::Tensor(t)) => KeyInfo {
            tiled: !t.par.is_empty(),
            literal: t.shape.is_empty() && t.par.is_empty(),
            rank: t.shape.len(),
            dtype: Some(t.dtype),
        },
        _ => KeyInfo {
            tiled: tiled(ty),
            literal: false,
            rank: 0,
            dtype: None,
        },
    }
}

/// What a walk of a partial program found. Reused from one partial program to the next, so
/// the cost of a walk follows the program's size, not the e-graph's: only the entries the
/// last walk set are reset.
#[derive(Default)]
struct WalkFacts {
    /// Canonical id per class (`NONE`: not met, or a chain intermediate).
    memo: Vec<u32>,
    /// Every class the walk met, chain intermediates included (`memo` skips those).
    visited: Vec<bool>,
    /// The classes of `visited`, in the order the walk met them.
    met: Vec<u32>,
    /// Unresolved classes, in depth-first order.
    holes: Vec<u32>,
}

impl WalkFacts {
    fn reset(&mut self, classes: usize) {
        if self.memo.len() != classes {
            self.memo = vec![NONE; classes];
            self.visited = vec![false; classes];
        } else {
            for &c in &self.met {
                self.memo[c as usize] = NONE;
                self.visited[c as usize] = false;
            }
        }
        self.met.clear();
        self.holes.clear();
    }

    fn visit(&mut self, c: u32) {
        if !self.visited[c as usize] {
            self.visited[c as usize] = true;
            self.met.push(c);
        }
    }
}

/// Walks a partial program from its results: its canonical form and its holes, in
/// depth-first order.
struct Walk<'g, 'a, 'f> {
    x: &'g ExtractGraph<'a>,
    choice: &'g Choice,
    facts: &'f mut WalkFacts,
}

impl<'g, 'a, 'f> Walk<'g, 'a, 'f> {
    /// Walks `choice` from every result into `facts` (cleared first): the results'
    /// canonical ids.
    fn roots(
        x: &'g ExtractGraph<'a>,
        choice: &'g Choice,
        interner: &mut Interner,
        facts: &'f mut WalkFacts,
    ) -> Vec<u32> {
        facts.reset(x.ids.len());
        let mut walk = Walk { x, choice, facts };
        x.roots.iter().map(|r| walk.canon(*r, interner)).collect()
    }

    /// The canonical id of class `c` under the walk's picks. Normalisation only looks at the
    /// canonical forms of operands (never at which classes wrote them), so a partial program's
    /// form and the forms of its holes' completions decide the completed program's form: what
    /// early compaction's pruning needs.
    fn canon(&mut self, c: u32, interner: &mut Interner) -> u32 {
        if self.facts.memo[c as usize] != NONE {
            return self.facts.memo[c as usize];
        }
        self.facts.visit(c);
        let info = class_info(self.x, c);
        let Some((n, kids)) = self.x.op(c, self.choice) else {
            self.facts.holes.push(c);
            let cu = c as usize;
            if interner.holes.len() <= cu {
                interner.holes.resize(self.x.ids.len().max(cu + 1), NONE);
            }
            let id = match interner.holes[cu] {
                NONE => interner.intern(Key::Hole(c), info),
                id => id,
            };
            interner.holes[cu] = id;
            self.facts.memo[cu] = id;
            return id;
        };
        // What decides the class's id (see `StepMemo`): the class and its pick, then the
        // operands' ids, or the picks along a chain and the id of its base.
        let mut step: smallvec::SmallVec<[u32; 8]> =
            smallvec::smallvec![c, self.choice[c as usize]];
        let chain_kind = if is_view(&n.op) || tile_transpose(&n.op, info) {
            Some(false)
        } else {
            matches!(n.op, Op::Combination(..)).then_some(true)
        };
        let id = match chain_kind {
            Some(combos) => {
                let x = self.x;
                let same_kind = |op: &Op, class: u32| {
                    if combos {
                        matches!(op, Op::Combination(..))
                    } else {
                        is_view(op) || tile_transpose(op, class_info(x, class))
                    }
                };
                let mut cur = kids[0];
                while let Some((_, k)) = self
                    .x
                    .op(cur, self.choice)
                    .filter(|(m, _)| same_kind(&m.op, cur))
                {
                    self.facts.visit(cur);
                    step.extend([cur, self.choice[cur as usize]]);
                    cur = k[0];
                }
                let base = self.canon(cur, interner);
                step.push(base);
                if let Some(id) = interner.steps.get(&step) {
                    id
                } else {
                    // Written innermost first; the sorts are stable, so same-dimension order
                    // is kept.
                    let links = step[2..step.len() - 1].chunks(2);
                    let mut chain: Vec<Op> = links
                        .rev()
                        .filter_map(|l| self.x.op(l[0], self.choice).map(|(m, _)| m.op.clone()))
                        .collect();
                    chain.push(n.op.clone());
                    let id = if combos {
                        interner.combinations(base, chain, info)
                    } else {
                        interner.views(base, chain)
                    };
                    interner.steps.insert(&step, id);
                    id
                }
            }
            None => {
                let ks: smallvec::SmallVec<[u32; 4]> =
                    kids.iter().map(|k| self.canon(*k, interner)).collect();
                step.extend_from_slice(&ks);
                if let Some(id) = interner.steps.get(&step) {
                    id
                } else {
                    let id = canonical_node(&n.op, ks.to_vec(), info, interner);
                    interner.steps.insert(&step, id);
                    id
                }
            }
        };
        self.facts.memo[c as usize] = id;
        id
    }
}

/// The canonical form of candidate `choice` as text (holes as `□N`), comparable across runs:
/// two candidates are ≈ exactly when their canonical texts are equal.
pub fn canonical_text(x: &ExtractGraph, choice: &Choice) -> String {
    let mut interner = Interner::default();
    let roots = Walk::roots(x, choice, &mut interner, &mut WalkFacts::default());
    // Commutative operands in text order: interned ids depend on the order of interning,
    // which differs between interners, while the text does not.
    fn render(i: &Interner, id: u32, memo: &mut FxHashMap<u32, String>) -> String {
        if let Some(t) = memo.get(&id) {
            return t.clone();
        }
        let kids = |ks: &[u32], sort: bool, memo: &mut FxHashMap<u32, String>| {
            let mut texts: Vec<String> = ks.iter().map(|k| render(i, *k, memo)).collect();
            if sort {
                texts.sort();
            }
            format!("({})", texts.join(", "))
        };
        let text = match i.key(id) {
            Some(Key::Hole(c)) => format!("□{c}"),
            Some(Key::Node(op, ks)) => {
                let tiled = if i.info(id).tiled { "ᵗ" } else { "" };
                format!("{op:?}{tiled}{}", kids(ks, commutative(op), memo))
            }
            Some(Key::Epilogue(op, ks)) => {
                format!("{op:?}ᵉ{}", kids(ks, commutative(op), memo))
            }
            Some(Key::Views(b, ops)) | Some(Key::Combinations(b, ops)) => {
                format!("{ops:?}{}", kids(&[*b], false, memo))
            }
            None => "?".to_string(),
        };
        memo.insert(id, text.clone());
        text
    }
    let mut memo = FxHashMap::default();
    let mut out = String::new();
    for r in roots {
        out.push_str(&render(&interner, r, &mut memo));
        out.push('\n');
    }
    out
}

/// The canonical id of `op` over operands with canonical ids `ks`.
fn canonical_node(op: &Op, ks: Vec<u32>, info: KeyInfo, interner: &mut Interner) -> u32 {
    if let Some(id) = interner.collection_fold(op, &ks, info) {
        return id;
    }
    // A pointwise operator on partly combined tiles (the result is still tiled, so in the
    // same kernel) is the operator on the tiles, combined: lift it inside the
    // combinations.
    let lifted = if is_pointwise(op) && info.tiled {
        interner.common_combinations(&ks)
    } else {
        None
    };
    match lifted {
        Some((bases, chain)) => {
            let inner = interner.node(op.clone(), bases, info);
            interner.combinations(inner, chain, info)
        }
        None => interner.node(op.clone(), ks, info),
    }
}

/// True when `from`, following picked e-nodes, reaches `target`. With `through_holes`, also
/// when a class not resolved yet could reach it through any of its e-nodes: whether some
/// completion makes `from` reach `target`.
fn reaches(
    x: &ExtractGraph,
    choice: &Choice,
    from: &[u32],
    target: u32,
    through_holes: bool,
    seen: &mut Marks,
) -> bool {
    let mut stack: Vec<u32> = from.to_vec();
    seen.clear();
    let t = target as usize;
    while let Some(c) = stack.pop() {
        if c == target {
            return true;
        }
        if !seen.mark(c) {
            continue;
        }
        match x.op(c, choice) {
            Some((_, kids)) => stack.extend(kids),
            None if through_holes && has(&x.reach[c as usize], t) => return true,
            None => {}
        }
    }
    false
}

/// A set of classes that empties in constant time: a class is in it when its mark is the
/// current generation.
struct Marks {
    generation: u32,
    marks: Vec<u32>,
}

impl Marks {
    fn new(classes: usize) -> Marks {
        Marks {
            generation: 1,
            marks: vec![0; classes],
        }
    }

    fn clear(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.marks.iter_mut().for_each(|m| *m = 0);
            self.generation = 1;
        }
    }

    /// Adds `c`; false when it was in the set already.
    fn mark(&mut self, c: u32) -> bool {
        std::mem::replace(&mut self.marks[c as usize], self.generation) != self.generation
    }

    fn contains(&self, c: u32) -> bool {
        self.marks[c as usize] == self.generation
    }
}

fn class_tiled(x: &ExtractGraph, c: u32) -> bool {
    x.info[c as usize].tiled
}

/// Whether `c` is a load: a tensor-level value, or views of one. `None` while a hole decides.
fn loadable(x: &ExtractGraph, choice: &Choice, mut c: u32) -> Option<bool> {
    loop {
        if !class_tiled(x, c) {
            return Some(true);
        }
        let (n, kids) = x.op(c, choice)?;
        if !is_view(&n.op) {
            return Some(false);
        }
        c = kids[0];
    }
}

/// The classes a completion of a partial program may still resolve, as a bitset over classes:
/// those reached from its holes through the e-nodes of unresolved classes (a resolved class
/// keeps its pick, so a completion reaches nothing new through it).
fn open_reach(
    x: &ExtractGraph,
    choice: &Choice,
    holes: &[u32],
    open: &mut Vec<u64>,
    stack: &mut Vec<u32>,
) {
    open.clear();
    open.resize(x.ids.len().div_ceil(64), 0);
    stack.clear();
    stack.extend_from_slice(holes);
    while let Some(c) = stack.pop() {
        let cu = c as usize;
        if choice[cu] != NONE || !add(open, cu) {
            continue;
        }
        for (_, kids) in &x.nodes[cu] {
            stack.extend(kids.iter().filter(|k| !has(open, **k as usize)));
        }
    }
}

/// Whether class `c` is in a bitset over classes.
fn has(set: &[u64], c: usize) -> bool {
    set[c / 64] >> (c % 64) & 1 == 1
}

/// Adds class `c` to a bitset over classes: whether it was not in it.
fn add(set: &mut [u64], c: usize) -> bool {
    let new = !has(set, c);
    set[c / 64] |= 1 << (c % 64);
    new
}

/// The classes in a bitset over classes, in increasing order.
fn members(set: &[u64]) -> impl Iterator<Item = usize> + '_ {
    set.iter().enumerate().flat_map(|(w, &word)| {
        let mut bits = word;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let c = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                c
            })
        })
    })
}

/// The resolved classes a completion of a partial program can read, as a bitset over classes:
/// the resolved operands of the e-nodes of the classes it may still resolve (`open`, from
/// `open_reach`), and, through a resolved class with one e-node, its resolved operands too
/// (see `hole_context` for why). A completion picks e-nodes for open classes only, so every
/// resolved class it reads is one of these; one deeper down is read only through the picks the
/// program already made.
fn readable_resolved(
    x: &ExtractGraph,
    choice: &Choice,
    open: &[u64],
    readable: &mut Vec<u64>,
    stack: &mut Vec<u32>,
) {
    readable.clear();
    readable.resize(open.len(), 0);
    stack.clear();
    for c in members(open) {
        stack.extend(x.nodes[c].iter().flat_map(|(_, kids)| kids));
    }
    while let Some(k) = stack.pop() {
        let ku = k as usize;
        if choice[ku] == NONE || !add(readable, ku) {
            continue;
        }
        if let [(_, kids)] = x.nodes[ku].as_slice() {
            stack.extend(kids);
        }
    }
}

/// A tuple reduction picked in the program one of whose components no completion reads:
/// the class holding `get[i](t)` picked another e-node, or no e-node reads it. Product fusion
/// would compute that component for nothing, which `no_dead_components` refuses in every
/// completion; found here, the branch ends before its holes are resolved. A class that holds
/// `get[i](t)` but is not in the program and that no hole reaches (`hole_reach`, a bitset
/// over classes) never will be: no completion reads that component either. (A component that
/// a repair-fused reduction only carries for the next, its first, needs no reader.)
fn dead_component(x: &ExtractGraph, choice: &Choice, met: &[u32], hole_reach: &[u64]) -> bool {
    let unreached = |b: u32| {
        let b = b as usize;
        hole_reach
            .get(b / 64)
            .is_some_and(|w| w >> (b % 64) & 1 == 0)
    };
    met.iter()
        .any(|&t| leaves_component_dead(x, choice, t, unreached))
}

/// Whether class `t`, as picked, is a fused reduction one of whose needed components no
/// completion reads: the class holding its `get` picked another e-node, or is unresolved and
/// `unreached` (no hole can resolve it), or no e-node reads it at all.
fn leaves_component_dead(
    x: &ExtractGraph,
    choice: &Choice,
    t: u32,
    mut unreached: impl FnMut(u32) -> bool,
) -> bool {
    let Some((readers, first)) = readers_needed(x, choice, t) else {
        return false;
    };
    readers.gets.iter().skip(first).any(|g| match g {
        None => true,
        Some((b, j)) => match choice[*b as usize] {
            NONE => unreached(*b),
            picked => picked != *j,
        },
    })
}

/// Whether no completion of a program can resolve the unresolved class `b`: no hole reaches
/// it through unresolved classes (`open_reach`'s relation, searched backwards from `b`).
/// `is_hole` says which classes are holes. `within` (a bitset over classes) holds every
/// unresolved class a hole reaches, or more: an earlier program's `open_reach`, which picks
/// since then only shrink. The search stays inside it, which on a large e-graph keeps it off
/// the many classes outside the program.
fn unreachable_from_holes(
    x: &ExtractGraph,
    choice: &Choice,
    b: u32,
    is_hole: impl Fn(u32) -> bool,
    within: &[u64],
    marks: &mut Marks,
    stack: &mut Vec<u32>,
) -> bool {
    let inside = |c: u32| has(within, c as usize);
    if is_hole(b) {
        return false;
    }
    if !inside(b) {
        return true;
    }
    marks.clear();
    marks.mark(b);
    stack.clear();
    stack.push(b);
    while let Some(c) = stack.pop() {
        for &p in &x.parents[c as usize] {
            if choice[p as usize] != NONE || !inside(p) || !marks.mark(p) {
                continue;
            }
            if is_hole(p) {
                return false;
            }
            stack.push(p);
        }
    }
    true
}

/// `leaves_component_dead` judged before the push: a needed component's unresolved `get`
/// class is dead when no hole reaches it (`unreachable_from_holes`).
fn leaves_component_unreachable(
    x: &ExtractGraph,
    choice: &Choice,
    t: u32,
    is_hole: impl Fn(u32) -> bool,
    within: &[u64],
    marks: &mut Marks,
    stack: &mut Vec<u32>,
) -> bool {
    leaves_component_dead(x, choice, t, |b| {
        unreachable_from_holes(x, choice, b, &is_hole, within, marks, stack)
    })
}

/// Adds to `out` the unresolved classes holding the `get` of a component that a fused
/// reduction among `met` needs read.
fn unread_components(x: &ExtractGraph, choice: &Choice, met: &[u32], out: &mut Vec<u32>) {
    for &t in met {
        if let Some((readers, first)) = readers_needed(x, choice, t) {
            out.extend(
                readers
                    .gets
                    .iter()
                    .skip(first)
                    .flatten()
                    .map(|(b, _)| *b)
                    .filter(|b| choice[*b as usize] == NONE),
            );
        }
    }
}

/// For a tuple-typed class `t` picked as a reduction and not read whole, its component
/// readers and the first component that needs one (`dead_component`).
fn readers_needed<'x>(
    x: &'x ExtractGraph,
    choice: &Choice,
    t: u32,
) -> Option<(&'x ComponentReaders, usize)> {
    let readers = x.components[t as usize].as_ref().filter(|r| !r.whole)?;
    let reducer = match x.op(t, choice) {
        Some((
            ENode {
                op: Op::ReduceAxis { reducer, .. } | Op::ReduceParallel { reducer, .. },
                ..
            },
            _,
        )) => reducer,
        _ => return None,
    };
    let first = usize::from(!independent(reducer, &x.g.egraph.analysis.env));
    Some((readers, first))
}

/// Whether the tuple-typed class `t`, as picked, is a reduction whose component `i` some
/// `get[i](t)` must read (`dead_component`).
fn component_needs_reader(x: &ExtractGraph, choice: &Choice, t: u32, i: usize) -> bool {
    readers_needed(x, choice, t).is_some_and(|(r, first)| i >= first && i < r.gets.len())
}

/// The e-node class `b` must pick, if any, for the program not to have a dead component: the
/// `get[i](t)` of a picked tuple reduction `t` whose component `i` needs a reader (the one
/// e-node of the e-graph that reads it). `Err` when two such e-nodes are required.
fn required_get(x: &ExtractGraph, choice: &Choice, b: u32) -> Option<Result<u32, ()>> {
    let mut required = None;
    for &(t, i, j) in &x.gets_held[b as usize] {
        if choice[t as usize] == NONE || !component_needs_reader(x, choice, t, i) {
            continue;
        }
        match required {
            Some(r) if r != j => return Some(Err(())),
            _ => required = Some(j),
        }
    }
    required.map(Ok)
}

/// A reducer over a tuple whose components fold independently (a product of reducers), so
/// that every component is a result of its own.
fn independent(reducer: &crate::ir::ReducerRef, env: &crate::passes::typing::TypeEnv) -> bool {
    match reducer {
        crate::ir::ReducerRef::User(name) => env
            .reducer(name.as_str())
            .is_some_and(|def| def.as_product().is_some()),
        crate::ir::ReducerRef::Builtin(_) => false,
    }
}

/// No dead fused results. A tuple-valued reduction is used whole, or each of its components
/// is read by some `get` — except the first component of a reduction that is not a product of
/// independent folds (a repair's running statistic, which the other components' updates read).
/// The components of a product fusion are independent folds: one nobody reads is work done
/// for nothing, and the candidate that does not fuse it is in the e-graph too (product fusion
/// puts each component in the class of its unfused reduction). Likewise a candidate that fuses
/// a value into a reduction and then computes it again elsewhere does the work twice. Judged
/// on the reconstructed program, where equal values are one node, so that ≈ candidates agree.
fn no_dead_components(f: &Function, env: &crate::passes::typing::TypeEnv) -> bool {
    let nodes = &f.body.nodes;
    let mut read: FxHashSet<(usize, usize)> = FxHashSet::default();
    let mut whole: FxHashSet<usize> = FxHashSet::default();
    for node in nodes {
        match &node.kind {
            ExprKind::Get(crate::ir::FieldRef::Index(i), t) => {
                read.insert((t.index(), *i));
            }
            k => whole.extend(k.operands().iter().map(|o| o.index())),
        }
    }
    whole.extend(f.body.results.iter().map(|r| r.index()));
    nodes
        .iter()
        .enumerate()
        .all(|(c, node)| match (&node.kind, &node.ty) {
            (ExprKind::Reduce { reducer, .. }, Some(Type::Tuple(ts))) => {
                let first = usize::from(!independent(reducer, env));
                whole.contains(&c) || (first..ts.len()).all(|i| read.contains(&(c, i)))
            }
            _ => true,
        })
}

/// Pointwise work or data movement; tuple plumbing is no computation at all (`is_compute`).
fn light(op: &Op) -> bool {
    is_pointwise(op) || matches!(op, Op::Transpose(_) | Op::Reshape(_) | Op::Broadcast(_))
}

/// Whether a partial program has a *pointwise kernel*: a kernel that only loads, applies
/// pointwise operators or moves data (transpose, reshape, broadcast) and stores a value that
/// is not a result — work its readers could do on their own loads. It is a tensor-level
/// pointwise operator (a kernel of its own by default tiling) or a stored tile computation
/// without a reduction or a matrix product. Judged on resolved classes, and on holes only
/// where every completion agrees (`pointwise_only`, `heavy_tile`): a tile computation that
/// reaches a hole which may still compute a reduction is not judged yet, so the verdict holds
/// for every completion. Moving a pointwise tail across a store keeps it (`Key::Epilogue`), so
/// ≈ programs share it.
fn has_pointwise_kernel(x: &ExtractGraph, choice: &Choice, met: &[u32], seen: &mut Marks) -> bool {
    for &c in met {
        let pick = choice[c as usize];
        if pick == NONE && x.pointwise_only[c as usize] {
            return true; // a value every e-node of which stores pointwise work
        }
        if pick == NONE || class_tiled(x, c) || x.constant[c as usize] || x.roots.contains(&c) {
            continue;
        }
        let (node, kids) = &x.nodes[c as usize][pick as usize];
        if light(&node.op) && is_compute(&node.op) {
            return true;
        }
        if !matches!(node.op, Op::Combination(..) | Op::Collection(_)) {
            continue;
        }
        // The stored tile computation, down to its loads.
        seen.clear();
        let mut stack: Vec<u32> = kids.to_vec();
        let mut only_light = true;
        while let Some(k) = stack.pop() {
            if !class_tiled(x, k) || !seen.mark(k) {
                continue; // a load's source, a literal, or met before
            }
            let pick = choice[k as usize];
            if pick == NONE && x.heavy_tile[k as usize] {
                only_light = false; // a hole decides
                break;
            }
            if pick == NONE {
                continue; // light however it is resolved
            }
            let (op, grandkids) = (
                &x.nodes[k as usize][pick as usize].0.op,
                &x.nodes[k as usize][pick as usize].1,
            );
            if is_compute(op) && !light(op) {
                only_light = false;
                break;
            }
            stack.extend(grandkids.iter().copied());
        }
        if only_light {
            return true;
        }
    }
    false
}

/// A lower bound on the kernels of any completion of a partial program: each picked
/// tensor-level operator on tensor-level operands is a kernel of its own (default tiling), a
/// tiled region is at least one more, and a computed tensor-level value read by another
/// operator was written by one kernel and read by another. Classes with one canonical form
/// (`memo`) are one node of the program, so they count once.
fn kernel_lower_bound(x: &ExtractGraph, choice: &Choice, met: &[u32], memo: &[u32]) -> usize {
    let (mut default_tiled, mut region, mut stored_read) = (FxHashSet::default(), false, false);
    for c in met.iter().map(|c| *c as usize) {
        if choice[c] == NONE {
            continue;
        }
        let (node, kids) = &x.nodes[c][choice[c] as usize];
        let computed = |k: u32| {
            let k = k as usize;
            !class_tiled(x, k as u32) && !x.constant[k] && !x.input[k]
        };
        if class_tiled(x, c as u32) {
            region = true;
        } else if is_compute(&node.op) && !x.constant[c] && kids.iter().all(|k| !class_tiled(x, *k))
        {
            default_tiled.insert(memo[c]);
        }
        if (is_compute(&node.op) || is_view(&node.op)) && kids.iter().any(|k| computed(*k)) {
            stored_read = true;
        }
    }
    let lb = default_tiled.len() + usize::from(region);
    if stored_read {
        lb.max(2)
    } else {
        lb
    }
}

/// How a program's resolved classes form kernels, as far as they decide it
/// (`launch_order_impossible`, `hole_context`).
struct KernelView<'p> {
    x: &'p ExtractGraph<'p>,
    choice: &'p Choice,
    visited: &'p [bool],
    /// `load` per class, for this program only: the region context and the launch-order
    /// test ask for the same chains many times over.
    loads: &'p Memo,
}

/// A u32 per slot, all forgotten at once in constant time (like `Marks`): a slot counts only
/// if it carries the current generation, in its upper half. Interior mutability lets a
/// memoised function read and write it through a shared view of the program.
struct Memo {
    generation: u32,
    slots: Vec<std::cell::Cell<u64>>,
}

impl Memo {
    fn new(len: usize) -> Memo {
        Memo {
            generation: 1,
            slots: vec![std::cell::Cell::new(0); len],
        }
    }

    /// Forgets every slot.
    fn clear(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            // The generations wrapped around: slots from long ago would count again.
            self.slots.iter().for_each(|s| s.set(0));
            self.generation = 1;
        }
    }

    fn get(&self, i: usize) -> Option<u32> {
        let s = self.slots[i].get();
        ((s >> 32) as u32 == self.generation).then_some(s as u32)
    }

    fn set(&self, i: usize, value: u32) {
        self.slots[i].set(u64::from(self.generation) << 32 | u64::from(value));
    }
}

/// What a picked class reads through views (`KernelView::load`).
#[derive(PartialEq)]
enum Load {
    /// Not a view chain: computed here.
    No,
    /// A load of this tensor-level value.
    From(u32),
    /// The chain meets a class not resolved yet.
    Unknown,
}

impl KernelView<'_> {
    fn picked(&self, c: u32) -> bool {
        self.visited[c as usize] && self.choice[c as usize] != NONE
    }

    fn op(&self, c: u32) -> &(ENode, Vec<u32>) {
        &self.x.nodes[c as usize][self.choice[c as usize] as usize]
    }

    /// A picked view chain down to a tensor-level value is a load of that value.
    fn load(&self, c: u32) -> Load {
        if let Some(code) = self.loads.get(c as usize) {
            return match code {
                0 => Load::No,
                1 => Load::Unknown,
                o => Load::From(o - 2),
            };
        }
        let load = self.load_uncached(c);
        let code = match load {
            Load::No => 0,
            Load::Unknown => 1,
            Load::From(o) => o + 2,
        };
        self.loads.set(c as usize, code);
        load
    }

    fn load_uncached(&self, mut c: u32) -> Load {
        loop {
            let (node, kids) = self.op(c);
            if !matches!(node.op, Op::Partition(..) | Op::Replicate(_)) {
                return Load::No;
            }
            let o = kids[0];
            if !class_tiled(self.x, o) {
                return Load::From(o);
            }
            if !self.picked(o) {
                return Load::Unknown;
            }
            c = o;
        }
    }

    /// A class that is some kernel's work: not a leaf, a constant, an input or a load.
    fn computed(&self, c: u32) -> bool {
        self.picked(c)
            && !matches!(
                self.op(c).0.op,
                Op::Input(..) | Op::Constant(..) | Op::Fill(..) | Op::Iota(..)
            )
            && !self.x.constant[c as usize]
            && !self.x.input[c as usize]
            && self.load(c) == Load::No
    }

    fn region(&self, c: u32) -> bool {
        class_tiled(self.x, c) || self.op(c).1.iter().any(|k| class_tiled(self.x, *k))
    }

    /// Outside a region a `tuple` is plumbing (no kernel of its own), and a `get` belongs to
    /// its tuple's kernel.
    fn plumbing(&self, c: u32) -> bool {
        !self.region(c) && matches!(self.op(c).0.op, Op::Tuple | Op::Get(_))
    }

    /// The kernel graph of the resolved classes into `scratch.edges` (writer kernel, reader
    /// kernel; sorted, deduplicated), regions joined into `scratch.parent` unless `joined`
    /// says they are already. True when a kernel reads a value it writes itself. Reads of
    /// stored values only: a `get` reading its own kernel's tuple reads no global memory (once
    /// kernels join, its read may vanish, so it proves nothing here).
    fn kernel_edges(&self, picks: &[u32], scratch: &mut LaunchScratch, joined: bool) -> bool {
        let LaunchScratch {
            parent,
            reads,
            edges,
        } = scratch;
        reads.clear();
        edges.clear();
        for &j in picks {
            if !self.computed(j) || self.plumbing(j) || matches!(self.op(j).0.op, Op::Get(_)) {
                continue;
            }
            for &o in &self.op(j).1 {
                if !self.picked(o) {
                    continue;
                }
                let value = match self.load(o) {
                    Load::From(b) => b,
                    Load::No => o,
                    Load::Unknown => continue,
                };
                if !class_tiled(self.x, value) && self.computed(value) {
                    reads.push((j, value));
                }
            }
        }
        if reads.is_empty() {
            return false;
        }
        if !joined {
            self.join_regions(picks, parent);
        }
        for &(j, value) in reads.iter() {
            let (reader, writer) = (self.kernel(parent, j), self.kernel(parent, value));
            if writer == NONE {
                continue;
            }
            if reader == writer {
                return true;
            }
            edges.push((writer, reader));
        }
        edges.sort_unstable();
        edges.dedup();
        false
    }

    /// A region class's kernel is its region's; another class is a kernel of its own (its
    /// default tiling), but a `get` outside a region is its tuple's, and a `tuple` outside a
    /// region none, as far as the picks decide (`NONE` otherwise).
    fn kernel(&self, parent: &mut [u32], mut c: u32) -> u32 {
        loop {
            if self.region(c) {
                return find_root(parent, c);
            }
            if !self.plumbing(c) {
                return c;
            }
            match (&self.op(c).0.op, self.op(c).1.first()) {
                (Op::Get(_), Some(&t)) if self.computed(t) => c = t,
                _ => return NONE,
            }
        }
    }

    /// Regions as a union-find over classes in `parent` (`find_root`): a computed region class
    /// joins each tiled operand that is not a load.
    fn join_regions(&self, picks: &[u32], parent: &mut Vec<u32>) {
        parent.resize(self.choice.len(), 0);
        for &c in picks {
            parent[c as usize] = c;
        }
        for &c in picks {
            if !self.computed(c) || !self.region(c) {
                continue;
            }
            for &o in &self.op(c).1 {
                if class_tiled(self.x, o) && self.picked(o) && self.load(o) == Load::No {
                    let (a, b) = (find_root(parent, c), find_root(parent, o));
                    parent[a as usize] = b;
                }
            }
        }
    }
}

fn find_root(p: &mut [u32], mut i: u32) -> u32 {
    while p[i as usize] != i {
        p[i as usize] = p[p[i as usize] as usize];
        i = p[i as usize];
    }
    i
}

/// Whether no completion of a partial program has a kernel launch order: the kernels its
/// resolved classes already form read each other's stored values in a cycle, or one reads a
/// value it writes itself. This is `lower::kernel_graph`'s test on what is known so far. A
/// completion only adds e-nodes, so it adds read edges and joins regions (a class's type
/// fixes whether it is tiled); joining the kernels of a cycle leaves a cycle or a kernel
/// reading itself, so the verdict holds for every completion. What a hole could still decide
/// is left out, which can only miss a cycle: a view chain into a hole (load or computed
/// tile?), the kernel of a `get` whose tuple is a hole or plumbing, and reads by `tuple` and
/// `get` (outside a region a tuple's readers read its parts; a get's read of its own kernel's
/// tuple is none, and may become so when kernels join).
fn launch_order_impossible(kv: &KernelView, picks: &[u32], scratch: &mut LaunchScratch) -> bool {
    // A kernel reading what it writes, or a cycle.
    kv.kernel_edges(picks, scratch, false) || kernel_cycle(&scratch.edges)
}

/// Whether kernel read edges (writer, reader; sorted) form a cycle.
fn kernel_cycle(edges: &[(u32, u32)]) -> bool {
    edges.len() >= 2 && kernel_chain(edges).is_none()
}

/// Orders a kernel graph (writer, reader; sorted) by Kahn's algorithm: the kernels on its
/// longest chain, each reading a value the one before it stored, or None for a cycle (some
/// kernel left unordered). In a completion with a launch order the kernels of a chain stay
/// distinct, since joining two of them makes a kernel read what it writes or a cycle, so
/// every valid completion has at least that many. 0 without edges.
fn kernel_chain(edges: &[(u32, u32)]) -> Option<usize> {
    // (unordered writers left, kernels on the longest chain ending here) per kernel.
    let mut at: FxHashMap<u32, (usize, usize)> = FxHashMap::default();
    for &(a, b) in edges {
        at.entry(a).or_insert((0, 1));
        at.entry(b).or_insert((0, 1)).0 += 1;
    }
    let mut ready: Vec<u32> = at
        .iter()
        .filter(|(_, (d, _))| *d == 0)
        .map(|(k, _)| *k)
        .collect();
    let (mut ordered, mut longest) = (0, 0);
    while let Some(k) = ready.pop() {
        ordered += 1;
        let chain = at[&k].1;
        longest = longest.max(chain);
        let from = edges.partition_point(|e| e.0 < k);
        for &(_, b) in edges[from..].iter().take_while(|e| e.0 == k) {
            let (d, c) = at.entry(b).or_default();
            *c = (*c).max(chain + 1);
            *d -= 1;
            if *d == 0 {
                ready.push(b);
            }
        }
    }
    (ordered == at.len()).then_some(longest)
}

/// Buffers `launch_order_impossible` reuses from one program to the next.
#[derive(Default)]
struct LaunchScratch {
    parent: Vec<u32>,
    reads: Vec<(u32, u32)>,
    edges: Vec<(u32, u32)>,
}

/// Lowerability of views: a `partition` slices what it reads from global memory (a kernel
/// region is entered through loads), so its operand must be a tensor-level value or views of
/// one — never a tile computed inside a kernel, which no program could slice by its grid
/// coordinate. (`replicate` of a computed tile is a loop-invariant value and stays allowed.)
fn loads_only(x: &ExtractGraph, choice: &Choice) -> bool {
    choice.iter().enumerate().all(|(c, &n)| {
        if n == NONE {
            return true;
        }
        let (node, kids) = &x.nodes[c][n as usize];
        !matches!(node.op, Op::Partition(..)) || loadable(x, choice, kids[0]) != Some(false)
    })
}

/// `loads_only` of `choice` just after hole `h` was picked, for a program that was
/// `loads_only` before (every program in the worklist is): only partitions whose operand's
/// view chain ran into the hole `h` can change their verdict.
fn loads_only_after_pick(x: &ExtractGraph, choice: &Choice, h: u32) -> bool {
    let Some((node, kids)) = x.op(h, choice) else {
        return true;
    };
    if matches!(node.op, Op::Partition(..)) && loadable(x, choice, kids[0]) == Some(false) {
        return false;
    }
    if loadable(x, choice, h) != Some(false) {
        return true;
    }
    // `h` is now a computed tile, or views of one: so is every tiled view picked above it.
    let mut stack = vec![h];
    while let Some(c) = stack.pop() {
        for &(q, j) in &x.view_users[c as usize] {
            if choice[q as usize] != j {
                continue;
            }
            if matches!(x.nodes[q as usize][j as usize].0.op, Op::Partition(..)) {
                return false;
            }
            if class_tiled(x, q) {
                stack.push(q);
            }
        }
    }
    true
}

/// Each value is computed once. A class that can be written as views of a value the program
/// computes anyway — a computed tensor-level value (stored, so loaded), or a tile computed in
/// a kernel (replicated) — is written so, unless that value is computed from this very class.
/// A program that recomputes such a value elsewhere does the work twice; the programs that
/// compute it one way or the other are candidates of their own. Judged on resolved classes, so
/// a partial program that breaks it is pruned before it is expanded.
///
/// On a partial program the verdict must hold for every completion (pruning is sound only
/// then): a view chain through a class not resolved yet that a hole reaches (`hole_reach`, a
/// bitset over classes) proves nothing, since the class may still be resolved to a
/// computation, and a hole may still make the value depend on the class. A class no hole
/// reaches stays unresolved in every completion, so it is judged as in the complete program:
/// nGPT 223 → 221 expanded states, RMSNorm+GEMM 9,439 → 8,541, LayerNorm+GEMM 46,150 →
/// 41,273, the same classes.
fn computed_once(
    x: &ExtractGraph,
    choice: &Choice,
    (visited, met): (&[bool], &[u32]),
    hole_reach: &[u64],
    scratch: &mut OnceScratch,
) -> bool {
    let picked = |k: usize| visited[k] && choice[k] != NONE;
    // A class no hole reaches is never picked by a completion: judged as in the complete
    // program already, so that a failure fixed by the resolved part shows now, not only once
    // the holes are filled (≈ₚ programs may differ there: they only agree on forms).
    let open = |k: usize| {
        hole_reach
            .get(k / 64)
            .is_some_and(|w| w >> (k % 64) & 1 == 1)
    };
    // What class `k` can be read from through views (`replicated`: the view above it is a
    // replicate), memoised per (class, replicated) in `memo[2k + replicated]`: a `Source`
    // encoded by `Source::code`.
    struct Program<'p> {
        x: &'p ExtractGraph<'p>,
        choice: &'p Choice,
        picked: &'p dyn Fn(usize) -> bool,
        open: &'p dyn Fn(usize) -> bool,
    }
    fn source(p: &Program, k: u32, replicated: bool, memo: &Memo) -> Source {
        let Program {
            x,
            choice,
            picked,
            open,
        } = *p;
        let slot = 2 * k as usize + usize::from(replicated);
        if let Some(code) = memo.get(slot) {
            return Source::decode(code);
        }
        let ku = k as usize;
        let r = if picked(ku) {
            let (n, kids) = &x.nodes[ku][choice[ku] as usize];
            if !class_tiled(x, k) {
                if x.constant[ku] || x.input[ku] {
                    Source::Nothing
                } else {
                    Source::Value(k)
                }
            } else if is_view(&n.op) {
                source(p, kids[0], matches!(n.op, Op::Replicate(_)), memo)
            } else if replicated {
                Source::Value(k)
            } else {
                // A tile computed in a kernel is only ever replicated, never sliced.
                Source::Nothing
            }
        } else if open(ku) {
            Source::Open
        } else if !class_tiled(x, k) {
            // Not in the program, so not computed.
            Source::Nothing
        } else {
            // Not in the program: any of its views may be written; the first that reads a
            // computed value counts, so one still undecided before it leaves this undecided
            // too. Until the alternatives are judged, a view cycle back here reads as
            // undecided.
            memo.set(slot, Source::Open.code());
            x.nodes[ku]
                .iter()
                .filter(|(n, _)| is_view(&n.op))
                .map(|(n, kids)| source(p, kids[0], matches!(n.op, Op::Replicate(_)), memo))
                .find(|s| *s != Source::Nothing)
                .unwrap_or(Source::Nothing)
        };
        memo.set(slot, r.code());
        r
    }
    let program = Program {
        x,
        choice,
        picked: &picked,
        open: &open,
    };
    scratch.next_call();
    let OnceScratch {
        memo,
        chain_use,
        other_use,
        seen,
        ..
    } = scratch;
    // ≈ does not see how a chain of one associative operator is grouped in a kernel, so
    // neither may this check: a class that is only an intermediate of such a chain (never
    // used otherwise, not a result) is no value of its own. (Judging it made validity differ
    // between ≈ programs, and which one early compaction kept decided whether the class
    // survived.)
    for r in &x.roots {
        other_use.mark(*r);
    }
    for p in met.iter().map(|p| *p as usize) {
        if choice[p] == NONE {
            continue;
        }
        let (node, kids) = &x.nodes[p][choice[p] as usize];
        for &k in kids {
            let ku = k as usize;
            let link = picked(ku)
                && chain_link(
                    &node.op,
                    class_tiled(x, p as u32),
                    &x.nodes[ku][choice[ku] as usize].0.op,
                    class_tiled(x, k),
                );
            if link {
                chain_use.mark(k);
            } else {
                other_use.mark(k);
            }
        }
    }
    for c in met.iter().map(|c| *c as usize) {
        let n = choice[c];
        let chain_only = chain_use.contains(c as u32) && !other_use.contains(c as u32);
        if n == NONE || !class_tiled(x, c as u32) || chain_only {
            continue;
        }
        let (node, kids) = &x.nodes[c][n as usize];
        let views_of = |n: &ENode, kids: &[u32], memo: &Memo| {
            source(&program, kids[0], matches!(n.op, Op::Replicate(_)), memo)
        };
        if is_view(&node.op) && views_of(node, kids, memo) != Source::Nothing {
            continue; // written as views of a computed value, or may still be
        }
        for (alt, kids) in &x.nodes[c] {
            if !is_view(&alt.op) {
                continue;
            }
            if let Source::Value(t) = views_of(alt, kids, memo) {
                if t as usize != c && !reaches(x, choice, &[t], c as u32, true, seen) {
                    return false;
                }
            }
        }
    }
    true
}

/// The failures of `computed_once` that a step's new picks (`new`: the branching pick and the
/// picks unit propagation forced with it) make directly, without a walk: a new pick computes a
/// tiled class that one view of a computed value could write, or computes the value that a
/// view e-node of a resolved, computing tiled class reads. Each is exactly what
/// `computed_once` refuses on the walked program (every pick of a program is in it, so
/// "picked" is "resolved" here), restricted to a view that reads the value itself rather than
/// through further views, and leaving out classes an associative chain may use as a mere
/// link; what it misses, the check after the walk finds.
fn computes_twice_directly(
    x: &ExtractGraph,
    choice: &Choice,
    new: &[u32],
    seen: &mut Marks,
) -> bool {
    // The computed value a view e-node reads directly, if it reads one (`source` for a
    // resolved class).
    let value_read = |alt: &Op, t: u32| -> bool {
        let tu = t as usize;
        let Some((n, _)) = x.op(t, choice) else {
            return false;
        };
        if !class_tiled(x, t) {
            !(x.constant[tu] || x.input[tu])
        } else {
            !is_view(&n.op) && matches!(alt, Op::Replicate(_))
        }
    };
    // A resolved tiled class computed (not written as views) and not a chain's mere link.
    let computing = |c: u32| {
        x.op(c, choice)
            .is_some_and(|(n, _)| class_tiled(x, c) && !is_view(&n.op) && !associative(&n.op))
    };
    for &c in new {
        // The new pick computes `c` though a view of a computed value could write it.
        if computing(c) {
            for (alt, kids) in &x.nodes[c as usize] {
                if is_view(&alt.op)
                    && kids[0] != c
                    && value_read(&alt.op, kids[0])
                    && !reaches(x, choice, &kids[0..1], c, true, seen)
                {
                    return true;
                }
            }
        }
        // The new pick computes `c`, which a view e-node of a computing class reads.
        for &(u, j) in &x.view_users[c as usize] {
            let alt = &x.nodes[u as usize][j as usize].0.op;
            if u != c
                && computing(u)
                && value_read(alt, c)
                && !reaches(x, choice, &[c], u, true, seen)
            {
                return true;
            }
        }
    }
    false
}

/// What a view chain reads (`computed_once`).
#[derive(Clone, Copy, PartialEq)]
enum Source {
    /// This computed value.
    Value(u32),
    /// No computed value (an input, a constant, a tile that is sliced).
    Nothing,
    /// Not decided yet: the chain meets a class not resolved yet.
    Open,
}

impl Source {
    /// Dense encoding for the memo: class indices stay below `u32::MAX - 2`.
    fn code(self) -> u32 {
        match self {
            Source::Value(k) => k,
            Source::Nothing => u32::MAX - 1,
            Source::Open => u32::MAX - 2,
        }
    }

    fn decode(code: u32) -> Source {
        match code {
            c if c == u32::MAX - 1 => Source::Nothing,
            c if c == u32::MAX - 2 => Source::Open,
            k => Source::Value(k),
        }
    }
}

/// Scratch space for `computed_once`, reused across calls so that no call clears arrays the
/// size of the e-graph: `memo` entries count only with the current call's generation, and
/// the use sets are `Marks`.
struct OnceScratch {
    /// Per (class, replicated): `Source::code`.
    memo: Memo,
    chain_use: Marks,
    other_use: Marks,
    /// For `reaches`.
    seen: Marks,
}

impl OnceScratch {
    fn new(classes: usize) -> OnceScratch {
        OnceScratch {
            memo: Memo::new(2 * classes),
            chain_use: Marks::new(classes),
            other_use: Marks::new(classes),
            seen: Marks::new(classes),
        }
    }

    /// Starts a call: an empty memo and empty use sets.
    fn next_call(&mut self) {
        self.memo.clear();
        self.chain_use.clear();
        self.other_use.clear();
    }
}

/// What a partial program fixes, beyond its canonical form, that can still change how its
/// holes are completed: the resolved classes that a completion can read (`reach`: by default
/// `readable_resolved`, else every class the holes reach through any e-node) and that had a
/// choice (more than one valid e-node), each with its canonical id under the walk (`memo`;
/// chain intermediates, which have none, with their pick). A completion only ever reads such
/// classes, and normalisation only looks at the canonical forms of operands, so two partial
/// programs with equal forms and equal contexts allow the same completions and complete to the
/// same classes: Algorithm 1 prunes the second (≈ₚ). Picks that differ only in how they write
/// a class's form (`a * b` against `b * a`, views in another order) give equal contexts;
/// `HoleContext::Picks` keeps them apart. Other resolved classes, such as the intermediate
/// class of a view chain or of an associative chain written in another order, are left out;
/// that is what lets differently written partial programs meet.
///
/// Why the readable classes suffice. Let P be taken first and Q later, with equal forms (so
/// the same holes) and equal contexts, and let a completion of Q resolve a class v that P has
/// resolved. The completion's picks reach v from a hole through classes Q leaves open. On that
/// path, the first class w that P resolved is read by a class P leaves open, so it is readable
/// in P; Q leaves it open, so it is not named in Q's context. If w had a choice it is named in
/// P's context, and the contexts differ. If it has one e-node, both programs pick it alike, and
/// its resolved operands are readable in P as well (`readable_resolved` goes through it), so
/// the argument goes on down the path (a class P leaves open below it is one of the common
/// holes, from which it starts again). So a completion of Q picks nothing that P picked
/// otherwise, and completes P too, to the same form. On RMSNorm–SwiGLU this context, against
/// every class the holes reach, expanded 590,794 states instead of 824,563 for the same 24,404
/// classes: an associative chain grouped two ways, `x * (r * w)` against `(x * r) * w`, names
/// its inner class as long as a hole could read it through any e-node, and such programs met
/// only once the last such hole was resolved.
///
/// The context also names the classes whose values the program stores (resolved tensor-level
/// classes other than inputs and constants): `computed_once` judges a completion by which
/// classes hold stored values, and ≈ does not see it. A pointwise tail moved across a store
/// (`square` applied before the store, or after the load) gives equal forms with different
/// stored classes, and a completion that computes the unsquared value again is refused in one
/// program and not the other. Without them, forcing past e-nodes that close a cycle made walk
/// order keep the refused program and lose 3 of layernorm_gemm's 1,455 classes. With the
/// readable context (`stored_read`), only the stored values a completion can meet are named:
/// those at the end of a chain of picked views from a readable class. `computed_once` finds
/// the stored value a completion's class could be a view of by following view e-nodes from
/// it: through classes the completion resolves, then, from the first resolved class (a
/// readable one, as above), through the program's picked views only; so no other stored class
/// can change its verdict. On RMSNorm–SwiGLU this took the expanded states from 590,794 (every
/// stored class named) to 382,817, LayerNorm+GEMM from 28,301 to 15,251, the same classes.
///
/// It also names how the resolved classes a completion can attach to (those a hole reaches,
/// and those with a hole operand) share kernel regions: a tiled class read by two others
/// joins their kernels, which ≈ does not see either (forms are trees). On RMSNorm–MLP a
/// program T whose `c29 = c80 * c81` shares the tile `c80 = w * x` with the tile matmul of a
/// fused reduction pruned a program S writing `c29 = w * (c81 * x)`: equal forms, but in T
/// the kernel around hole `c81` is the one that writes the stored reduction `c81`'s
/// completion reads back, so every completion of T had no launch order while S's did, and
/// four classes were lost (fewest-first with holes that reach unread fused components first,
/// and walk order at the start of 2026-11-24). For the same reason it names which of those
/// kernels reach which others through the kernels the resolved classes form: a completion
/// closes a cycle through them exactly when such a path exists. Both use the kernel model of
/// `launch_order_impossible`, not the lowering's own.
fn hole_context(
    kv: &KernelView,
    sorted_picks: &[u32],
    reach: &[u64],
    memo: &[u32],
    (by, stored_read): (HoleContext, bool),
    regions: &mut RegionScratch,
    context: &mut Vec<u64>,
) {
    let (x, s) = (kv.x, kv.choice);
    let stored = |c: u32| {
        let cu = c as usize;
        !class_tiled(x, c) && !x.constant[cu] && !x.input[cu]
    };
    // Canonical ids and pick indices both stay below 2^31: the top bit tells them apart.
    const FORM: u64 = 1 << 31;
    // A stored class: its id alone, tagged by the top bit (class ids stay below 2^31).
    const STORED: u64 = 1 << 63;
    // A region class a completion can attach to, with the least such class of its region.
    const REGION: u64 = 1 << 62;
    let RegionScratch {
        launch,
        least,
        labels,
        stack,
        seen,
        stored: met_stored,
        attachable,
        self_read,
    } = regions;
    kv.join_regions(sorted_picks, &mut launch.parent);
    let parent = &mut launch.parent;
    // A class a completion can attach to: one a hole reaches, or one with an operand that is
    // a hole or views of one (a tile the completion may compute, joining its kernel).
    let interface = |c: u32| {
        let cu = c as usize;
        kv.computed(c)
            && kv.region(c)
            && (has(reach, cu)
                || kv.op(c).1.iter().any(|&k| {
                    s[k as usize] == NONE
                        || class_tiled(x, k) && kv.picked(k) && kv.load(k) == Load::Unknown
                }))
    };
    attachable.clear();
    attachable.extend(sorted_picks.iter().copied().filter(|c| interface(*c)));
    least.clear();
    for &c in attachable.iter() {
        let r = find_root(parent, c);
        let l = least.entry(r).or_insert(c);
        *l = (*l).min(c);
    }
    context.clear();
    context.extend(
        sorted_picks
            .iter()
            .map(|c| (*c as usize, s[*c as usize]))
            .filter(|(c, _)| x.nodes[*c].len() > 1 && has(reach, *c))
            .map(|(c, n)| {
                let value = match (by, memo[c]) {
                    (HoleContext::Forms, id) if id != NONE => FORM | u64::from(id),
                    _ => u64::from(n),
                };
                ((c as u64) << 32) | value
            })
            .chain(
                sorted_picks
                    .iter()
                    .filter(|c| !stored_read && stored(**c))
                    .map(|c| STORED | u64::from(*c)),
            ),
    );
    if stored_read {
        // The stored values a completion can meet: at the end of a chain of picked views from
        // a class it can read (what `computed_once`'s `source` follows), each named once.
        met_stored.clear();
        for &c in sorted_picks {
            let cu = c as usize;
            if !has(reach, cu) {
                continue;
            }
            let mut k = c;
            while let Some((_, kids)) = x.op(k, s).filter(|(n, _)| is_view(&n.op)) {
                k = kids[0];
            }
            if s[k as usize] != NONE && stored(k) {
                met_stored.push(STORED | u64::from(k));
            }
        }
        met_stored.sort_unstable();
        met_stored.dedup();
        context.extend_from_slice(met_stored);
    }
    for &c in attachable.iter() {
        let l = least[&find_root(parent, c)];
        context.push(REGION | (u64::from(c) << 31) | u64::from(l));
    }
    // Paths between those kernels through the resolved ones: a completion that joins or links
    // two of them closes a cycle exactly when such a path exists. Kernels are named by their
    // least attachable class, or, for a class a hole reaches that is a kernel of its own, by
    // that class.
    const PATH: u64 = 1 << 61;
    labels.clear();
    for (&root, &l) in least.iter() {
        labels.insert(root, l);
    }
    for &c in sorted_picks {
        let cu = c as usize;
        if has(reach, cu) && kv.computed(c) && !kv.region(c) && !kv.plumbing(c) {
            labels.insert(c, c);
        }
    }
    // Also the launch-order test's graph (`RegionScratch::self_read`).
    *self_read = kv.kernel_edges(sorted_picks, launch, true);
    let edges = &launch.edges;
    let start = context.len();
    if !edges.is_empty() {
        for (&k, &from) in labels.iter() {
            seen.clear();
            stack.clear();
            stack.push(k);
            while let Some(a) = stack.pop() {
                let first = edges.partition_point(|e| e.0 < a);
                for &(_, b) in edges[first..].iter().take_while(|e| e.0 == a) {
                    if seen.insert(b) {
                        stack.push(b);
                        if let Some(&to) = labels.get(&b) {
                            context.push(PATH | (u64::from(from) << 30) | u64::from(to));
                        }
                    }
                }
            }
        }
    }
    context[start..].sort_unstable();
}

/// Scratch space for the kernels of `hole_context`.
#[derive(Default)]
struct RegionScratch {
    /// Regions (`KernelView::join_regions`) and the kernel graph (`KernelView::kernel_edges`).
    launch: LaunchScratch,
    /// Per region root, its least class a completion can attach to.
    least: FxHashMap<u32, u32>,
    /// The kernels a completion can attach to, by their names in the context.
    labels: FxHashMap<u32, u32>,
    stack: Vec<u32>,
    seen: FxHashSet<u32>,
    /// The stored values a completion can meet (`stored_read`).
    stored: Vec<u64>,
    /// The resolved classes a completion can attach to, in class order.
    attachable: Vec<u32>,
    /// Whether a kernel reads what it writes. With `launch.edges`, the kernel graph
    /// `launch_order_impossible` builds (up to the names of regions, which `kernel_cycle` does
    /// not see), so the test reuses them for a program it looked up.
    self_read: bool,
}

/// What ≈ₚ compares besides canonical forms (see `hole_context`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum HoleContext {
    /// The canonical ids of the resolved classes holes reach: the default.
    Forms,
    /// Their picks: a finer relation that prunes less (rmsnorm_gemm: 157,440 expanded states
    /// against 53,015 for the same 728 classes), kept to check that both find the same
    /// classes.
    Picks,
}

impl HoleContext {
    pub fn parse(s: &str) -> Option<HoleContext> {
        match s {
            "forms" => Some(HoleContext::Forms),
            "picks" => Some(HoleContext::Picks),
            _ => None,
        }
    }
}

/// Which hole of a partial program Algorithm 1 resolves next. The classes found must not
/// depend on it (every partial-program check holds for all completions); the work does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum HoleOrder {
    /// The hole with the fewest valid e-nodes (forced picks first): the default.
    FewestNodes,
    /// The first hole in walk order from the results (depth-first, operands in order).
    Walk,
    /// The hole with the most valid e-nodes: the widest branching first, an adversarial order
    /// for checking that pruning does not depend on the order.
    MostNodes,
    /// A hole picked per partial program by a hash of the program's place in the search and
    /// the seed: each seed a different, deterministic order, for checking that pruning does not
    /// depend on the order (on saturated layernorm_gemm, seeds lost classes to the flaw
    /// described at `hole_context` until it was fixed; see `tests/extract_compaction.rs`).
    Scattered(u64),
}

impl HoleOrder {
    pub fn parse(s: &str) -> Option<HoleOrder> {
        match s {
            "fewest" => Some(HoleOrder::FewestNodes),
            "walk" => Some(HoleOrder::Walk),
            "most" => Some(HoleOrder::MostNodes),
            "scattered" => Some(HoleOrder::Scattered(1)),
            _ => None,
        }
    }
}

/// Builder-style limits, as for saturation.
#[derive(Clone)]
pub struct Extractor {
    pub compaction: Compaction,
    pub hole_order: HoleOrder,
    pub max_candidates: usize,
    pub time_limit: Duration,
    /// Stop once the process's resident memory reaches this many MiB (read from
    /// `/proc/self/status` where there is one): the seen-set and the worklist grow with every
    /// state, by about 33 MB/s on MHA decode.
    pub memory_limit: Option<usize>,
    /// Only candidates with at most this many kernels; partial programs that must exceed it
    /// are pruned.
    pub max_kernels: Option<usize>,
    /// The backend's verdict on a complete program: `Err(reason)` when it cannot lower it.
    /// Candidates it refuses are not output (counted as `not_lowerable`).
    pub lowerable: Option<LowerCheck>,
    pub hole_context: HoleContext,
    /// Prune partial programs that no completion gives a launch order (on by default; off
    /// only to show, in tests, that it loses no candidate).
    pub prune_no_launch_order: bool,
    /// Prune partial programs with a tuple reduction one of whose components no completion
    /// reads (`dead_component`; on by default, off only to show in tests that it loses no
    /// candidate). Complete programs are refused for it either way.
    pub prune_dead_components: bool,
    /// Resolve a class with one e-node in the state that makes it reachable (on by default;
    /// off only to show, in tests, that it changes the work and not the classes).
    pub unit_propagation: bool,
    /// Early compaction leaves out operand swaps (`ExtractGraph::unswapped`; on by default,
    /// off only to show, in tests, that it changes the work and not the classes).
    pub skip_operand_swaps: bool,
    /// The classes no hole reaches are judged as in the complete program, which none of them
    /// joins: by the each-value-once check (`computed_once`) and the dead-component check
    /// (`dead_component`). On by default; off only to show, in tests, that it changes the work
    /// and not the classes.
    pub settle_unreached: bool,
    /// Called about four times a second once a run passes one second (`ExtractProgress`).
    pub progress: Option<ProgressFn>,
    /// Refuse programs with a pointwise kernel (`has_pointwise_kernel`); off by default, since
    /// they are distinct implementations.
    pub no_pointwise_kernels: bool,
    /// Run `lowerable` on another thread while the search goes on (`LoweringQueue`); on by
    /// default, off only to show, in tests, that it changes neither candidates nor counts.
    pub background_lowering: bool,
    /// Check a child for dead components and for computing a value twice where its new picks
    /// decide it, before it is pushed, so that it is never walked (`computes_twice_directly`,
    /// `unreachable_from_holes`): the same states pruned earlier. On by default; off only to
    /// show, in tests, that it changes neither candidates nor expansions.
    pub check_before_push: bool,
    /// With the checks before the push, apply them also to each e-node of a class the child
    /// newly reaches (the unit propagation's viability test), so that a class left with one
    /// e-node that passes them is forced and one left with none ends the child. Unlike the
    /// checks on the child's own picks, this prunes programs one pick deeper, so it changes
    /// the expanded states, never the classes. On by default; off to measure it.
    pub new_hole_lookahead: bool,
    /// The hole context names the resolved classes a completion can read (`readable_resolved`:
    /// operands of the e-nodes of the classes it may still resolve), not every resolved class
    /// the holes reach through any e-node, and only the stored values at the end of picked
    /// views from those, not every stored class. Fewer classes named, so more partial programs
    /// meet as ≈ₚ; the classes found are the same. On by default (it needs
    /// `settle_unreached`); off to measure it.
    pub readable_context: bool,
}

/// Where a long extraction stands: what a progress line shows.
#[derive(Clone, Copy, Debug)]
pub struct ExtractProgress {
    pub expanded: usize,
    pub complete: usize,
    pub distinct: usize,
    pub worklist: usize,
    pub seconds: f64,
}

pub type ProgressFn = std::sync::Arc<dyn Fn(&ExtractProgress) + Send + Sync>;

/// A backend's lowerability test for complete candidates (the extractor does not depend on
/// any backend).
pub type LowerCheck = std::sync::Arc<dyn Fn(&Function) -> Result<(), String> + Send + Sync>;

impl Default for Extractor {
    fn default() -> Self {
        Extractor {
            compaction: Compaction::Early,
            hole_order: HoleOrder::FewestNodes,
            max_candidates: 1000,
            time_limit: Duration::from_secs(60),
            memory_limit: None,
            max_kernels: None,
            lowerable: None,
            hole_context: HoleContext::Forms,
            prune_no_launch_order: true,
            prune_dead_components: true,
            unit_propagation: true,
            skip_operand_swaps: true,
            settle_unreached: true,
            check_before_push: true,
            new_hole_lookahead: true,
            readable_context: true,
            progress: None,
            no_pointwise_kernels: false,
            background_lowering: true,
        }
    }
}

impl Extractor {
    pub fn with_compaction(mut self, c: Compaction) -> Self {
        self.compaction = c;
        self
    }

    pub fn with_hole_order(mut self, order: HoleOrder) -> Self {
        self.hole_order = order;
        self
    }

    pub fn with_max_candidates(mut self, n: usize) -> Self {
        self.max_candidates = n;
        self
    }

    pub fn with_time_limit(mut self, d: Duration) -> Self {
        self.time_limit = d;
        self
    }

    pub fn with_memory_limit(mut self, mib: Option<usize>) -> Self {
        self.memory_limit = mib;
        self
    }

    pub fn with_max_kernels(mut self, n: Option<usize>) -> Self {
        self.max_kernels = n;
        self
    }

    /// Refuse candidates with a kernel that only applies pointwise operators (or moves data)
    /// and stores a value another kernel reads; partial programs that have one are pruned.
    pub fn with_no_pointwise_kernels(mut self, on: bool) -> Self {
        self.no_pointwise_kernels = on;
        self
    }

    pub fn with_background_lowering(mut self, on: bool) -> Self {
        self.background_lowering = on;
        self
    }

    pub fn with_hole_context(mut self, by: HoleContext) -> Self {
        self.hole_context = by;
        self
    }

    pub fn with_no_launch_order_pruning(mut self, on: bool) -> Self {
        self.prune_no_launch_order = on;
        self
    }

    pub fn with_dead_component_pruning(mut self, on: bool) -> Self {
        self.prune_dead_components = on;
        self
    }

    pub fn with_unit_propagation(mut self, on: bool) -> Self {
        self.unit_propagation = on;
        self
    }

    pub fn with_operand_swaps_skipped(mut self, on: bool) -> Self {
        self.skip_operand_swaps = on;
        self
    }

    pub fn with_unreached_settled(mut self, on: bool) -> Self {
        self.settle_unreached = on;
        self
    }

    pub fn with_checks_before_push(mut self, on: bool) -> Self {
        self.check_before_push = on;
        self
    }

    pub fn with_new_hole_lookahead(mut self, on: bool) -> Self {
        self.new_hole_lookahead = on;
        self
    }

    pub fn with_readable_context(mut self, on: bool) -> Self {
        self.readable_context = on;
        self
    }

    pub fn with_progress(mut self, report: ProgressFn) -> Self {
        self.progress = Some(report);
        self
    }

    pub fn with_lowerable(mut self, check: LowerCheck) -> Self {
        self.lowerable = Some(check);
        self
    }

    /// Algorithm 1 (or its ablations). The worklist is ordered cheapest first (estimated
    /// tree cost of the completed program; the newest first among equals, so the search dives
    /// to complete programs), which makes the first candidates found under a limit the ones
    /// with fewest kernels and stores. A partial program is stored as its last pick and a link
    /// to its parent, so the worklist stays small.
    pub fn run(&self, x: &ExtractGraph) -> ExtractReport {
        // The lowering worker (`LoweringQueue`) borrows the e-graph: it lives in this scope.
        std::thread::scope(|scope| self.run_in(x, scope))
    }

    fn run_in<'scope, 'env>(
        &'env self,
        x: &'env ExtractGraph<'env>,
        scope: &'scope std::thread::Scope<'scope, 'env>,
    ) -> ExtractReport {
        let start = Instant::now();
        let classes = x.ids.len();
        // Pruning compares partial programs under a finer relation than ≈: a fold over a
        // stored collection keeps its own form. It is ≈ to `reduce … parallel=` but gives
        // another kernel graph (the stack is written by one kernel and read by the next), so
        // which of the two has a launch order is not a function of ≈, and pruning by ≈ lost
        // classes (layernorm_gemm, counted before dead product components were rejected: 6,563
        // in walk order, 6,627 fewest-first). Folds inside a
        // kernel need no such care. Complete programs are then grouped by ≈ itself.
        let mut interner = Interner {
            keep_stored_folds: true,
            ..Default::default()
        };
        let mut class_interner = Interner::default();
        // Early compaction's seen-set: a partial program's form and hole context as u32s.
        let mut seen = SliceTable::default();
        let (mut context, mut seen_key): (Vec<u64>, Vec<u32>) = (Vec::new(), Vec::new());
        // What complete programs came to: classes output, candidates, refusals.
        let mut out = Outcomes::default();
        // With a backend check, complete programs are lowered on another thread (not in
        // `None` mode, which outputs every program and so needs each verdict at once).
        let max_kernels = self.max_kernels;
        let mut queue = match &self.lowerable {
            Some(check) if self.background_lowering && self.compaction != Compaction::None => {
                let early = self.compaction == Compaction::Early;
                let rebuild = move |choice: &Choice| rebuilt(x, choice, max_kernels);
                Some(LoweringQueue::new(scope, check.clone(), rebuild, early))
            }
            _ => None,
        };
        // Trail: (parent, class, e-node); entry 0 is the empty program.
        let mut trail: Vec<(u32, u32, u32)> = vec![(NONE, NONE, NONE)];
        let mut roots: Vec<u32> = x.roots.clone();
        roots.sort();
        roots.dedup();
        let words = classes.div_ceil(64);
        let (mut base_union, mut union) = (vec![0u64; words], vec![0u64; words]);
        for r in &roots {
            add_cheapest(x, &mut union, *r);
        }
        let mut s: Choice = vec![NONE; classes];
        let root_cost = hole_estimate(x, &s, &union);
        // (estimate, trail index): a program's trail index grows with every push, so among
        // equal estimates the newest comes first.
        let mut worklist: BinaryHeap<(Reverse<u64>, u32)> = BinaryHeap::new();
        worklist.push((Reverse(root_cost), 0));
        let (mut facts, mut class_facts) = (WalkFacts::default(), WalkFacts::default());
        let mut scratch = Marks::new(classes);
        let mut once_scratch = OnceScratch::new(classes);
        let (mut expanded, mut rejected) = (0usize, 0usize);
        let mut no_launch_order = 0usize;
        let mut launch_scratch = LaunchScratch::default();
        let mut load_memo = Memo::new(classes);
        // The classes the program being looked at has picked.
        let mut picks: Vec<u32> = Vec::new();
        let mut sorted_picks: Vec<u32> = Vec::new();
        let mut context_reach: Vec<u64> = Vec::new();
        // Unresolved classes holding a `get` that a picked fused reduction needs (see the
        // check before a child is pushed).
        let mut needed: Vec<u32> = Vec::new();
        let (mut back_marks, mut back_stack) = (Marks::new(classes), Vec::new());
        let mut twice_seen = Marks::new(classes);
        let mut pending: Vec<u32> = Vec::new();
        let mut region_scratch = RegionScratch::default();
        let all_reached: Vec<u64> = vec![u64::MAX; classes.div_ceil(64)];
        let (mut open, mut open_stack): (Vec<u64>, Vec<u32>) = (Vec::new(), Vec::new());
        let mut stop = ExtractStop::Exhausted;
        let (mut growth, mut tables) = (GrowthWatch::default(), Vec::new());
        let mut taken = 0usize;
        // Programs taken and walked (`taken` also counts the one a limit stopped at).
        let mut walked = 0usize;
        let mut over_kernels = 0usize;
        let mut recomputed = 0usize;
        let mut pointwise_kernels = 0usize;
        let mut dead_components = 0usize;
        let mut equivalent = 0usize;
        let mut forced = 0usize;
        let (mut reached, mut forced_picks): (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
        // `reached` as a set: the hole tests below ask it once per class searched.
        let mut in_reached = Marks::new(classes);
        // The checks before the push: for dead components they need the classes no hole
        // reaches settled (`open`); the lookahead applies them to newly reached classes too.
        let dead_before_push =
            self.prune_dead_components && self.settle_unreached && self.check_before_push;
        let lookahead = self.check_before_push && self.new_hole_lookahead;
        let readable_context = self.readable_context && self.settle_unreached;
        // Progress reports start after one second, then every quarter second.
        let mut next_report = Duration::from_secs(1);
        // The e-nodes each class branches on (see `ExtractGraph::unswapped`): after and none
        // construct every program, swaps included.
        let all_nodes: Vec<Vec<u32>>;
        let options: &[Vec<u32>] =
            if self.compaction == Compaction::Early && self.skip_operand_swaps {
                &x.unswapped
            } else {
                all_nodes = x
                    .nodes
                    .iter()
                    .map(|ns| (0..ns.len() as u32).collect())
                    .collect();
                &all_nodes
            };
        while let Some((_, at)) = worklist.pop() {
            if let Some(q) = queue.as_mut() {
                q.poll(&mut out);
            }
            taken += 1;
            if taken == 1 || taken % 256 == 0 {
                let elapsed = start.elapsed();
                if elapsed > self.time_limit {
                    stop = ExtractStop::TimeLimit(self.time_limit.as_secs_f64());
                    break;
                }
                // Reading the resident size costs microseconds: once every 4,096 programs.
                // The tables whose next doubling may come before the next look count as
                // grown already, so the search stops before such a growth passes the limit.
                if let Some(limit) = self.memory_limit.filter(|_| taken % 4096 <= 1) {
                    tables.clear();
                    interner.tables(&mut tables);
                    class_interner.tables(&mut tables);
                    seen.tables(&mut tables);
                    tables.push((trail.len(), trail.capacity(), 12));
                    tables.push((worklist.len(), worklist.capacity(), 16));
                    let ahead_mib = growth.ahead(&tables) >> 20;
                    if resident_mib().is_some_and(|m| m + ahead_mib >= limit) {
                        stop = ExtractStop::MemoryLimit(limit);
                        break;
                    }
                }
                if let Some(report) = self.progress.as_ref().filter(|_| elapsed >= next_report) {
                    next_report = elapsed + Duration::from_millis(250);
                    report(&ExtractProgress {
                        expanded,
                        complete: out.complete,
                        distinct: out.distinct.len(),
                        worklist: worklist.len(),
                        seconds: elapsed.as_secs_f64(),
                    });
                }
            }
            walked += 1;
            // Only the last program's picks are set: clearing them clears `s`.
            for &c in &picks {
                s[c as usize] = NONE;
            }
            picks.clear();
            let mut link = at;
            while link != 0 {
                let (parent, c, n) = trail[link as usize];
                s[c as usize] = n;
                picks.push(c);
                link = parent;
            }
            let form = Walk::roots(x, &s, &mut interner, &mut facts);
            let WalkFacts {
                visited,
                holes,
                memo,
                met,
            } = &facts;
            // By default the most constrained hole first: forced picks cost one expansion each
            // and never branch, and an early forced pick exposes dead ends sooner. Among
            // equals, the highest class id (an order that does not depend on how the walk
            // wrote commutative operands); measured, it expands fewer states than walk order.
            let hole = match self.hole_order {
                HoleOrder::FewestNodes => {
                    // Components of picked fused reductions still unread.
                    pending.clear();
                    unread_components(x, &s, met, &mut pending);
                    let reaches_pending = |h: u32| {
                        pending.iter().any(|b| {
                            let b = *b as usize;
                            has(&x.reach[h as usize], b)
                        })
                    };
                    holes.iter().copied().min_by_key(|h| {
                        (
                            !reaches_pending(*h),
                            options[*h as usize].len(),
                            Reverse(*h),
                        )
                    })
                }
                HoleOrder::Walk => holes.first().copied(),
                HoleOrder::Scattered(seed) => {
                    // splitmix64 of the program's trail index and the seed.
                    let mut z =
                        (u64::from(at) ^ seed.rotate_left(32)).wrapping_add(0x9E37_79B9_7F4A_7C15);
                    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                    z ^= z >> 31;
                    holes.get((z % holes.len().max(1) as u64) as usize).copied()
                }
                HoleOrder::MostNodes => holes
                    .iter()
                    .copied()
                    .max_by_key(|h| options[*h as usize].len()),
            };
            // Exact for a complete program; the children's priorities build on it.
            let cost = picked_cost(x, &s, met);
            // Off, every class counts as reachable from a hole while any hole is left.
            let settled: &[u64] = if self.settle_unreached || holes.is_empty() {
                open_reach(x, &s, holes, &mut open, &mut open_stack);
                &open
            } else {
                &all_reached
            };
            if !computed_once(x, &s, (visited, met), settled, &mut once_scratch) {
                recomputed += 1;
                continue;
            }
            if self.prune_dead_components && dead_component(x, &s, met, settled) {
                dead_components += 1;
                continue;
            }
            if self.no_pointwise_kernels && has_pointwise_kernel(x, &s, met, &mut scratch) {
                pointwise_kernels += 1;
                continue;
            }
            // Early compaction looks a partial program up after the checks on its resolved
            // part and inserts it once it passes them. A program is dropped if it fails them
            // or is ≈ₚ one taken, in either order, so the order decides only the cost: the
            // hole context costs more than the checks, and more programs fail them than are
            // ≈ₚ one taken.
            load_memo.clear();
            let kv = KernelView {
                x,
                choice: &s,
                visited,
                loads: &load_memo,
            };
            let key = self.compaction == Compaction::Early && !holes.is_empty();
            if key {
                // The resolved classes whose picks and regions ≈ₚ compares: those a completion
                // can read, or every class the holes reach through any e-node. Found only for
                // a program that passed the checks above.
                sorted_picks.clear();
                sorted_picks.extend_from_slice(&picks);
                sorted_picks.sort_unstable();
                if readable_context {
                    readable_resolved(x, &s, settled, &mut context_reach, &mut open_stack);
                } else {
                    context_reach.clear();
                    context_reach.resize(classes.div_ceil(64), 0);
                    for h in holes {
                        for (r, w) in context_reach.iter_mut().zip(&x.reach[*h as usize]) {
                            *r |= w;
                        }
                    }
                }
                hole_context(
                    &kv,
                    &sorted_picks,
                    &context_reach,
                    memo,
                    (self.hole_context, readable_context),
                    &mut region_scratch,
                    &mut context,
                );
            }
            if key {
                // The form's length first, so that no two keys run together.
                seen_key.clear();
                seen_key.push(form.len() as u32);
                seen_key.extend_from_slice(&form);
                seen_key.extend(context.iter().flat_map(|w| [*w as u32, (*w >> 32) as u32]));
            }
            // Hashed once, for the lookup and for the insert below.
            let seen_hash = if key { SliceTable::hash(&seen_key) } else { 0 };
            if key && seen.find_hashed(&seen_key, seen_hash).is_some() {
                equivalent += 1;
                continue; // ≈ₚ a program already taken
            }
            if let Some(max) = self.max_kernels {
                // The kernel graph the hole context built, or built here; a kernel reading
                // what it writes is left to the launch-order test below.
                let chain = if key {
                    if region_scratch.self_read {
                        0
                    } else {
                        kernel_chain(&region_scratch.launch.edges).unwrap_or(0)
                    }
                } else if kv.kernel_edges(&picks, &mut launch_scratch, false) {
                    0
                } else {
                    kernel_chain(&launch_scratch.edges).unwrap_or(0)
                };
                if kernel_lower_bound(x, &s, met, memo).max(chain) > max {
                    over_kernels += 1;
                    continue;
                }
            }
            // The hole context built the kernel graph already.
            let no_order = |launch_scratch: &mut LaunchScratch| {
                if key {
                    region_scratch.self_read || kernel_cycle(&region_scratch.launch.edges)
                } else {
                    launch_order_impossible(&kv, &picks, launch_scratch)
                }
            };
            if self.prune_no_launch_order && !holes.is_empty() && no_order(&mut launch_scratch) {
                no_launch_order += 1;
                continue;
            }
            // The ≈ class of a complete program.
            let class_form = if holes.is_empty() {
                Walk::roots(x, &s, &mut class_interner, &mut class_facts)
            } else {
                Vec::new()
            };
            if self.compaction == Compaction::Early {
                // A complete program is pruned only when a ≈ one was output: one refused by
                // the checks below (launch order, kernels, lowering), which ≈ programs need
                // not share, must not take its class with it.
                // (A class whose program waits for its verdict is decided with that verdict:
                // `LoweringQueue`.)
                if key {
                    seen.insert_hashed(&seen_key, seen_hash, 0);
                } else if out.distinct.contains(&class_form) {
                    equivalent += 1;
                    continue; // ≈ a program already output
                }
            }
            let Some(h) = hole else {
                // The partial test is exact enough to refuse most such programs before they
                // are rebuilt as functions; `rebuilt` decides the rest.
                let launch_order = !self.prune_no_launch_order
                    || !launch_order_impossible(&kv, &picks, &mut launch_scratch);
                if let Some(q) = queue.as_mut() {
                    if !launch_order {
                        // Early compaction would have pruned it as ≈ an output program if
                        // the program of its class that waits is output: that verdict decides.
                        if self.compaction == Compaction::Early && q.waits_for(&class_form) {
                            let refusal = Some(Refusal::NoLaunchOrder);
                            q.submit(None, class_form, Choice::new(), cost, refusal);
                        } else {
                            no_launch_order += 1;
                        }
                        continue;
                    }
                    // The worker rebuilds and checks it, and lowers it unless its class is output.
                    q.submit(Some(s.clone()), class_form, s.clone(), cost, None);
                    // Every waiting program may yet be output: once they could reach the
                    // limit, their verdicts decide whether this program is the last.
                    if out.candidates.len() + q.len() >= self.max_candidates {
                        q.drain(&mut out);
                        if out.candidates.len() >= self.max_candidates {
                            stop = ExtractStop::CandidateLimit(self.max_candidates);
                            break;
                        }
                    }
                    q.bound(&mut out);
                    continue;
                }
                let program = if launch_order {
                    rebuilt(x, &s, self.max_kernels)
                } else {
                    Err(Refusal::NoLaunchOrder)
                };
                let program = match program {
                    Ok(program) => program,
                    Err(refusal) => {
                        *match refusal {
                            Refusal::NoLaunchOrder => &mut no_launch_order,
                            Refusal::DeadComponent => &mut dead_components,
                            Refusal::NoLaunchOrderFound => &mut rejected,
                            Refusal::OverKernels => &mut over_kernels,
                        } += 1;
                        continue;
                    }
                };
                // One lowering per class: a representative of a class already output stands
                // for it. A refused representative leaves the class open to another.
                if let Some(check) = &self.lowerable {
                    if !out.distinct.contains(&class_form) {
                        if let Err(reason) = check(&program) {
                            out.refused(reason);
                            continue;
                        }
                    }
                }
                if out.accept(class_form, &s, cost, self.compaction == Compaction::None)
                    && out.candidates.len() >= self.max_candidates
                {
                    stop = ExtractStop::CandidateLimit(self.max_candidates);
                    break;
                }
                continue;
            };
            expanded += 1;
            // Operand swaps left out are ≈ₚ a sibling: pruned without being built.
            equivalent += x.nodes[h as usize].len() - options[h as usize].len();
            // A class holding the `get` a picked fused reduction needs picks it: any other
            // pick leaves that component dead.
            let required = self
                .prune_dead_components
                .then(|| required_get(x, &s, h))
                .flatten();
            base_union.fill(0);
            for other in holes.iter().filter(|k| **k != h) {
                add_cheapest(x, &mut base_union, *other);
            }
            let base_cost = hole_estimate(x, &s, &base_union);
            needed.clear();
            if dead_before_push {
                unread_components(x, &s, met, &mut needed);
                needed.retain(|b| *b != h);
                needed.sort_unstable();
                needed.dedup();
            }
            for &i in &options[h as usize] {
                if required.is_some_and(|r| r != Ok(i)) {
                    dead_components += 1;
                    continue;
                }
                let kids = &x.nodes[h as usize][i as usize].1;
                if reaches(x, &s, kids, h, false, &mut scratch) {
                    continue; // would close a cycle
                }
                s[h as usize] = i;
                let lowerable = loads_only_after_pick(x, &s, h);
                debug_assert_eq!(lowerable, loads_only(x, &s));
                s[h as usize] = NONE;
                if !lowerable {
                    continue;
                }
                // The child's estimate: its picks' costs, plus the cheapest programs of the
                // other holes and of each child class that becomes a new hole, once each.
                let mut child = cost.saturating_add(x.pick_cost[h as usize][i as usize]);
                reached.clear();
                in_reached.clear();
                for k in kids {
                    if !visited[*k as usize] && *k != h && in_reached.mark(*k) {
                        reached.push(*k);
                    }
                }
                let trail_len = trail.len();
                trail.push((at, h, i));
                // Unit propagation: a class the pick makes reachable that has one e-node can
                // only be resolved one way, so it is resolved here, and so are the one-node
                // classes that pick reaches in turn. Resolving them one state at a time gave
                // the same programs (the fewest-nodes order takes such holes first anyway) at
                // the price of a walk and the pruning checks per forced pick.
                s[h as usize] = i;
                let mut dead = false;
                let mut next = 0;
                while let Some(&k) = reached.get(next).filter(|_| self.unit_propagation) {
                    next += 1;
                    // `reached` holds each class once, none of them picked (picks are reachable).
                    let required = self
                        .prune_dead_components
                        .then(|| required_get(x, &s, k))
                        .flatten();
                    let only = match (required, options[k as usize].as_slice()) {
                        (Some(Ok(j)), ks) if ks.contains(&j) => j,
                        (Some(_), _) => {
                            dead = true;
                            break;
                        }
                        (None, &[only]) => only,
                        (None, many) => {
                            // Forced too: a class all of whose e-nodes but one would close a
                            // cycle or partition a computed tile (or put a partition above
                            // one), failures no later pick undoes; with none left, no
                            // completion resolves it. With the checks before the push, also
                            // an e-node that would be pruned as this child's own pick: a
                            // fused reduction with a component no hole can reach, or
                            // computing a value twice. Those failures are final too (picks
                            // only remove paths), and catching them here saves a walk of
                            // the child on every branch that dies one pick later.
                            let mut viable = many.iter().copied().filter(|&j| {
                                let grandkids = &x.nodes[k as usize][j as usize].1;
                                if reaches(x, &s, grandkids, k, false, &mut scratch) {
                                    return false;
                                }
                                s[k as usize] = j;
                                let mut viable = loads_only_after_pick(x, &s, k);
                                if viable && lookahead && dead_before_push {
                                    // Holes once `k` picks `j`: the walk's, those this child
                                    // reached so far and `j`'s operands.
                                    let is_hole = |c: u32| {
                                        s[c as usize] == NONE
                                            && (visited[c as usize]
                                                || in_reached.contains(c)
                                                || grandkids.contains(&c))
                                    };
                                    viable = !leaves_component_unreachable(
                                        x,
                                        &s,
                                        k,
                                        is_hole,
                                        &open,
                                        &mut back_marks,
                                        &mut back_stack,
                                    );
                                }
                                if viable && lookahead {
                                    viable = !computes_twice_directly(x, &s, &[k], &mut twice_seen);
                                }
                                s[k as usize] = NONE;
                                viable
                            });
                            match (viable.next(), viable.next()) {
                                (Some(j), None) => j,
                                (None, _) => {
                                    dead = true;
                                    break;
                                }
                                _ => continue,
                            }
                        }
                    };
                    let grandkids = &x.nodes[k as usize][only as usize].1;
                    if reaches(x, &s, grandkids, k, false, &mut scratch) {
                        dead = true; // its only e-node closes a cycle
                        break;
                    }
                    s[k as usize] = only;
                    forced_picks.push(k);
                    let lowerable = loads_only_after_pick(x, &s, k);
                    debug_assert_eq!(lowerable, loads_only(x, &s));
                    if !lowerable {
                        dead = true;
                        break;
                    }
                    child = child.saturating_add(x.pick_cost[k as usize][only as usize]);
                    for g in grandkids {
                        if !visited[*g as usize] && *g != h && in_reached.mark(*g) {
                            reached.push(*g);
                        }
                    }
                    trail.push(((trail.len() - 1) as u32, k, only));
                }
                // A class holding a needed `get` that this child leaves unresolved and that no
                // hole reaches through unresolved classes is never resolved: the component
                // is dead in every completion, as the checks after the walk would find.
                // Caught here, the child is neither pushed nor walked.
                if !dead && dead_before_push {
                    let is_hole = |c: u32| {
                        s[c as usize] == NONE && (visited[c as usize] || in_reached.contains(c))
                    };
                    for &b in &needed {
                        if s[b as usize] == NONE
                            && unreachable_from_holes(
                                x,
                                &s,
                                b,
                                is_hole,
                                &open,
                                &mut back_marks,
                                &mut back_stack,
                            )
                        {
                            dead = true;
                            break;
                        }
                    }
                    // The fused reductions this child picks: each component a reader needs
                    // is read by the one `get` the e-graph holds for it.
                    dead = dead
                        || std::iter::once(&h).chain(&forced_picks).any(|&t| {
                            leaves_component_unreachable(
                                x,
                                &s,
                                t,
                                is_hole,
                                &open,
                                &mut back_marks,
                                &mut back_stack,
                            )
                        });
                    if dead {
                        dead_components += 1;
                    }
                }
                if !dead && self.check_before_push {
                    forced_picks.push(h);
                    dead = computes_twice_directly(x, &s, &forced_picks, &mut twice_seen);
                    forced_picks.pop();
                    if dead {
                        recomputed += 1;
                    }
                }
                if !dead {
                    // The other holes' share less what this child resolves of it, plus
                    // what its new holes add.
                    let in_base = |c: u32| has(&base_union, c as usize);
                    let resolved = std::iter::once(h)
                        .chain(forced_picks.iter().copied())
                        .filter(|c| in_base(*c))
                        .fold(0u64, |t, c| t.saturating_add(cheapest_pick(x, c)));
                    union.fill(0);
                    for k in reached.iter().filter(|k| s[**k as usize] == NONE) {
                        add_cheapest(x, &mut union, *k);
                    }
                    for (w, b) in union.iter_mut().zip(&base_union) {
                        *w &= !b;
                    }
                    child = child
                        .saturating_add(base_cost - resolved.min(base_cost))
                        .saturating_add(hole_estimate(x, &s, &union));
                }
                s[h as usize] = NONE;
                for k in forced_picks.drain(..) {
                    s[k as usize] = NONE;
                }
                if dead {
                    trail.truncate(trail_len);
                    continue;
                }
                forced += trail.len() - trail_len - 1;
                worklist.push((Reverse(child), (trail.len() - 1) as u32));
            }
        }
        if let Some(q) = queue.as_mut() {
            q.drain(&mut out);
        }
        let Outcomes {
            distinct,
            candidates,
            complete,
            not_lowerable,
            first_refusal,
            deferred,
        } = out;
        let equivalent = equivalent + deferred.equivalent;
        let no_launch_order = no_launch_order + deferred.count(Refusal::NoLaunchOrder);
        let dead_components = dead_components + deferred.count(Refusal::DeadComponent);
        let rejected = rejected + deferred.count(Refusal::NoLaunchOrderFound);
        let over_kernels = over_kernels + deferred.count(Refusal::OverKernels);
        ExtractReport {
            stop,
            expanded,
            walked,
            complete,
            rejected,
            no_launch_order,
            over_kernels,
            recomputed,
            pointwise_kernels,
            dead_components,
            forced,
            equivalent,
            not_lowerable,
            first_refusal,
            distinct: distinct.len(),
            seconds: start.elapsed().as_secs_f64(),
            candidates,
        }
    }
}

/// What the complete programs of a run came to.
#[derive(Default)]
struct Outcomes {
    /// The ≈ classes output.
    distinct: FxHashSet<Vec<u32>>,
    candidates: Vec<Candidate>,
    complete: usize,
    not_lowerable: usize,
    first_refusal: Option<String>,
    /// Counts decided by a verdict of the lowering queue.
    deferred: Deferred,
}

impl Outcomes {
    /// A complete program the backend lowers (or one of a class already output, which needs no
    /// lowering): counted, and output when its class is new or every program is. True when it
    /// was output.
    fn accept(&mut self, class_form: Vec<u32>, choice: &Choice, cost: u64, every: bool) -> bool {
        self.complete += 1;
        let new = self.distinct.insert(class_form);
        if new || every {
            self.candidates.push(Candidate::new(choice, cost));
        }
        new || every
    }

    /// A complete program the backend refuses: its class stays open to another.
    fn refused(&mut self, reason: String) {
        self.not_lowerable += 1;
        self.first_refusal.get_or_insert(reason);
    }
}

/// A complete program rebuilt as a function, if it passes the checks besides lowering that
/// need the function: no dead component, a launch order (`summarize`), and at most
/// `max_kernels` kernels.
fn rebuilt(
    x: &ExtractGraph,
    choice: &Choice,
    max_kernels: Option<usize>,
) -> Result<Function, Refusal> {
    let mut program = reconstruct(x, choice, "");
    if !no_dead_components(&program, &x.g.egraph.analysis.env) {
        return Err(Refusal::DeadComponent);
    }
    let summary = summarize(&mut program);
    if !summary.launch_order {
        return Err(Refusal::NoLaunchOrderFound);
    }
    if max_kernels.is_some_and(|max| summary.kernels > max) {
        return Err(Refusal::OverKernels);
    }
    Ok(program)
}

/// Why a complete program is refused before lowering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// `launch_order_impossible` on the complete program.
    NoLaunchOrder,
    /// `no_dead_components` on the rebuilt function.
    DeadComponent,
    /// `summarize` found no launch order.
    NoLaunchOrderFound,
    /// More kernels than `max_kernels`.
    OverKernels,
}

/// Counts the lowering queue's verdicts decide: a complete program refused before lowering
/// whose class had a program waiting counts as ≈ an output program if that one is output.
#[derive(Default)]
struct Deferred {
    equivalent: usize,
    refusals: Vec<Refusal>,
}

impl Deferred {
    fn count(&self, r: Refusal) -> usize {
        self.refusals.iter().filter(|x| **x == r).count()
    }
}

/// The lowering worker's verdict on a complete program.
enum Verdict {
    /// Lowered: its class is output.
    Lowered,
    Refused(String),
    /// Refused by a check before lowering (`rebuilt`).
    Before(Refusal),
    /// Not lowered, as a program of its class was output before it (true), or as it was
    /// refused before it was sent and no program of its class was output (false).
    ClassOutput(bool),
}

/// Rebuilds a complete program as a function and checks it (`rebuilt`).
type Rebuild<'scope> = Box<dyn Fn(&Choice) -> Result<Function, Refusal> + Send + 'scope>;

/// Complete programs waiting to be rebuilt, checked and lowered by a worker thread while the
/// search goes on (on MHA decode these took half the search's time). The worker takes them in
/// submission order and keeps the classes output, so it decides, as checking each program in
/// turn would, whether a program's class was output by an earlier one (early compaction
/// prunes such a program before its checks; `after` counts it once it passes them, without
/// lowering it). The verdicts are recorded in submission order too, so what a run outputs and
/// counts does not depend on the worker's timing, and the candidate limit is decided by
/// draining every verdict once the waiting programs could reach it.
struct LoweringQueue<'scope> {
    jobs: Option<std::sync::mpsc::Sender<(Vec<u32>, Option<Choice>)>>,
    verdicts: std::sync::mpsc::Receiver<Verdict>,
    worker: Option<std::thread::ScopedJoinHandle<'scope, ()>>,
    /// Each waiting program's class, choice, cost and refusal before it was sent, in
    /// submission order.
    waiting: std::collections::VecDeque<(Vec<u32>, Choice, u64, Option<Refusal>)>,
    /// How many programs of each class wait.
    classes: FxHashMap<Vec<u32>, usize>,
    early: bool,
}

/// Waiting programs past this many hold the search until the worker catches up: each holds
/// two choices.
const MAX_WAITING: usize = 256;

impl<'scope> LoweringQueue<'scope> {
    fn new<'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        check: LowerCheck,
        rebuild: impl Fn(&Choice) -> Result<Function, Refusal> + Send + 'scope,
        early: bool,
    ) -> LoweringQueue<'scope> {
        let rebuild: Rebuild<'scope> = Box::new(rebuild);
        let (jobs, inbox) = std::sync::mpsc::channel::<(Vec<u32>, Option<Choice>)>();
        let (outbox, verdicts) = std::sync::mpsc::channel();
        let worker = scope.spawn(move || {
            let mut output: FxHashSet<Vec<u32>> = FxHashSet::default();
            for (class_form, choice) in inbox {
                let verdict = match choice {
                    _ if early && output.contains(&class_form) => Verdict::ClassOutput(true),
                    None => Verdict::ClassOutput(false),
                    Some(choice) => match rebuild(&choice) {
                        Err(refusal) => Verdict::Before(refusal),
                        Ok(_) if output.contains(&class_form) => Verdict::ClassOutput(true),
                        Ok(f) => match check(&f) {
                            Ok(()) => {
                                output.insert(class_form);
                                Verdict::Lowered
                            }
                            Err(reason) => Verdict::Refused(reason),
                        },
                    },
                };
                if outbox.send(verdict).is_err() {
                    break;
                }
            }
        });
        LoweringQueue {
            jobs: Some(jobs),
            verdicts,
            worker: Some(worker),
            waiting: Default::default(),
            classes: Default::default(),
            early,
        }
    }

    fn len(&self) -> usize {
        self.waiting.len()
    }

    fn waits_for(&self, class_form: &[u32]) -> bool {
        self.classes.contains_key(class_form)
    }

    /// Sends a complete program (its choice) to be rebuilt, checked and lowered, or (`None`,
    /// with its refusal) one refused before it was sent whose count depends on the verdict of
    /// a program of its class that waits.
    fn submit(
        &mut self,
        program: Option<Choice>,
        class_form: Vec<u32>,
        choice: Choice,
        cost: u64,
        refusal: Option<Refusal>,
    ) {
        if let Some(jobs) = &self.jobs {
            if jobs.send((class_form.clone(), program)).is_ok() {
                *self.classes.entry(class_form.clone()).or_default() += 1;
                self.waiting.push_back((class_form, choice, cost, refusal));
                return;
            }
        }
        self.worker_died();
    }

    /// Records the oldest waiting program's verdict; `wait` blocks for it.
    fn receive(&mut self, out: &mut Outcomes, wait: bool) -> bool {
        if self.waiting.is_empty() {
            return false;
        }
        let verdict = if wait {
            match self.verdicts.recv() {
                Ok(v) => v,
                Err(_) => self.worker_died(),
            }
        } else {
            match self.verdicts.try_recv() {
                Ok(v) => v,
                Err(std::sync::mpsc::TryRecvError::Empty) => return false,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => self.worker_died(),
            }
        };
        let Some((class_form, choice, cost, refusal)) = self.waiting.pop_front() else {
            return false;
        };
        if let Some(n) = self.classes.get_mut(&class_form) {
            *n -= 1;
            if *n == 0 {
                self.classes.remove(&class_form);
            }
        }
        match (verdict, refusal) {
            (Verdict::Lowered, _) => {
                out.accept(class_form, &choice, cost, false);
            }
            (Verdict::Refused(reason), _) => out.refused(reason),
            (Verdict::Before(r), _) | (Verdict::ClassOutput(false), Some(r)) => {
                out.deferred.refusals.push(r)
            }
            (Verdict::ClassOutput(true), _) if self.early => out.deferred.equivalent += 1,
            (Verdict::ClassOutput(true), _) => out.complete += 1,
            (Verdict::ClassOutput(false), None) => {}
        }
        true
    }

    /// Records the verdicts that are in.
    fn poll(&mut self, out: &mut Outcomes) {
        while self.receive(out, false) {}
    }

    /// Waits until few enough programs wait.
    fn bound(&mut self, out: &mut Outcomes) {
        while self.waiting.len() > MAX_WAITING && self.receive(out, true) {}
    }

    /// Waits for every verdict.
    fn drain(&mut self, out: &mut Outcomes) {
        while self.receive(out, true) {}
    }

    /// The worker ended without a verdict: only a panic in rebuilding or in the backend's
    /// check does that, and it is raised here as it would have been on this thread.
    fn worker_died(&mut self) -> ! {
        self.jobs = None;
        if let Some(Err(panic)) = self.worker.take().map(|w| w.join()) {
            std::panic::resume_unwind(panic);
        }
        unreachable!("the lowering worker ended without a panic while programs waited")
    }
}

impl Drop for LoweringQueue<'_> {
    fn drop(&mut self) {
        // Closing the job channel ends the worker's loop.
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// The search's large tables and `Vec`s between two looks at the resident size: each
/// doubles its block when full, writing its contents into fresh pages while the old block is
/// still held, and at MHA decode's sizes one such growth (hundreds of MiB to gigabytes) took
/// the search 1.3 GiB past an 8 GiB limit between two looks. A table counts as grown
/// already when, growing as fast as since the last look, it could fill before the next one.
#[derive(Default)]
struct GrowthWatch {
    /// Each table's length at the last look, in the order `ahead` is given them.
    last: Vec<usize>,
}

impl GrowthWatch {
    /// The bytes that the tables, given as (length, capacity, element bytes), may add to the
    /// resident size by growing before the next look: the contents copied by each growth.
    fn ahead(&mut self, tables: &[(usize, usize, usize)]) -> usize {
        self.last.resize(tables.len(), 0);
        let mut bytes = 0;
        for (&(len, capacity, size), last) in tables.iter().zip(&mut self.last) {
            // Twice the growth since the last look, so an accelerating table is seen in time.
            let margin = 2 * len.saturating_sub(*last) + 1;
            if len + margin >= capacity {
                bytes += capacity * size;
            }
            *last = len;
        }
        bytes
    }
}

/// The process's resident memory in MiB (`VmRSS` of `/proc/self/status`), where the system
/// reports it.
pub fn resident_mib() -> Option<usize> {
    proc_mib("/proc/self/status", "VmRSS:")
}

/// A `field   N kB` line of a Linux `/proc` file, in MiB; `None` where there is no such file
/// or line.
pub fn proc_mib(file: &str, field: &str) -> Option<usize> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// Facts about a candidate for its summary line and `--stats=json`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    /// Kernel launches: each connected region of tiled values, plus one per tensor-level
    /// operator left outside any region (its default tiling).
    pub kernels: usize,
    /// Tensor-level intermediates written by one kernel and read by another.
    pub stored: Vec<String>,
    pub axes: Vec<String>,
    /// False when kernels would read global-memory values they write themselves: such a
    /// candidate has no launch order and is not lowerable.
    pub launch_order: bool,
}

impl Summary {
    pub fn line(&self) -> String {
        let stored = if self.stored.is_empty() {
            "none".to_string()
        } else {
            self.stored.join(", ")
        };
        let axes = if self.axes.is_empty() {
            "none".to_string()
        } else {
            self.axes.join(", ")
        };
        format!(
            "{} kernel{}; stored: {stored}; parallel axes: {axes}",
            self.kernels,
            if self.kernels == 1 { "" } else { "s" }
        )
    }
}

/// Rebuilds candidate `choice` as a function named `name` (verified types filled in).
pub fn reconstruct(x: &ExtractGraph, choice: &Choice, name: &str) -> Function {
    let eg = &x.g.egraph;
    let alias = shared_classes(x, choice);
    let mut body = Body::default();
    // Inputs first, in parameter order: every input of the source, reachable or not.
    let mut inputs: Vec<(u32, u32)> = Vec::new();
    for (c, ns) in x.nodes.iter().enumerate() {
        for (n, _) in ns {
            if let Op::Input(pos, _) = n.op {
                inputs.push((pos, c as u32));
            }
        }
    }
    inputs.sort();
    inputs.dedup_by_key(|i| i.0);
    let mut node_of: Vec<Option<NodeId>> = vec![None; x.ids.len()];
    for (_, c) in &inputs {
        let Some((n, _)) = x.nodes[*c as usize]
            .iter()
            .find(|(n, _)| matches!(n.op, Op::Input(..)))
        else {
            continue;
        };
        let id = body.push(Node {
            kind: ExprKind::Input,
            name: None,
            annot: n.leaf_type(),
            span: Default::default(),
            ty: eg[x.ids[*c as usize]].data.clone(),
        });
        body.params.push(id);
        node_of[*c as usize] = Some(id);
    }
    // Post-order from the results.
    let mut stack: Vec<(u32, bool)> = x
        .roots
        .iter()
        .rev()
        .map(|r| (alias[*r as usize], false))
        .collect();
    while let Some((c, done)) = stack.pop() {
        if node_of[c as usize].is_some() {
            continue;
        }
        let Some((n, kids)) = x.op(c, choice) else {
            continue;
        };
        if done {
            let operands: Vec<NodeId> = kids
                .iter()
                .map(|k| node_of[alias[*k as usize] as usize].unwrap_or(NodeId(0)))
                .collect();
            let id = body.push(Node {
                kind: n.to_expr_kind().with_operands(&operands),
                name: None,
                annot: n.leaf_type(),
                span: Default::default(),
                ty: eg[x.ids[c as usize]].data.clone(),
            });
            node_of[c as usize] = Some(id);
        } else {
            stack.push((c, true));
            stack.extend(kids.iter().rev().map(|k| (alias[*k as usize], false)));
        }
    }
    body.results = x
        .roots
        .iter()
        .map(|r| node_of[alias[*r as usize] as usize].unwrap_or(NodeId(0)))
        .collect();
    Function {
        name: name.to_string(),
        name_span: x.g.name_span,
        bindings: x.g.bindings.clone(),
        body,
        comment: None,
    }
}

/// For each class, the class that stands for it in the program: the lowest-numbered class
/// with the same canonical form. Two classes the e-graph did not merge can hold ≈ values (a
/// view chain written in two orders, say); the program computes such a value once, so that
/// kernels, stores and validity depend only on the candidate's canonical form.
fn shared_classes(x: &ExtractGraph, choice: &Choice) -> Vec<u32> {
    let mut facts = WalkFacts::default();
    Walk::roots(x, choice, &mut Interner::default(), &mut facts);
    let mut first: FxHashMap<u32, u32> = FxHashMap::default();
    (0..x.ids.len() as u32)
        .map(|c| match facts.memo[c as usize] {
            NONE => c,
            id => *first.entry(id).or_insert(c),
        })
        .collect()
}

/// Kernel regions, stored intermediates and parallel axes of a reconstructed candidate. Stored
/// intermediates are named (`stored0`, …) so the summary can refer to them.
pub fn summarize(f: &mut Function) -> Summary {
    // The same partition the backend lowers.
    let graph = crate::lower::kernel_graph(f);
    let nodes = &f.body.nodes;
    let stored_ids: Vec<usize> = graph
        .intermediates
        .iter()
        .map(|i| i.index())
        .filter(|i| matches!(nodes[*i].ty, Some(Type::Tensor(_))))
        .collect();
    let stored: Vec<String> = stored_ids
        .iter()
        .enumerate()
        .filter_map(|(k, i)| match &nodes[*i].ty {
            Some(Type::Tensor(t)) => Some(format!("stored{k}: {t}")),
            _ => None,
        })
        .collect();
    let mut axes: Vec<Sym> = nodes
        .iter()
        .filter_map(|node| match node.ty.as_ref() {
            Some(Type::Tensor(t)) => Some(t.par.axes().cloned().collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect();
    axes.sort();
    axes.dedup();
    for (k, i) in stored_ids.into_iter().enumerate() {
        f.body.nodes[i].name = Some(format!("stored{k}"));
    }
    Summary {
        kernels: graph.kernels.len(),
        stored,
        axes: axes.into_iter().map(String::from).collect(),
        launch_order: graph.launch_order,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random partial and complete programs of a saturated example, built top-down as the
    /// extractor builds them (a valid e-node for a hole, no cycle), each a different size.
    fn random_programs(x: &ExtractGraph, count: usize, seed: u64) -> Vec<Choice> {
        let mut state = seed;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let mut marks = Marks::new(x.ids.len());
        let mut programs = Vec::new();
        for _ in 0..count {
            let mut s: Choice = vec![NONE; x.ids.len()];
            let steps = next(60);
            for _ in 0..steps {
                let mut facts = WalkFacts::default();
                Walk::roots(x, &s, &mut Interner::default(), &mut facts);
                if facts.holes.is_empty() {
                    break;
                }
                let h = facts.holes[next(facts.holes.len())];
                let options: Vec<u32> = (0..x.nodes[h as usize].len() as u32)
                    .filter(|i| {
                        let kids = &x.nodes[h as usize][*i as usize].1;
                        !reaches(x, &s, kids, h, false, &mut marks)
                    })
                    .collect();
                if options.is_empty() {
                    break;
                }
                s[h as usize] = options[next(options.len())];
            }
            programs.push(s);
        }
        programs
    }

    /// The facts and scratch space the extractor reuses from one partial program to the next
    /// give what fresh ones give: a reset that left an entry of the last program behind
    /// would change canonical forms, holes or validity.
    #[test]
    fn reused_walk_facts_and_scratch_give_what_fresh_ones_give() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(root.join("examples/rmsnorm_gemm.ef")).unwrap();
        let mut m = crate::parse::parse_module(&text, 0).unwrap();
        crate::passes::verify::verify_module(&mut m).unwrap();
        let mut g = TypedEGraph::from_function(&m.funcs[0], &m.reducers).unwrap();
        crate::egraph::runner::Runner::default().run(&mut g, &crate::egraph::rules::all_rules());
        let x = ExtractGraph::new(&g).unwrap();
        let programs = random_programs(&x, 300, 0x9e37_79b9_7f4a_7c15);
        assert!(programs
            .iter()
            .any(|s| s.iter().filter(|n| **n != NONE).count() > 20));
        let mut interner = Interner::default();
        let mut reused = WalkFacts::default();
        let fresh_scratch = OnceScratch::new;
        let mut reused_scratch = fresh_scratch(x.ids.len());
        let mut checked = [0usize; 2];
        for (i, s) in programs.iter().enumerate() {
            let form = Walk::roots(&x, s, &mut interner, &mut reused);
            let mut fresh = WalkFacts::default();
            let expected = Walk::roots(&x, s, &mut interner, &mut fresh);
            assert_eq!(form, expected, "program {i}: canonical form");
            assert_eq!(reused.memo, fresh.memo, "program {i}: canonical ids");
            assert_eq!(
                reused.visited, fresh.visited,
                "program {i}: visited classes"
            );
            assert_eq!(reused.met, fresh.met, "program {i}: classes met");
            assert_eq!(reused.holes, fresh.holes, "program {i}: holes");
            // As `Extractor::run` judges it: classes out of the completions' reach settled.
            let mut hole_reach = Vec::new();
            open_reach(&x, s, &fresh.holes, &mut hole_reach, &mut Vec::new());
            if i == 150 {
                // Across a wrap of the generation counter too.
                reused_scratch.memo.generation = u32::MAX;
            }
            let once = computed_once(
                &x,
                s,
                (&reused.visited, &reused.met),
                &hole_reach,
                &mut reused_scratch,
            );
            let expected_once = computed_once(
                &x,
                s,
                (&fresh.visited, &fresh.met),
                &hole_reach,
                &mut fresh_scratch(x.ids.len()),
            );
            assert_eq!(once, expected_once, "program {i}: computed once");
            checked[usize::from(once)] += 1;
        }
        // Both verdicts occur, so the comparison says something about each.
        assert!(checked[0] > 0 && checked[1] > 0, "verdicts: {checked:?}");
    }

    #[test]
    fn a_kernel_chain_counts_the_kernels_on_the_longest_path() {
        let sorted = |mut e: Vec<(u32, u32)>| {
            e.sort_unstable();
            e
        };
        assert_eq!(kernel_chain(&[]), Some(0));
        assert_eq!(kernel_chain(&[(5, 9)]), Some(2));
        // 1 → 2 → 3 → 4 beside 1 → 4: four kernels in a row.
        assert_eq!(
            kernel_chain(&sorted(vec![(1, 2), (2, 3), (3, 4), (1, 4)])),
            Some(4)
        );
        // Two writers feeding one reader, then a reader of that: three.
        assert_eq!(kernel_chain(&sorted(vec![(7, 3), (8, 3), (3, 1)])), Some(3));
        // A cycle has no launch order.
        let cycle = sorted(vec![(1, 2), (2, 1), (2, 3)]);
        assert_eq!(kernel_chain(&cycle), None);
        assert!(kernel_cycle(&cycle));
    }

    #[test]
    fn marks_are_empty_after_each_clear_even_when_the_generation_wraps() {
        let mut m = Marks::new(4);
        assert!(m.mark(1));
        assert!(!m.mark(1));
        m.clear();
        assert!(m.mark(1), "a clear empties the set");
        // A class marked in the last generation before the counter wraps must not count as
        // marked in the generation after it (which reuses the numbers from 1).
        m.generation = u32::MAX;
        assert!(m.mark(2));
        m.marks[3] = 1; // what a mark from generation 1, long ago, left behind
        m.clear();
        assert_eq!(m.generation, 1);
        for c in 0..4 {
            assert!(m.mark(c), "class {c} was left marked across the wrap");
        }
    }

    /// A one-statement function named `name`, for a stand-in backend to judge by name.
    fn named_function(name: &str) -> Function {
        let src = "func f where N = 4 {\n  x: tensor<N, f32> = input\n  return exp(x)\n}\n";
        let mut m = crate::parse::parse_module(src, 0).expect("parses");
        crate::passes::verify::verify_module(&mut m).expect("verifies");
        let mut f = m.funcs.remove(0);
        f.name = name.to_string();
        f
    }

    /// Stand-in programs for the queue, by their choice's first entry.
    const LOWERS: u32 = 0;
    const REFUSED: u32 = 1;
    const DEAD_COMPONENT: u32 = 2;

    /// The queue with a stand-in backend that lowers the functions named `lowers`, counting
    /// its calls, and a stand-in rebuild that refuses `DEAD_COMPONENT` programs.
    fn stand_in_queue<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        calls: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
        early: bool,
    ) -> LoweringQueue<'scope> {
        let calls = calls.clone();
        let check: LowerCheck = std::sync::Arc::new(move |f: &Function| {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match f.name.as_str() {
                "lowers" => Ok(()),
                _ => Err("refused".to_string()),
            }
        });
        let rebuild = |choice: &Choice| match choice[0] {
            LOWERS => Ok(named_function("lowers")),
            REFUSED => Ok(named_function("refused")),
            _ => Err(Refusal::DeadComponent),
        };
        LoweringQueue::new(scope, check, rebuild, early)
    }

    /// A table counts as grown, its contents as bytes the next growth writes, when growing
    /// as fast as since the last look it could fill before the next look; one far from full,
    /// or one that stopped growing short of full, does not.
    #[test]
    fn a_table_that_may_fill_before_the_next_look_counts_as_grown() {
        let mut watch = GrowthWatch::default();
        assert_eq!(watch.ahead(&[(10, 1000, 8)]), 0);
        // 300 more: 310 + 2 × 300 + 1 < 1000.
        assert_eq!(watch.ahead(&[(310, 1000, 8)]), 0);
        // 300 more again: 610 + 601 ≥ 1000.
        assert_eq!(watch.ahead(&[(610, 1000, 8)]), 8000);
        assert_eq!(watch.ahead(&[(610, 1000, 8)]), 0);
        assert_eq!(watch.ahead(&[(1000, 1000, 8)]), 8000);
        let mut two = GrowthWatch::default();
        assert_eq!(
            two.ahead(&[(16, 16, 4), (50, 100, 1), (0, 100, 1)]),
            64 + 100
        );
    }

    /// Early compaction: a program refused before it was sent while a program of its class
    /// waits counts as ≈ an output program when that one is lowered, and as its own refusal
    /// when that one is refused — as checking them in turn would count it.
    #[test]
    fn a_refusal_while_its_class_waits_is_counted_by_that_class_verdict() {
        for (first, output) in [(LOWERS, 1), (REFUSED, 0)] {
            let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let out = std::thread::scope(|scope| {
                let mut queue = stand_in_queue(scope, &calls, true);
                let mut out = Outcomes::default();
                let class = vec![7u32, 1];
                queue.submit(Some(vec![first]), class.clone(), vec![first], 5, None);
                assert!(queue.waits_for(&class));
                let refusal = Some(Refusal::NoLaunchOrder);
                queue.submit(None, class.clone(), Choice::new(), 6, refusal);
                queue.drain(&mut out);
                assert!(!queue.waits_for(&class) && queue.len() == 0);
                out
            });
            assert_eq!(out.candidates.len(), output);
            assert_eq!(out.deferred.equivalent, output);
            assert_eq!(out.deferred.count(Refusal::NoLaunchOrder), 1 - output);
            assert_eq!(out.not_lowerable, 1 - output);
            assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        }
    }

    /// A program whose class an earlier waiting program output is not lowered: early
    /// compaction counts it as ≈ that one without checking it, `after` checks it and counts
    /// it as a complete program; a refused program leaves its class open, so the next one of
    /// the class is lowered and output.
    #[test]
    fn the_queue_lowers_one_program_per_output_class_in_submission_order() {
        for early in [true, false] {
            let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let out = std::thread::scope(|scope| {
                let mut queue = stand_in_queue(scope, &calls, early);
                let mut out = Outcomes::default();
                let (a, b) = (vec![1u32], vec![2u32]);
                for (program, class, cost) in [
                    (REFUSED, &a, 1),
                    (DEAD_COMPONENT, &a, 2),
                    (LOWERS, &a, 3),
                    (LOWERS, &a, 4),
                    (DEAD_COMPONENT, &a, 5),
                    (LOWERS, &b, 6),
                ] {
                    let choice = vec![program];
                    queue.submit(Some(choice.clone()), class.clone(), choice, cost, None);
                }
                queue.drain(&mut out);
                out
            });
            let costs: Vec<u64> = out.candidates.iter().map(|c| c.cost).collect();
            assert_eq!(costs, [3, 6]);
            assert_eq!(out.not_lowerable, 1);
            assert_eq!(out.first_refusal.as_deref(), Some("refused"));
            assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
            if early {
                // The fourth and fifth are ≈ the third, whatever their own checks say.
                assert_eq!((out.complete, out.deferred.equivalent), (2, 2));
                assert_eq!(out.deferred.count(Refusal::DeadComponent), 1);
            } else {
                assert_eq!((out.complete, out.deferred.equivalent), (3, 0));
                assert_eq!(out.deferred.count(Refusal::DeadComponent), 2);
            }
        }
    }
}
