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
//! candidates (rank-bounded extraction also takes from a lowest-bound-first order: `worklist`); `max_kernels` prunes by a kernel lower bound. The hole expanded next is the
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
//! Layout, one module per concept; this file holds the options (`Extractor`), the candidates
//! and the report:
//!
//! - `search`: the search itself (`Search`: seed, take, judge, complete, expand, finish);
//! - `extract_graph`: the e-graph as extraction sees it, and the cost estimates that order
//!   the worklist;
//! - `canon`: canonical forms (the walk, the interner);
//! - `reach`: what the holes can still reach;
//! - `validity`: each value once, no dead component;
//! - `kernels`: regions, kernel graph, launch order, kernel bounds;
//! - `context`: the hole context of ≈ₚ;
//! - `worklist`: the partial programs waiting, in one order or (rank-bounded) two;
//! - `queue`: the second thread;
//! - `memory`: the memory limit;
//! - `output`: rebuilt functions and their summaries.

use crate::ir::Function;
use std::time::Duration;

mod bound;
mod canon;
mod context;
mod extract_graph;
mod kernels;
mod memory;
mod output;
mod queue;
mod reach;
mod search;
mod validity;
mod work_floor;
mod worklist;

pub use bound::{RankBound, Scorer};
pub use canon::canonical_text;
pub use extract_graph::ExtractGraph;
pub use memory::{proc_mib, resident_mib};
pub use output::{reconstruct, summarize, Summary};
use search::Search;

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
    /// Rank-bounded extraction ended with every program expanded or pruned by its bound and
    /// this many ranked candidates: they are the best by the rank model.
    TopFound(usize),
    /// Rank-bounded extraction had no complete program with a legal schedule after this many
    /// seconds (`Extractor::unranked_after`).
    NothingRanked(f64),
    /// Rank-bounded extraction's best `top` had not changed for this many seconds
    /// (`Extractor::stall_limit`): they are the best found, not proven the best.
    Stalled(f64),
    /// Another search made this one's answer unneeded (`Extractor::cancel`): the partitioned
    /// search racing a whole search that proved its best.
    Cancelled,
}

impl ExtractStop {
    /// Whether the search ended with nothing left to expand: its candidates are all there
    /// are, or (rank-bounded) the best `top` by the model.
    pub fn searched_all(&self) -> bool {
        matches!(self, ExtractStop::Exhausted | ExtractStop::TopFound(_))
    }
}

impl std::fmt::Display for ExtractStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExtractStop::Exhausted => f.write_str("exhausted"),
            ExtractStop::CandidateLimit(n) => write!(f, "candidate limit ({n}) reached"),
            ExtractStop::TimeLimit(s) => write!(f, "time limit ({s} s) reached"),
            ExtractStop::MemoryLimit(m) => write!(f, "memory limit ({m} MiB) reached"),
            ExtractStop::TopFound(k) => write!(f, "top {k} found"),
            ExtractStop::NothingRanked(s) => {
                write!(f, "no candidate with a legal schedule after {s} s")
            }
            ExtractStop::Stalled(s) => write!(f, "best unchanged for {s} s (stall limit)"),
            ExtractStop::Cancelled => f.write_str("cancelled"),
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
    /// The rank model's T̂ (µs) under rank-bounded extraction; `None` otherwise, or where no
    /// schedule is legal.
    pub estimate: Option<f64>,
}

impl Candidate {
    fn new(choice: &Choice, cost: u64) -> Candidate {
        Candidate {
            estimate: None,
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
    /// Partial programs pruned for a store read inside its own kernel (stored grids only:
    /// `validity::store_read_in_kernel`).
    pub store_read_in_kernel: usize,
    /// Partial programs pruned as ≈ₚ one already taken (early compaction only).
    pub equivalent: usize,
    /// Programs pruned by rank-bounded extraction: their bound is above the `top`-th best
    /// estimate found.
    pub over_bound: usize,
    /// Rank-bounded extraction: programs expanded when an estimate last entered the best
    /// `top` (read every 256 programs taken). Measured: a search can improve after 20 times
    /// the states of its last improvement (sliding-window GQA: 453,932 after ~20,000), so a
    /// search is never stopped for stalling.
    pub last_improvement: usize,
    /// Partial programs pruned by rank-bounded extraction because they compute a tile
    /// larger than any kernel holds (`rank::model::max_live_words`): no schedule is legal.
    pub too_large_value: usize,
    /// The first such value, described.
    pub first_too_large: Option<String>,
    /// Complete programs the backend refused to lower (see `Extractor::lowerable`).
    pub not_lowerable: usize,
    /// The backend's reason for the first refusal.
    pub first_refusal: Option<String>,
    /// E-nodes never picked because `lower` refuses them in any program (`ExtractGraph`'s
    /// `unlowerable`): programs with them are pruned at the pick, not refused once complete.
    pub unlowerable_enodes: usize,
    /// Distinct candidates (classes of ≈) among the complete ones.
    pub distinct: usize,
    /// Complete programs of a new class not output because they rename the parallel axes of
    /// a program output before them (`ir::alpha`; counted in `distinct` and `complete`).
    pub renamed: usize,
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
    /// Rank-bounded extraction (`bound`): complete programs are scored by the rank model (on
    /// the lowering worker) and a partial program whose admissible bound of that estimate is
    /// above the `top`-th best found is pruned; the output is the best `top`.
    pub rank_bound: Option<RankBound>,
    /// Rank-bounded extraction only: stop (`ExtractStop::NothingRanked`) when no complete
    /// program has had a legal schedule after this long, so that the caller can search
    /// another way (`extract` switches to walk order).
    pub unranked_after: Option<Duration>,
    /// Rank-bounded extraction only: stop (`ExtractStop::Stalled`) once some complete program
    /// is ranked and the best `top` have not changed for this long, nor for as long as the
    /// search had run when they last changed. Off by default (`extract` sets it): where the
    /// bound cannot prove the best (masked prefill), the search found them in its first
    /// seconds and spends the rest of its time limit finding nothing better.
    pub stall_limit: Option<Duration>,
    /// Stops the search (`ExtractStop::Cancelled`) once set, looked at with the limits.
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
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
    /// Rank-bounded extraction: the best estimate found, and the `top`-th once there are
    /// that many (µs).
    pub best_us: Option<f64>,
    pub kth_us: Option<f64>,
    /// Programs expanded when an estimate last entered the best `top`.
    pub last_improvement: usize,
}

pub type ProgressFn = std::sync::Arc<dyn Fn(&ExtractProgress) + Send + Sync>;

/// A backend's lowerability test for complete candidates (the extractor does not depend on
/// any backend).
pub type LowerCheck = std::sync::Arc<dyn Fn(&Function) -> Result<(), String> + Send + Sync>;

/// The lowering check as the lowering worker runs it: with rank-bounded extraction, the
/// scorer (lowering and estimate); otherwise the check, with no estimate.
fn worker_check(ex: &Extractor, check: &LowerCheck) -> Scorer {
    match &ex.rank_bound {
        Some(rb) => rb.score.clone(),
        None => {
            let check = check.clone();
            std::sync::Arc::new(move |f: &Function| check(f).map(|()| None))
        }
    }
}

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
            rank_bound: None,
            unranked_after: None,
            stall_limit: None,
            cancel: None,
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

    pub fn with_unranked_after(mut self, d: Option<Duration>) -> Self {
        self.unranked_after = d;
        self
    }

    pub fn with_cancel(
        mut self,
        flag: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    ) -> Self {
        self.cancel = flag;
        self
    }

    pub fn with_stall_limit(mut self, d: Option<Duration>) -> Self {
        self.stall_limit = d;
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

    pub fn with_rank_bound(mut self, rb: Option<RankBound>) -> Self {
        self.rank_bound = rb;
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
        std::thread::scope(|scope| Search::new(self, x, scope).run())
    }
}

#[cfg(test)]
mod tests {
    use super::canon::{Interner, Walk, WalkFacts};
    use super::reach::{open_reach, reaches, Marks};
    use super::validity::{computed_once, OnceScratch};
    use super::{Choice, ExtractGraph, NONE};
    use crate::egraph::graph::TypedEGraph;

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
