//! The search of Algorithm 1 (`Extractor::run`): partial programs taken from a worklist
//! cheapest first, each walked, checked, and then output as a candidate (complete) or
//! expanded at one hole (partial).
//!
//! `Search` holds the state of one run; its steps are methods: `new` seeds the worklist with
//! the empty program, `run` takes programs until the worklist is empty or a limit stops it
//! (`check_limits`), `take` restores a program from the trail and walks it, `judge` applies the
//! checks in order (`valid`, `hole_context_key`, `over_kernels`, `no_launch_order`), `complete`
//! (with `check_now`) decides a complete program, `expand` (with `child`, `propagate`,
//! `fails_before_push` and `estimate`) pushes the children of a partial one, and `finish`
//! turns the counts into the report.

use super::bound::BoundModel;
use super::canon::{Interner, SliceTable, Walk, WalkFacts};
use super::context::{hole_context, RegionScratch};
use super::extract_graph::{add_cheapest, cheapest_pick, hole_estimate, picked_cost, ExtractGraph};
use super::kernels::{
    has_pointwise_kernel, kernel_chain, kernel_cycle, kernel_lower_bound, launch_order_impossible,
    KernelView, LaunchScratch, Memo,
};
use super::memory::{resident_mib, GrowthWatch};
use super::queue::{rebuilt, LoweringQueue, Outcomes, Refusal};
use super::reach::{has, open_reach, reaches, readable_resolved, Marks};
use super::validity::{
    computed_once, computes_twice_directly, dead_component, leaves_component_unreachable,
    loads_only, loads_only_after_pick, required_get, store_read_in_kernel, unreachable_from_holes,
    unread_components, OnceScratch,
};
use super::worklist::Worklist;
use super::{
    Choice, Compaction, ExtractProgress, ExtractReport, ExtractStop, Extractor, HoleOrder, NONE,
};
use std::borrow::Cow;
use std::cmp::Reverse;
use std::time::{Duration, Instant};

/// The counts the report gives (see `ExtractReport`), besides those of complete programs
/// (`Outcomes`).
#[derive(Default)]
struct Counts {
    expanded: usize,
    /// Programs taken from the worklist (with the one a limit stopped at).
    taken: usize,
    /// Programs taken and walked.
    walked: usize,
    rejected: usize,
    no_launch_order: usize,
    over_kernels: usize,
    recomputed: usize,
    pointwise_kernels: usize,
    dead_components: usize,
    store_read_in_kernel: usize,
    equivalent: usize,
    forced: usize,
    /// Programs pruned by rank-bounded extraction's bound.
    over_bound: usize,
    /// Programs pruned by rank-bounded extraction for a value no schedule holds, and the
    /// first such value's class.
    too_large_value: usize,
    first_too_large: Option<u32>,
    /// `Outcomes::improvements` as last seen, and the programs expanded then.
    improvements: usize,
    last_improvement: usize,
    /// The time into the search when the best `top` last changed.
    improved_at: Duration,
}

/// One run of the search: the worklist, the trail of picks, the seen-set, what complete
/// programs came to, and the scratch space reused from one program to the next.
pub(super) struct Search<'scope, 'env> {
    ex: &'env Extractor,
    x: &'env ExtractGraph<'env>,
    start: Instant,
    /// Progress reports start after one second, then every quarter second.
    next_report: Duration,
    /// The e-nodes each class branches on (see `ExtractGraph::unswapped`): after and none
    /// construct every program, swaps included.
    options: Cow<'env, [Vec<u32>]>,
    /// The checks before the push: for dead components they need the classes no hole
    /// reaches settled (`open`); the lookahead applies them to newly reached classes too.
    dead_before_push: bool,
    lookahead: bool,
    readable_context: bool,
    /// Pruning compares partial programs under a finer relation than ≈: a fold over a
    /// stored collection keeps its own form. It is ≈ to `reduce … parallel=` but gives
    /// another kernel graph (the stack is written by one kernel and read by the next), so
    /// which of the two has a launch order is not a function of ≈, and pruning by ≈ lost
    /// classes (layernorm_gemm, counted before dead product components were rejected: 6,563
    /// in walk order, 6,627 fewest-first). Folds inside a
    /// kernel need no such care. Complete programs are then grouped by ≈ itself
    /// (`class_interner`).
    interner: Interner,
    class_interner: Interner,
    /// Early compaction's seen-set: a partial program's form and hole context as u32s.
    seen: SliceTable,
    context: Vec<u64>,
    seen_key: Vec<u32>,
    /// What complete programs came to: classes output, candidates, refusals.
    out: Outcomes,
    /// With a backend check, complete programs are lowered on another thread (not in
    /// `None` mode, which outputs every program and so needs each verdict at once).
    queue: Option<LoweringQueue<'scope>>,
    /// (parent, class, e-node); entry 0 is the empty program.
    trail: Vec<(u32, u32, u32)>,
    /// Partial programs by trail index (`Worklist`): cheapest first, and with rank-bounded
    /// extraction also lowest bound first, in turn.
    worklist: Worklist,
    /// The program being looked at (and, while a child is built, the child).
    s: Choice,
    /// The classes the program being looked at has picked.
    picks: Vec<u32>,
    sorted_picks: Vec<u32>,
    /// The cheapest programs of the holes, as sets of classes: the other holes' of an
    /// expanded one, and a child's.
    base_union: Vec<u64>,
    union: Vec<u64>,
    class_facts: WalkFacts,
    scratch: Marks,
    once_scratch: OnceScratch,
    launch_scratch: LaunchScratch,
    load_memo: Memo,
    context_reach: Vec<u64>,
    /// Unresolved classes holding a `get` that a picked fused reduction needs (see the
    /// check before a child is pushed).
    needed: Vec<u32>,
    back_marks: Marks,
    back_stack: Vec<u32>,
    twice_seen: Marks,
    pending: Vec<u32>,
    region_scratch: RegionScratch,
    all_reached: Vec<u64>,
    open: Vec<u64>,
    open_stack: Vec<u32>,
    growth: GrowthWatch,
    tables: Vec<(usize, usize, usize)>,
    /// The classes a child newly reaches, and those unit propagation picked.
    reached: Vec<u32>,
    forced_picks: Vec<u32>,
    /// `reached` as a set: the hole tests ask it once per class searched.
    in_reached: Marks,
    n: Counts,
    /// Rank-bounded extraction (branch and bound): the e-graph's part of the bound, per trail
    /// index the bound of the program it was pushed from, the bound of the program being
    /// judged, and the best estimates found (at most `top`, as f64 bits).
    bound: Option<BoundModel>,
    pushed_bound: Vec<f64>,
    own_bound: f64,
    stored: rustc_hash::FxHashSet<u32>,
}

impl<'scope, 'env> Search<'scope, 'env> {
    /// The state of a run, the empty program on the worklist.
    pub(super) fn new(
        ex: &'env Extractor,
        x: &'env ExtractGraph<'env>,
        scope: &'scope std::thread::Scope<'scope, 'env>,
    ) -> Self {
        let start = Instant::now();
        let classes = x.ids.len();
        let max_kernels = ex.max_kernels;
        let queue = match &ex.lowerable {
            // With rank-bounded extraction the worker also scores: an estimate that comes in
            // later only prunes later (the bound compares with the estimates in).
            Some(check) if ex.background_lowering && ex.compaction != Compaction::None => {
                let early = ex.compaction == Compaction::Early;
                let rebuild = move |choice: &Choice| rebuilt(x, choice, max_kernels);
                Some(LoweringQueue::new(
                    scope,
                    super::worker_check(ex, check),
                    rebuild,
                    early,
                ))
            }
            _ => None,
        };
        let options = if ex.compaction == Compaction::Early && ex.skip_operand_swaps {
            Cow::Borrowed(x.unswapped.as_slice())
        } else {
            Cow::Owned(
                x.nodes
                    .iter()
                    .map(|ns| (0..ns.len() as u32).collect())
                    .collect(),
            )
        };
        let words = classes.div_ceil(64);
        let mut search = Search {
            ex,
            x,
            start,
            next_report: Duration::from_secs(1),
            options,
            dead_before_push: ex.prune_dead_components
                && ex.settle_unreached
                && ex.check_before_push,
            lookahead: ex.check_before_push && ex.new_hole_lookahead,
            readable_context: ex.readable_context && ex.settle_unreached,
            interner: Interner {
                keep_stored_folds: true,
                ..Default::default()
            },
            class_interner: Interner::default(),
            seen: SliceTable::default(),
            context: Vec::new(),
            seen_key: Vec::new(),
            out: Outcomes {
                top: ex.rank_bound.as_ref().map_or(0, |rb| rb.top.max(1)),
                ..Outcomes::default()
            },
            queue,
            trail: vec![(NONE, NONE, NONE)],
            worklist: Worklist::new(ex.rank_bound.is_some()),
            s: vec![NONE; classes],
            picks: Vec::new(),
            sorted_picks: Vec::new(),
            base_union: vec![0; words],
            union: vec![0; words],
            class_facts: WalkFacts::default(),
            scratch: Marks::new(classes),
            once_scratch: OnceScratch::new(classes),
            launch_scratch: LaunchScratch::default(),
            load_memo: Memo::new(classes),
            context_reach: Vec::new(),
            needed: Vec::new(),
            back_marks: Marks::new(classes),
            back_stack: Vec::new(),
            twice_seen: Marks::new(classes),
            pending: Vec::new(),
            region_scratch: RegionScratch::default(),
            all_reached: vec![u64::MAX; words],
            open: Vec::new(),
            open_stack: Vec::new(),
            growth: GrowthWatch::default(),
            tables: Vec::new(),
            reached: Vec::new(),
            forced_picks: Vec::new(),
            in_reached: Marks::new(classes),
            n: Counts::default(),
            bound: ex.rank_bound.as_ref().map(|rb| BoundModel::new(x, rb)),
            pushed_bound: vec![0.0],
            own_bound: 0.0,
            stored: Default::default(),
        };
        search.seed();
        search
    }

    /// Pushes the empty program, estimated at the cheapest programs of the results.
    fn seed(&mut self) {
        let mut roots: Vec<u32> = self.x.roots.clone();
        roots.sort();
        roots.dedup();
        for r in &roots {
            add_cheapest(self.x, &mut self.union, *r);
        }
        let root_cost = hole_estimate(self.x, &self.s, &self.union);
        self.worklist.push(root_cost, 0.0, 0);
    }

    /// Takes programs cheapest first until none is left or a limit stops the search.
    pub(super) fn run(mut self) -> ExtractReport {
        // The walk's facts about the program taken, read by every step that judges it.
        let mut facts = WalkFacts::default();
        let stop = loop {
            let Some(at) = self.worklist.pop(!self.out.best.is_empty()) else {
                if let Some(q) = self.queue.as_mut() {
                    q.drain(&mut self.out);
                }
                break match &self.ex.rank_bound {
                    Some(rb) if self.out.best.len() >= rb.top.max(1) => {
                        ExtractStop::TopFound(rb.top.max(1))
                    }
                    _ => ExtractStop::Exhausted,
                };
            };
            // Pushed from a program whose bound is above the `top`-th estimate found: none
            // of its completions can be among the best.
            if self.bound.is_some() && self.over_bound(self.pushed_bound[at as usize]) {
                self.n.over_bound += 1;
                continue;
            }
            if let Some(stop) = self.take(at, &mut facts) {
                break stop;
            }
        };
        self.finish(stop)
    }

    /// Takes the program at trail index `at`: the limits first, then the walk and the
    /// verdict. The reason to stop, if any.
    fn take(&mut self, at: u32, facts: &mut WalkFacts) -> Option<ExtractStop> {
        if let Some(q) = self.queue.as_mut() {
            if self.ex.rank_bound.is_some() {
                q.poll_due(&mut self.out, self.n.taken);
            } else {
                q.poll(&mut self.out);
            }
        }
        self.n.taken += 1;
        if self.n.taken == 1 || self.n.taken % 256 == 0 {
            if let Some(stop) = self.check_limits() {
                return Some(stop);
            }
        }
        self.n.walked += 1;
        self.load(at);
        let form = Walk::roots(self.x, &self.s, &mut self.interner, facts);
        self.judge(at, &form, facts)
    }

    /// Records the programs expanded when the best `top` last changed (read where limits are
    /// looked at, and at the end).
    fn note_improvement(&mut self) {
        if self.out.improvements != self.n.improvements {
            self.n.improvements = self.out.improvements;
            self.n.last_improvement = self.n.expanded;
            self.n.improved_at = self.start.elapsed();
        }
    }

    /// The time and memory limits, and the progress report: looked at on the first program
    /// taken and every 256th.
    fn check_limits(&mut self) -> Option<ExtractStop> {
        let elapsed = self.start.elapsed();
        self.note_improvement();
        if elapsed > self.ex.time_limit {
            return Some(ExtractStop::TimeLimit(self.ex.time_limit.as_secs_f64()));
        }
        if let Some(flag) = &self.ex.cancel {
            if flag.load(std::sync::atomic::Ordering::Relaxed) {
                return Some(ExtractStop::Cancelled);
            }
        }
        // A rank-bounded search whose best have not changed for the stall limit, and for as
        // long again as it took to find them, gives up on proving them (`stall_limit`).
        if let Some(stall) = self.ex.stall_limit.filter(|_| self.ex.rank_bound.is_some()) {
            let unchanged = elapsed.saturating_sub(self.n.improved_at);
            if self.out.improvements > 0 && unchanged >= stall.max(self.n.improved_at) {
                return Some(ExtractStop::Stalled(
                    (unchanged.as_secs_f64() * 10.0).floor() / 10.0,
                ));
            }
        }
        if let Some(t) = self.ex.unranked_after.filter(|t| elapsed > *t) {
            // Verdicts are recorded late (`poll_due`): the programs sent so far decide.
            if self.out.best.is_empty() {
                if let Some(q) = self.queue.as_mut() {
                    q.drain(&mut self.out);
                }
            }
            if self.ex.rank_bound.is_some() && self.out.best.is_empty() {
                return Some(ExtractStop::NothingRanked(t.as_secs_f64()));
            }
        }
        // Reading the resident size costs microseconds: once every 4,096 programs.
        // The tables whose next doubling may come before the next look count as
        // grown already, so the search stops before such a growth passes the limit.
        if let Some(limit) = self.ex.memory_limit.filter(|_| self.n.taken % 4096 <= 1) {
            self.tables.clear();
            self.interner.tables(&mut self.tables);
            self.class_interner.tables(&mut self.tables);
            self.seen.tables(&mut self.tables);
            self.tables
                .push((self.trail.len(), self.trail.capacity(), 12));
            self.worklist.tables(&mut self.tables);
            let ahead_mib = self.growth.ahead(&self.tables) >> 20;
            if resident_mib().is_some_and(|m| m + ahead_mib >= limit) {
                return Some(ExtractStop::MemoryLimit(limit));
            }
        }
        let ex = self.ex;
        if let Some(report) = ex.progress.as_ref().filter(|_| elapsed >= self.next_report) {
            let (best_us, kth_us) = self.out.best_and_kth();
            self.next_report = elapsed + Duration::from_millis(250);
            report(&ExtractProgress {
                expanded: self.n.expanded,
                complete: self.out.complete,
                distinct: self.out.distinct.len(),
                worklist: self.worklist.len(),
                seconds: elapsed.as_secs_f64(),
                best_us,
                kth_us,
                last_improvement: self.n.last_improvement,
            });
        }
        None
    }

    /// Sets `s` to the program at trail index `at`, following the links to the empty one.
    fn load(&mut self, at: u32) {
        // Only the last program's picks are set: clearing them clears `s`.
        for &c in &self.picks {
            self.s[c as usize] = NONE;
        }
        self.picks.clear();
        let mut link = at;
        while link != 0 {
            let (parent, c, n) = self.trail[link as usize];
            self.s[c as usize] = n;
            self.picks.push(c);
            link = parent;
        }
    }

    /// The program just walked, with canonical form `form`: pruned, output or expanded. The
    /// reason to stop, if any.
    fn judge(&mut self, at: u32, form: &[u32], facts: &WalkFacts) -> Option<ExtractStop> {
        let hole = self.choose_hole(at, facts);
        // Exact for a complete program; the children's priorities build on it.
        let cost = picked_cost(self.x, &self.s, &facts.met);
        if !self.valid(facts) {
            return None;
        }
        // Early compaction looks a partial program up after the checks on its resolved
        // part and inserts it once it passes them. A program is dropped if it fails them
        // or is ≈ₚ one taken, in either order, so the order decides only the cost: the
        // hole context costs more than the checks, and more programs fail them than are
        // ≈ₚ one taken.
        self.load_memo.clear();
        let key = self.ex.compaction == Compaction::Early && !facts.holes.is_empty();
        if key {
            self.hole_context_key(form, facts);
        }
        // Hashed once, for the lookup and for the insert below.
        let seen_hash = if key {
            SliceTable::hash(&self.seen_key)
        } else {
            0
        };
        if key && self.seen.find_hashed(&self.seen_key, seen_hash).is_some() {
            self.n.equivalent += 1;
            return None; // ≈ₚ a program already taken
        }
        if self.over_kernels(key, facts) {
            self.n.over_kernels += 1;
            return None;
        }
        if self.ex.prune_without_launch_order
            && !facts.holes.is_empty()
            && self.no_launch_order(key, facts)
        {
            self.n.no_launch_order += 1;
            return None;
        }
        // The ≈ class of a complete program.
        let class_form = if facts.holes.is_empty() {
            Walk::roots(
                self.x,
                &self.s,
                &mut self.class_interner,
                &mut self.class_facts,
            )
        } else {
            Vec::new()
        };
        if self.ex.compaction == Compaction::Early {
            // A complete program is pruned only when a ≈ one was output: one refused by
            // the checks below (launch order, kernels, lowering), which ≈ programs need
            // not share, must not take its class with it.
            // (A class whose program waits for its verdict is decided with that verdict:
            // `LoweringQueue`.)
            if key {
                self.seen.insert_hashed(&self.seen_key, seen_hash, 0);
            } else if self.out.distinct.contains(&class_form) {
                self.n.equivalent += 1;
                return None; // ≈ a program already output
            }
        }
        // After the seen-set: a program pruned by its bound is still taken, as it is without
        // the bound, so that the programs ≈ₚ to it are pruned as they are without it.
        let ex = self.ex;
        if let (Some(rb), Some(_), true) = (&ex.rank_bound, hole, self.bound.is_some()) {
            let b = self.bound.as_ref().expect("rank-bounded");
            if let Some(c) = b.too_large_value(rb, self.x, &self.s, &facts.met) {
                self.n.too_large_value += 1;
                self.n.first_too_large.get_or_insert(c);
                return None;
            }
            let kernels = self.kernels_at_least(key, facts);
            let b = self.bound.as_ref().expect("rank-bounded");
            self.own_bound = b.bound(rb, self.x, &self.s, facts, kernels, &mut self.stored);
            if self.over_bound(self.own_bound) {
                self.n.over_bound += 1;
                return None;
            }
        }
        match hole {
            None => self.complete(class_form, cost, facts),
            Some(h) => {
                self.expand(at, h, cost, facts);
                None
            }
        }
    }

    /// The hole Algorithm 1 resolves next (`HoleOrder`); none for a complete program.
    fn choose_hole(&mut self, at: u32, facts: &WalkFacts) -> Option<u32> {
        let (x, holes) = (self.x, &facts.holes);
        let options = &self.options;
        // By default the most constrained hole first: forced picks cost one expansion each
        // and never branch, and an early forced pick exposes dead ends sooner. Among
        // equals, the highest class id (an order that does not depend on how the walk
        // wrote commutative operands); measured, it expands fewer states than walk order.
        match self.ex.hole_order {
            HoleOrder::FewestNodes => {
                // Components of picked fused reductions still unread.
                self.pending.clear();
                unread_components(x, &self.s, &facts.met, &mut self.pending);
                let pending = &self.pending;
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
        }
    }

    /// Whether the classes no hole reaches are judged as in the complete program (`open`
    /// holds those a hole reaches); if not, every class counts as reachable from a hole
    /// while any hole is left (`all_reached`).
    fn settles(&self, facts: &WalkFacts) -> bool {
        self.ex.settle_unreached || facts.holes.is_empty()
    }

    /// The checks on the program's resolved part: each value computed once, no dead
    /// component and, on request, no pointwise kernel. Counts the check that fails.
    fn valid(&mut self, facts: &WalkFacts) -> bool {
        let x = self.x;
        let settled: &[u64] = if self.settles(facts) {
            open_reach(
                x,
                &self.s,
                &facts.holes,
                &mut self.open,
                &mut self.open_stack,
            );
            &self.open
        } else {
            &self.all_reached
        };
        let resolved = (facts.visited.as_slice(), facts.met.as_slice());
        if !computed_once(x, &self.s, resolved, settled, &mut self.once_scratch) {
            self.n.recomputed += 1;
            return false;
        }
        if store_read_in_kernel(x, &self.s, &facts.met) {
            self.n.store_read_in_kernel += 1;
            return false;
        }
        if self.ex.prune_dead_components && dead_component(x, &self.s, &facts.met, settled) {
            self.n.dead_components += 1;
            return false;
        }
        if self.ex.no_pointwise_kernels
            && has_pointwise_kernel(x, &self.s, &facts.met, &mut self.scratch)
        {
            self.n.pointwise_kernels += 1;
            return false;
        }
        true
    }

    /// Early compaction's key of a partial program that passed the checks (`seen_key`): its
    /// canonical form and its hole context (`hole_context`, which also builds the kernel
    /// graph of its resolved part in `region_scratch`).
    fn hole_context_key(&mut self, form: &[u32], facts: &WalkFacts) {
        let x = self.x;
        let kv = KernelView {
            x,
            choice: &self.s,
            visited: &facts.visited,
            loads: &self.load_memo,
        };
        // The resolved classes whose picks and regions ≈ₚ compares: those a completion
        // can read, or every class the holes reach through any e-node. Found only for
        // a program that passed the checks above.
        self.sorted_picks.clear();
        self.sorted_picks.extend_from_slice(&self.picks);
        self.sorted_picks.sort_unstable();
        if self.readable_context {
            let settled: &[u64] = if self.settles(facts) {
                &self.open
            } else {
                &self.all_reached
            };
            readable_resolved(
                x,
                &self.s,
                settled,
                &mut self.context_reach,
                &mut self.open_stack,
            );
        } else {
            self.context_reach.clear();
            self.context_reach.resize(x.ids.len().div_ceil(64), 0);
            for h in &facts.holes {
                for (r, w) in self.context_reach.iter_mut().zip(&x.reach[*h as usize]) {
                    *r |= w;
                }
            }
        }
        hole_context(
            &kv,
            &self.sorted_picks,
            &self.context_reach,
            &facts.memo,
            (self.ex.hole_context, self.readable_context),
            &mut self.region_scratch,
            &mut self.context,
        );
        // The form's length first, so that no two keys run together.
        self.seen_key.clear();
        self.seen_key.push(form.len() as u32);
        self.seen_key.extend_from_slice(form);
        self.seen_key.extend(
            self.context
                .iter()
                .flat_map(|w| [*w as u32, (*w >> 32) as u32]),
        );
    }

    /// Whether the program needs more than `max_kernels` kernels, by a lower bound.
    fn over_kernels(&mut self, key: bool, facts: &WalkFacts) -> bool {
        let Some(max) = self.ex.max_kernels else {
            return false;
        };
        self.kernels_at_least(key, facts) > max
    }

    /// A lower bound of the kernels of every completion: `kernel_lower_bound`, or the
    /// longest chain of kernels the resolved classes already form, whichever is larger.
    fn kernels_at_least(&mut self, key: bool, facts: &WalkFacts) -> usize {
        let x = self.x;
        let kv = KernelView {
            x,
            choice: &self.s,
            visited: &facts.visited,
            loads: &self.load_memo,
        };
        // The kernel graph the hole context built, or built here; a kernel reading
        // what it writes is left to the launch-order test.
        let chain = if key {
            if self.region_scratch.self_read {
                0
            } else {
                kernel_chain(&self.region_scratch.launch.edges).unwrap_or(0)
            }
        } else if kv.kernel_edges(&self.picks, &mut self.launch_scratch, false) {
            0
        } else {
            kernel_chain(&self.launch_scratch.edges).unwrap_or(0)
        };
        kernel_lower_bound(x, &self.s, &facts.met, &facts.memo).max(chain)
    }

    /// Whether no completion of the partial program has a launch order
    /// (`launch_order_impossible`).
    fn no_launch_order(&mut self, key: bool, facts: &WalkFacts) -> bool {
        // The hole context built the kernel graph already.
        if key {
            return self.region_scratch.self_read
                || kernel_cycle(&self.region_scratch.launch.edges);
        }
        let kv = KernelView {
            x: self.x,
            choice: &self.s,
            visited: &facts.visited,
            loads: &self.load_memo,
        };
        launch_order_impossible(&kv, &self.picks, &mut self.launch_scratch)
    }

    /// A complete program of ≈ class `class_form`: sent to the lowering worker, or checked
    /// here (`check_now`). The reason to stop, if any.
    fn complete(
        &mut self,
        class_form: Vec<u32>,
        cost: u64,
        facts: &WalkFacts,
    ) -> Option<ExtractStop> {
        let kv = KernelView {
            x: self.x,
            choice: &self.s,
            visited: &facts.visited,
            loads: &self.load_memo,
        };
        // The partial test is exact enough to refuse most such programs before they
        // are rebuilt as functions; `rebuilt` decides the rest.
        let launch_order = !self.ex.prune_without_launch_order
            || !launch_order_impossible(&kv, &self.picks, &mut self.launch_scratch);
        let Some(q) = self.queue.as_mut() else {
            return self.check_now(class_form, cost, launch_order);
        };
        if !launch_order {
            // Early compaction would have pruned it as ≈ an output program if
            // the program of its class that waits is output: that verdict decides.
            if self.ex.compaction == Compaction::Early && q.waits_for(&class_form) {
                let refusal = Some(Refusal::NoLaunchOrder);
                q.submit(None, class_form, Choice::new(), cost, refusal);
            } else {
                self.n.no_launch_order += 1;
            }
            return None;
        }
        // The worker rebuilds and checks it, and lowers it unless its class is output.
        q.submit(Some(self.s.clone()), class_form, self.s.clone(), cost, None);
        // Every waiting program may yet be output: once they could reach the
        // limit, their verdicts decide whether this program is the last. (Rank-bounded
        // extraction outputs the best `top`, whatever their number.)
        let max = self.ex.max_candidates;
        if self.ex.rank_bound.is_none() && self.out.candidates.len() + q.len() >= max {
            q.drain(&mut self.out);
            if self.out.candidates.len() >= max {
                return Some(ExtractStop::CandidateLimit(max));
            }
        }
        q.bound(&mut self.out);
        None
    }

    /// A complete program checked on the search's thread: rebuilt as a function, refused or
    /// lowered, and output if its class is new (or every program is).
    fn check_now(
        &mut self,
        class_form: Vec<u32>,
        cost: u64,
        launch_order: bool,
    ) -> Option<ExtractStop> {
        let program = if launch_order {
            rebuilt(self.x, &self.s, self.ex.max_kernels)
        } else {
            Err(Refusal::NoLaunchOrder)
        };
        let program = match program {
            Ok(program) => program,
            Err(refusal) => {
                *match refusal {
                    Refusal::NoLaunchOrder => &mut self.n.no_launch_order,
                    Refusal::DeadComponent => &mut self.n.dead_components,
                    Refusal::NoLaunchOrderFound => &mut self.n.rejected,
                    Refusal::OverKernels => &mut self.n.over_kernels,
                } += 1;
                return None;
            }
        };
        let every = self.ex.compaction == Compaction::None;
        let fingerprint = crate::ir::alpha::fingerprint(&program);
        if !every
            && !self.out.distinct.contains(&class_form)
            && self.out.fingerprints.contains(&fingerprint)
        {
            self.out.renaming(class_form);
            return None;
        }
        // One lowering per class: a representative of a class already output stands
        // for it. A refused representative leaves the class open to another.
        let mut estimate = None;
        if let Some(rb) = &self.ex.rank_bound {
            if !self.out.distinct.contains(&class_form) {
                match (rb.score)(&program) {
                    Err(reason) => {
                        self.out.refused(reason);
                        return None;
                    }
                    Ok(e) => estimate = e,
                }
            }
        } else if let Some(check) = &self.ex.lowerable {
            if !self.out.distinct.contains(&class_form) {
                if let Err(reason) = check(&program) {
                    self.out.refused(reason);
                    return None;
                }
            }
        }
        let max = self.ex.max_candidates;
        let output = self
            .out
            .accept(class_form, &self.s, cost, every, fingerprint);
        if self.ex.rank_bound.is_some() {
            if output {
                self.out.estimated(estimate);
            }
            return None;
        }
        if output && self.out.candidates.len() >= max {
            return Some(ExtractStop::CandidateLimit(max));
        }
        None
    }

    /// Expands the program at trail index `at` at hole `h`: a child per e-node of `h`,
    /// pushed unless a check refuses it (`child`).
    fn expand(&mut self, at: u32, h: u32, cost: u64, facts: &WalkFacts) {
        let x = self.x;
        self.n.expanded += 1;
        // Operand swaps left out are ≈ₚ a sibling: pruned without being built.
        self.n.equivalent += x.nodes[h as usize].len() - self.options[h as usize].len();
        // A class holding the `get` a picked fused reduction needs picks it: any other
        // pick leaves that component dead.
        let required = self
            .ex
            .prune_dead_components
            .then(|| required_get(x, &self.s, h))
            .flatten();
        self.base_union.fill(0);
        for other in facts.holes.iter().filter(|k| **k != h) {
            add_cheapest(x, &mut self.base_union, *other);
        }
        let base_cost = hole_estimate(x, &self.s, &self.base_union);
        self.needed.clear();
        if self.dead_before_push {
            unread_components(x, &self.s, &facts.met, &mut self.needed);
            self.needed.retain(|b| *b != h);
            self.needed.sort_unstable();
            self.needed.dedup();
        }
        // By index: each child is built in the search's state.
        for j in 0..self.options[h as usize].len() {
            let i = self.options[h as usize][j];
            if required.is_some_and(|r| r != Ok(i)) {
                self.n.dead_components += 1;
                continue;
            }
            self.child(at, h, i, cost, base_cost, facts);
        }
    }

    /// The child of the program at `at` (of cost `cost`) that picks e-node `i` for hole `h`,
    /// with the picks unit propagation forces: pushed with its estimate (`base_cost`: the
    /// parent's other holes) unless it closes a cycle, cannot be lowered or fails the
    /// checks before the push.
    fn child(&mut self, at: u32, h: u32, i: u32, cost: u64, base_cost: u64, facts: &WalkFacts) {
        let x = self.x;
        let kids = &x.nodes[h as usize][i as usize].1;
        if reaches(x, &self.s, kids, h, false, &mut self.scratch) {
            return; // would close a cycle
        }
        self.s[h as usize] = i;
        let lowerable = loads_only_after_pick(x, &self.s, h);
        debug_assert_eq!(lowerable, loads_only(x, &self.s));
        self.s[h as usize] = NONE;
        if !lowerable {
            return;
        }
        // The child's estimate: its picks' costs, plus the cheapest programs of the
        // other holes and of each child class that becomes a new hole, once each.
        let mut child = cost.saturating_add(x.pick_cost[h as usize][i as usize]);
        self.reached.clear();
        self.in_reached.clear();
        for k in kids {
            if !facts.visited[*k as usize] && *k != h && self.in_reached.mark(*k) {
                self.reached.push(*k);
            }
        }
        let trail_len = self.trail.len();
        self.trail.push((at, h, i));
        self.s[h as usize] = i;
        let dead = self.propagate(h, facts, &mut child) || self.fails_before_push(h, facts);
        if !dead {
            child = self.estimate(h, child, base_cost);
        }
        self.s[h as usize] = NONE;
        for k in self.forced_picks.drain(..) {
            self.s[k as usize] = NONE;
        }
        if dead {
            self.trail.truncate(trail_len);
            return;
        }
        self.n.forced += self.trail.len() - trail_len - 1;
        self.worklist
            .push(child, self.own_bound, (self.trail.len() - 1) as u32);
        if self.bound.is_some() {
            // Indices past a truncated trail are reused: set, not only grown.
            self.pushed_bound.resize(self.trail.len(), 0.0);
            self.pushed_bound[self.trail.len() - 1] = self.own_bound;
        }
    }

    /// Unit propagation in the child in `s` (which picked for `h`): a class the pick makes
    /// reachable that has one e-node can only be resolved one way, so it is resolved here,
    /// and so are the one-node classes that pick reaches in turn. Resolving them one state
    /// at a time gave the same programs (the fewest-nodes order takes such holes first
    /// anyway) at the price of a walk and the pruning checks per forced pick. Each forced
    /// pick goes on the trail and into `forced_picks`, its cost into `child`. True when the
    /// child has no completion.
    fn propagate(&mut self, h: u32, facts: &WalkFacts, child: &mut u64) -> bool {
        let x = self.x;
        let (lookahead, dead_before_push) = (self.lookahead, self.dead_before_push);
        let mut next = 0;
        while let Some(&k) = self.reached.get(next).filter(|_| self.ex.unit_propagation) {
            next += 1;
            // `reached` holds each class once, none of them picked (picks are reachable).
            let required = self
                .ex
                .prune_dead_components
                .then(|| required_get(x, &self.s, k))
                .flatten();
            let only = match (required, self.options[k as usize].as_slice()) {
                (Some(Ok(j)), ks) if ks.contains(&j) => j,
                (Some(_), _) => return true,
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
                    let s = &mut self.s;
                    let in_reached = &self.in_reached;
                    let mut viable = many.iter().copied().filter(|&j| {
                        let grandkids = &x.nodes[k as usize][j as usize].1;
                        if reaches(x, s, grandkids, k, false, &mut self.scratch) {
                            return false;
                        }
                        s[k as usize] = j;
                        let mut viable = loads_only_after_pick(x, s, k);
                        if viable && lookahead && dead_before_push {
                            // Holes once `k` picks `j`: the walk's, those this child
                            // reached so far and `j`'s operands.
                            let is_hole = |c: u32| {
                                s[c as usize] == NONE
                                    && (facts.visited[c as usize]
                                        || in_reached.contains(c)
                                        || grandkids.contains(&c))
                            };
                            viable = !leaves_component_unreachable(
                                x,
                                s,
                                k,
                                is_hole,
                                &self.open,
                                &mut self.back_marks,
                                &mut self.back_stack,
                            );
                        }
                        if viable && lookahead {
                            viable = !computes_twice_directly(x, s, &[k], &mut self.twice_seen);
                        }
                        s[k as usize] = NONE;
                        viable
                    });
                    match (viable.next(), viable.next()) {
                        (Some(j), None) => j,
                        (None, _) => return true,
                        _ => continue,
                    }
                }
            };
            let grandkids = &x.nodes[k as usize][only as usize].1;
            if reaches(x, &self.s, grandkids, k, false, &mut self.scratch) {
                return true; // its only e-node closes a cycle
            }
            self.s[k as usize] = only;
            self.forced_picks.push(k);
            let lowerable = loads_only_after_pick(x, &self.s, k);
            debug_assert_eq!(lowerable, loads_only(x, &self.s));
            if !lowerable {
                return true;
            }
            *child = child.saturating_add(x.pick_cost[k as usize][only as usize]);
            for g in grandkids {
                if !facts.visited[*g as usize] && *g != h && self.in_reached.mark(*g) {
                    self.reached.push(*g);
                }
            }
            self.trail.push(((self.trail.len() - 1) as u32, k, only));
        }
        false
    }

    /// The checks before the push, on the child in `s` (which picked for `h`, and
    /// `forced_picks`): a dead component or a value computed twice that its new picks
    /// decide already. Counts the check that fails.
    fn fails_before_push(&mut self, h: u32, facts: &WalkFacts) -> bool {
        let x = self.x;
        if self.dead_before_push {
            // A class holding a needed `get` that this child leaves unresolved and that no
            // hole reaches through unresolved classes is never resolved: the component
            // is dead in every completion, as the checks after the walk would find.
            // Caught here, the child is neither pushed nor walked.
            let (s, in_reached) = (&self.s, &self.in_reached);
            let is_hole = |c: u32| {
                s[c as usize] == NONE && (facts.visited[c as usize] || in_reached.contains(c))
            };
            let mut dead = false;
            for &b in &self.needed {
                if s[b as usize] == NONE
                    && unreachable_from_holes(
                        x,
                        s,
                        b,
                        is_hole,
                        &self.open,
                        &mut self.back_marks,
                        &mut self.back_stack,
                    )
                {
                    dead = true;
                    break;
                }
            }
            // The fused reductions this child picks: each component a reader needs
            // is read by the one `get` the e-graph holds for it.
            dead = dead
                || std::iter::once(&h).chain(&self.forced_picks).any(|&t| {
                    leaves_component_unreachable(
                        x,
                        s,
                        t,
                        is_hole,
                        &self.open,
                        &mut self.back_marks,
                        &mut self.back_stack,
                    )
                });
            if dead {
                self.n.dead_components += 1;
                return true;
            }
        }
        if self.ex.check_before_push {
            self.forced_picks.push(h);
            let twice =
                computes_twice_directly(x, &self.s, &self.forced_picks, &mut self.twice_seen);
            self.forced_picks.pop();
            if twice {
                self.n.recomputed += 1;
                return true;
            }
        }
        false
    }

    /// The estimate of the child in `s` (which picked for `h`; `child`: its picks' costs):
    /// the other holes' share (`base_cost`) less what this child resolves of it, plus what
    /// its new holes add.
    fn estimate(&mut self, h: u32, child: u64, base_cost: u64) -> u64 {
        let x = self.x;
        let base_union = &self.base_union;
        let in_base = |c: u32| has(base_union, c as usize);
        let resolved = std::iter::once(h)
            .chain(self.forced_picks.iter().copied())
            .filter(|c| in_base(*c))
            .fold(0u64, |t, c| t.saturating_add(cheapest_pick(x, c)));
        self.union.fill(0);
        for k in self.reached.iter().filter(|k| self.s[**k as usize] == NONE) {
            add_cheapest(x, &mut self.union, *k);
        }
        for (w, b) in self.union.iter_mut().zip(base_union) {
            *w &= !b;
        }
        child
            .saturating_add(base_cost - resolved.min(base_cost))
            .saturating_add(hole_estimate(x, &self.s, &self.union))
    }

    /// Whether a bound (µs) reaches the `top`-th best estimate found (rank-bounded
    /// extraction only): a completion could at best tie with it, which leaves the top
    /// `top` estimates as they are. (Equal up to rounding counts as a tie: the bound and an
    /// estimate add the same terms in other orders.)
    fn over_bound(&self, bound: f64) -> bool {
        match &self.ex.rank_bound {
            Some(rb) if self.out.best.len() >= rb.top.max(1) => self
                .out
                .best
                .peek()
                .is_some_and(|kth| bound >= f64::from_bits(*kth) * (1.0 - 1e-12)),
            _ => false,
        }
    }

    /// The report, once the worker has decided every waiting program.
    fn finish(mut self, stop: ExtractStop) -> ExtractReport {
        if let Some(q) = self.queue.as_mut() {
            q.drain(&mut self.out);
        }
        self.note_improvement();
        let Outcomes {
            distinct,
            candidates,
            complete,
            not_lowerable,
            first_refusal,
            deferred,
            renamed,
            ..
        } = std::mem::take(&mut self.out);
        let mut candidates = candidates;
        if let Some(rb) = &self.ex.rank_bound {
            // The best `top` by estimate (then the search's work estimate, then discovery);
            // those with no legal schedule are not ranked — unless none has one: then they
            // are output for `rank` to say which limit they break.
            if candidates.iter().any(|c| c.estimate.is_some()) {
                candidates.retain(|c| c.estimate.is_some());
            }
            candidates.sort_by(|a, b| {
                let (x, y) = (
                    a.estimate.unwrap_or(f64::MAX),
                    b.estimate.unwrap_or(f64::MAX),
                );
                x.total_cmp(&y).then(a.cost.cmp(&b.cost))
            });
            candidates.truncate(rb.top.max(1));
        }
        let n = &self.n;
        ExtractReport {
            stop,
            expanded: n.expanded,
            walked: n.walked,
            complete,
            rejected: n.rejected + deferred.count(Refusal::NoLaunchOrderFound),
            no_launch_order: n.no_launch_order + deferred.count(Refusal::NoLaunchOrder),
            over_kernels: n.over_kernels + deferred.count(Refusal::OverKernels),
            recomputed: n.recomputed,
            pointwise_kernels: n.pointwise_kernels,
            dead_components: n.dead_components + deferred.count(Refusal::DeadComponent),
            store_read_in_kernel: n.store_read_in_kernel,
            forced: n.forced,
            equivalent: n.equivalent + deferred.equivalent,
            over_bound: n.over_bound,
            last_improvement: n.last_improvement,
            too_large_value: n.too_large_value,
            first_too_large: n.first_too_large.map(|c| {
                let ty = self.x.g.egraph[self.x.ids[c as usize]].data.as_ref();
                let ty = ty.map_or_else(|| "?".to_string(), |t| t.to_string());
                format!("a value of type {ty}")
            }),
            not_lowerable,
            first_refusal,
            unlowerable_enodes: self.x.unlowerable,
            distinct: distinct.len(),
            renamed,
            seconds: self.start.elapsed().as_secs_f64(),
            candidates,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egraph::extract::bound::tests::{h100_bound, saturated};

    /// A search that has ranked nothing after `unranked_after` stops (for another order to
    /// be tried) only once the verdicts already sent are in: `poll_due` records a verdict
    /// late, and a candidate sent before the limit whose estimate has not been recorded is a
    /// ranked candidate. The search is stepped until one program has been sent, then its
    /// clock is set past the limit: no timing of the machine decides what is looked at.
    #[test]
    fn nothing_ranked_waits_for_the_estimates_already_sent() {
        let g = saturated(
            "func f where M = 64, K = 128, N = 256 {\n\
             a: tensor<MxK, f32> = input\n\
             w: tensor<KxN, f32> = input\n\
             y = exp(matmul(a, w))\n\
             return y\n}\n",
        );
        let x = ExtractGraph::new(&g).expect("extractable");
        let env = &g.egraph.analysis.env;
        let limit = Duration::from_secs(1);
        let ex = Extractor::default()
            .with_max_candidates(usize::MAX)
            .with_lowerable(crate::passes::extract::lower_check(env))
            .with_unranked_after(Some(limit))
            .with_rank_bound(Some(h100_bound(&g, 10)));
        std::thread::scope(|scope| {
            let mut search = Search::new(&ex, &x, scope);
            let mut facts = WalkFacts::default();
            let sent = |s: &Search| s.queue.as_ref().map_or(0, |q| q.len());
            while sent(&search) == 0 {
                let at = search
                    .worklist
                    .pop(false)
                    .expect("a complete program is found");
                if let Some(stop) = search.take(at, &mut facts) {
                    panic!("stopped ({stop:?}) before a program was sent");
                }
            }
            assert!(search.out.best.is_empty(), "the verdict is recorded late");
            search.start = Instant::now()
                .checked_sub(limit * 2)
                .expect("the clock has run two seconds");
            let stop = search.check_limits();
            assert!(
                !matches!(stop, Some(ExtractStop::NothingRanked(_))),
                "stopped for nothing ranked with a program sent"
            );
            assert!(!search.out.best.is_empty(), "the program sent is ranked");
        });
    }

    /// A search whose cancel flag is set stops at its next look at the limits, saying so:
    /// the partition race's search, once the whole search it races has proved its best.
    #[test]
    fn a_cancelled_search_stops_and_says_so() {
        let g = saturated(
            "func f where M = 64, K = 128, N = 256 {\n\
             a: tensor<MxK, f32> = input\n\
             w: tensor<KxN, f32> = input\n\
             return exp(matmul(a, w))\n}\n",
        );
        let x = ExtractGraph::new(&g).expect("extractable");
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ex = Extractor::default().with_cancel(Some(flag.clone()));
        let free = ex.run(&x);
        assert_ne!(free.stop, ExtractStop::Cancelled);
        assert!(!free.candidates.is_empty());
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
        let cancelled = ex.run(&x);
        assert_eq!(cancelled.stop, ExtractStop::Cancelled);
        assert!(
            cancelled.candidates.is_empty(),
            "stopped before any candidate"
        );
    }
}
