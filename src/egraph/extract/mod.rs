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
//!
//! Layout, one module per concept: `extract_graph` (the e-graph as extraction sees it, and
//! the cost estimates that order the worklist), `canon` (canonical forms), `reach` (what the
//! holes can still reach), `validity` (each value once, no dead component), `kernels`
//! (regions, kernel graph, launch order, kernel bounds), `context` (the hole context of ≈ₚ),
//! `queue` (the second thread), `memory` (the memory limit) and `output` (rebuilt functions
//! and their summaries). This file holds the options and the search itself (`run_in`).

use super::graph::TypedEGraph;
use super::lang::{ENode, Op};
use crate::ir::{BinaryOp, Body, DType, ExprKind, Function, Node, NodeId, Sym, Type};
use crate::lower::tiled;
use egg::Id;
use rustc_hash::{FxHashMap, FxHashSet};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

mod canon;
mod context;
mod extract_graph;
mod kernels;
mod memory;
mod output;
mod queue;
mod reach;
mod validity;

pub use canon::canonical_text;
use canon::*;
use context::*;
pub use extract_graph::ExtractGraph;
use extract_graph::*;
use kernels::*;
use memory::*;
pub use memory::{proc_mib, resident_mib};
pub use output::{reconstruct, summarize, Summary};
use queue::*;
use reach::*;
use validity::*;

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
    pub prune_without_launch_order: bool,
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
            prune_without_launch_order: true,
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

    /// Whether partial programs that no completion gives a launch order are pruned (on by
    /// default; `false` only to show, in tests, that the pruning loses no candidate).
    pub fn with_launch_order_pruning(mut self, on: bool) -> Self {
        self.prune_without_launch_order = on;
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
            if self.prune_without_launch_order && !holes.is_empty() && no_order(&mut launch_scratch)
            {
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
                let launch_order = !self.prune_without_launch_order
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
        crate::verify::verify_module(&mut m).unwrap();
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
}
