//! `extract` enumerates the candidate programs of every e-graph in the module (paper §5.1,
//! Algorithm 1) and replaces the module's e-graphs with them: functions `name.c0`, `name.c1`,
//! …, each preceded by a summary comment. A module with functions and no e-graphs is extracted
//! from its unsaturated e-graphs.

use super::options::{choice, pass_options, OptionKind, OptionSpans, OptionValue, Seconds};
use super::rank::DeviceChoice;
use super::{NamedPass, Pass, PassContext};
use crate::diag::{Diagnostic, Severity};
use crate::egraph::extract::{
    reconstruct, summarize, Candidate, Compaction, ExtractGraph, Extractor, HoleContext, HoleOrder,
    LowerCheck, RankBound, Scorer,
};
use crate::ir::{Function, Module};
use crate::rank::device::{device, Device};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Triton backend's lowerability test, as the extractor takes it: candidates of an
/// e-graph whose reducers (the module's and those fusion generated) are `reducers`.
pub fn lower_check(env: &crate::verify::typing::TypeEnv) -> LowerCheck {
    let info = crate::verify::ModuleInfo::of_typed_egraph(env);
    std::sync::Arc::new(move |f: &Function| {
        crate::lower::plan(&info, f)
            .map(|_| ())
            .map_err(|r| r.reason)
    })
}

/// Candidates per subgraph, and composed programs, when nothing sets `top`.
pub const COMPOSE_TOP: usize = 10;

/// The rank model's estimate of a complete candidate, as rank-bounded extraction takes it:
/// the backend's plan (or its refusal), then T̂ on `dev` by the rank pass's default solver.
pub fn rank_scorer(env: &crate::verify::typing::TypeEnv, dev: &'static Device) -> Scorer {
    let info = crate::verify::ModuleInfo::of_typed_egraph(env);
    std::sync::Arc::new(move |f: &Function| {
        let plan = crate::lower::plan(&info, f).map_err(|r| r.reason)?;
        Ok(crate::rank::estimate(&plan, dev, crate::rank::Solver::Lp).map(|e| e.cost.us))
    })
}

/// Rank-bounded extraction's bound on `dev` for the best `top`, scored by the rank model
/// (`rank_scorer`).
pub fn rank_bound_on(
    env: &crate::verify::typing::TypeEnv,
    dev: &'static Device,
    top: usize,
) -> RankBound {
    RankBound {
        top,
        launch_us: dev.launch_s * 1e6,
        latency_us: dev.dram_latency_s * 1e6,
        dram_bytes_per_us: dev.dram_bytes_per_s / 1e6,
        tensor_bf16_flops_per_us: dev.tensor_bf16_flops / 1e6,
        tensor_tf32_flops_per_us: dev.tensor_tf32_flops / 1e6,
        tensor_min_rows: dev.tensor_min_rows as f64,
        score: rank_scorer(env, dev),
        max_live_words: crate::rank::model::max_live_words(dev),
        scale: 1.0,
    }
}

choice! {
    /// `extract{stored-grids=…}`.
    pub enum StoredGrids {
        /// On with rank-bounded extraction (`top` > 0) for results of rank 3 or more (or
        /// where heads are merged: such a value reshaped to fewer dimensions); and
        /// where that finds no candidate with a legal schedule, `every` for the time left.
        Auto = "auto",
        True = "true",
        False = "false",
        /// Every combination of tiles, judged per program (`ExtractGraph::with_every_stored_grid`).
        Every = "every",
    }
}

/// The seconds the subgraphs of a module's compositions share. A subgraph's search gets
/// what is left of them divided by the subgraphs left, so one that ends early (exhausted, or
/// its top proven) leaves its time to those after it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PartsPool {
    /// `part-time-limit` for each subgraph (the default).
    PerPart,
    /// These seconds for all of them (a `time-limit` the user chose, or a fallback's share).
    Total(Seconds),
}

/// The time left to the subgraphs of a module's compositions, searched one after another.
#[derive(Debug)]
struct PartsBudget {
    left: Duration,
    parts_left: usize,
    /// The even share: no part gets less, however long those before it ran (on a loaded
    /// machine, past their shares), so none is left no time at all.
    floor: Duration,
}

impl PartsBudget {
    fn new(pool: PartsPool, part_time_limit: Seconds, parts: usize) -> PartsBudget {
        let left = match pool {
            PartsPool::PerPart => part_time_limit
                .duration()
                .saturating_mul(u32::try_from(parts).unwrap_or(u32::MAX)),
            PartsPool::Total(s) => s.duration(),
        };
        PartsBudget {
            left,
            parts_left: parts,
            floor: left / u32::try_from(parts.max(1)).unwrap_or(u32::MAX),
        }
    }

    /// The next subgraph's time limit: an equal share of what is left, in tenths of a second
    /// (as the fallbacks' shares, so limits print alike), or milliseconds below a second.
    fn next_share(&mut self) -> Duration {
        let share =
            (self.left / u32::try_from(self.parts_left.max(1)).unwrap_or(u32::MAX)).max(self.floor);
        self.parts_left = self.parts_left.saturating_sub(1);
        let unit = if share >= Duration::from_secs(1) {
            10.0
        } else {
            1000.0
        };
        Duration::try_from_secs_f64((share.as_secs_f64() * unit).floor() / unit)
            .unwrap_or(Duration::MAX)
    }

    /// A subgraph's search took `d`.
    fn spent(&mut self, d: Duration) {
        self.left = self.left.saturating_sub(d);
    }
}

/// The searches a rank-bounded extraction that ranks nothing tries next, in this order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fallback {
    EveryGrid,
    WalkOrder,
    /// The source function partitioned (`partition`), each subgraph saturated and searched on
    /// its own and their candidates composed: values crossing a cut are stored, which frees
    /// each part's tiling from the others' (a LayerNorm over channels before a product whose
    /// rows are the channels: MLP-Mixer's token mixing).
    Partitioned,
}

impl Fallback {
    fn what(self) -> &'static str {
        match self {
            Fallback::EveryGrid => "with every stored grid (`stored-grids=every`)",
            Fallback::WalkOrder => "in walk order",
            Fallback::Partitioned => "partitioned, each subgraph saturated and searched on its own",
        }
    }
}

choice! {
    /// `extract{compaction=…}`.
    pub enum CompactionChoice {
        /// Prune equivalent partial programs before expanding them (Algorithm 1).
        Early = "early",
        /// Construct every candidate and keep one per class.
        After = "after",
        /// Output every candidate.
        None = "none",
    }
}

choice! {
    /// `extract{hole-order=…}`.
    pub enum HoleOrderChoice {
        Fewest = "fewest",
        Walk = "walk",
        Most = "most",
        /// Scattered by a hash of the program and `hole-seed`.
        Scattered = "scattered",
    }
}

choice! {
    /// `extract{hole-context=…}`.
    pub enum HoleContextChoice {
        Forms = "forms",
        Picks = "picks",
    }
}

choice! {
    /// `extract{pointwise-kernels=…}`.
    pub enum PointwiseKernels {
        Keep = "keep",
        /// No candidate has a kernel that only applies pointwise operators to what it loads.
        Drop = "drop",
    }
}

/// `extract{max-memory=…}`: unset, [`default_memory_limit`] of the machine's memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MaxMemory {
    /// Unset: `MEMORY_CAP_MIB`, or three quarters of the machine's memory when less.
    Default,
    /// This many MiB (0: no limit).
    MiB(usize),
}

impl OptionValue for MaxMemory {
    fn from_text(text: &str) -> Result<Self, String> {
        usize::from_text(text).map(MaxMemory::MiB)
    }

    /// Unset lists as the cap (the help says when the limit is less).
    fn to_text(&self) -> String {
        match self {
            MaxMemory::Default => MEMORY_CAP_MIB.to_string(),
            MaxMemory::MiB(n) => n.to_string(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ExtractOptions {
    pub compaction: CompactionChoice,
    pub hole_order: HoleOrderChoice,
    /// `hole-seed`: the seed of `hole-order=scattered`.
    pub hole_seed: u64,
    pub hole_context: HoleContextChoice,
    /// `max-candidates`: stop after outputting this many candidates per e-graph.
    pub max_candidates: usize,
    pub max_memory: MaxMemory,
    /// `max-kernels`: only candidates with at most this many kernels (0: any).
    pub max_kernels: usize,
    pub pointwise_kernels: PointwiseKernels,
    /// `time-limit`: stop enumerating an e-graph after this many seconds.
    pub time_limit: Seconds,
    /// `check-candidates`: run every candidate output against its source (`super::net`).
    pub check_candidates: bool,
    /// `stored-grids`: keep tiles stored along two grid axes (see
    /// `ExtractGraph::with_stored_grids`).
    pub stored_grids: StoredGrids,
    /// `top`: rank-bounded extraction of the best `top` by the rank model (0: every class).
    pub top: usize,
    /// `device`: the GPU model of the rank-bounded search.
    pub device: DeviceChoice,
    /// `part-time-limit`: the search of each subgraph of a composition.
    pub part_time_limit: Seconds,
    /// `partition-fallback`: a whole function whose rank-bounded search ranks nothing is
    /// searched partitioned for the time left.
    pub partition_fallback: bool,
    /// `partition-race`: a whole function whose rank-bounded search runs to its time limit
    /// gives the last quarter of it to a partitioned search, and both searches' candidates
    /// are output.
    pub partition_race: bool,
    /// `stall-limit`: a rank-bounded search stops once its best have not changed for this
    /// many seconds, nor for as long as it took to find them (0: off).
    pub stall_limit: Seconds,
}

impl Default for ExtractOptions {
    fn default() -> ExtractOptions {
        ExtractOptions {
            compaction: CompactionChoice::Early,
            hole_order: HoleOrderChoice::Fewest,
            hole_seed: 1,
            hole_context: HoleContextChoice::Forms,
            max_candidates: 1000,
            max_memory: MaxMemory::Default,
            max_kernels: 0,
            pointwise_kernels: PointwiseKernels::Keep,
            time_limit: Seconds(60.0),
            check_candidates: true,
            stored_grids: StoredGrids::Auto,
            top: 0,
            device: DeviceChoice::H100,
            part_time_limit: Seconds(5.0),
            partition_fallback: true,
            partition_race: true,
            stall_limit: Seconds(3.0),
        }
    }
}

pass_options!(ExtractOptions {
    "compaction" => compaction: OptionKind::Choice(CompactionChoice::WORDS),
        "`early` prunes equivalent partial programs before expanding them (Algorithm 1); `after` constructs every candidate and keeps one per class; `none` outputs every candidate";
    "hole-order" => hole_order: OptionKind::Choice(HoleOrderChoice::WORDS),
        "which hole of a partial program is resolved next: `fewest` valid e-nodes first (forced picks first), the first in `walk` order from the results, `most` e-nodes first, or one `scattered` by a hash of the program and `hole-seed`; the candidates found are the same, the work is not";
    "hole-seed" => hole_seed: OptionKind::Count,
        "the seed of `hole-order=scattered`: each seed is another order, for checking that the candidates found do not depend on it";
    "hole-context" => hole_context: OptionKind::Choice(HoleContextChoice::WORDS),
        "what early compaction compares besides canonical forms: the canonical `forms` of the resolved classes a completion can read, or their `picks` (finer: prunes less); the candidates found are the same, the work is not";
    "max-candidates" => max_candidates: OptionKind::Count,
        "stop after outputting this many candidates per e-graph";
    "max-memory" => max_memory: OptionKind::Int,
        "stop once the process's resident memory reaches this many MiB, or would with the next growth of the search's tables (0: no limit; read where the system reports it, as on Linux); unset, {default} or three quarters of the machine's memory, whichever is less";
    "max-kernels" => max_kernels: OptionKind::Int,
        "only candidates with at most this many kernels (0: any); partial programs that must exceed it are pruned";
    "pointwise-kernels" => pointwise_kernels: OptionKind::Choice(PointwiseKernels::WORDS),
        "`drop`: no candidate has a kernel that only applies pointwise operators (or transposes, reshapes, broadcasts) to loads and stores a value another kernel reads, work its readers could do on their own loads; `keep` outputs them, as the distinct implementations they are";
    "time-limit" => time_limit: OptionKind::Float,
        "stop enumerating an e-graph after this many seconds";
    "check-candidates" => check_candidates: OptionKind::Bool,
        "run every candidate output against the function it was extracted from, in the reference interpreter at small sizes (unit and large inputs), and drop one that differs with a warning: a wrong candidate is a bug in efopt (`EFOPT_WRONG_CANDIDATES=error` makes it an error); `check{sample=0}` is the exhaustive check at the program's own sizes";
    "stored-grids" => stored_grids: OptionKind::Choice(StoredGrids::WORDS),
        "`true`: also candidates that store tiles along two grid axes (`combination[0,b](combination[1,nh](t))`: attention split by batch and head), more candidates, and early compaction is not known to be exact with them, except where some program reads the tile inside a kernel; `every`: those too, refused per program (a `BxTxH · HxH` product stored by `(b, t)` tiles), more still; `auto`: `true` with rank-bounded extraction (`top`) for results of rank 3 or more (attention), or where a value of rank 3 or more is reshaped to fewer dimensions (heads merged), off otherwise, and `every` for the time left where that finds no candidate with a legal schedule";
    "top" => top: OptionKind::Int,
        "rank-bounded extraction: prune partial programs whose lower bound of the rank model's estimate is above the `top`-th best estimate found, and output the best `top` (exactly the top by `rank` once the search ends unstopped); 0 enumerates every class. Unset, a following `rank` sets it to its own `top`";
    "device" => device: OptionKind::Choice(DeviceChoice::WORDS),
        "the GPU model rank-bounded extraction estimates on (data/devices.json); unset, a following `rank`'s";
    "part-time-limit" => part_time_limit: OptionKind::Float,
        "stop the search of each subgraph a composition calls (`partition`) after this many seconds, keeping the best found; the subgraphs share their seconds, so one that ends early leaves its time to those after it (none gets less than this). Unset while `time-limit` is set, the subgraphs share `time-limit` (none gets less than an even share)";
    "partition-race" => partition_race: OptionKind::Bool,
        "search a whole function (that `partition-fallback` could split) partitioned too, as the fallback does, beside its rank-bounded search from the search's first second to the end of the limit (the whole search stops at three quarters of it); where the whole search does not prove its top K, both searches' candidates are output (up to twice `top`) for `rank` to order, and where it does, the partitioned search is stopped. A partitioned search finds the best tiling of each part in a fraction of a second where the whole search may not reach it (linear attention: 54.49 us whole in 60 s, 13.17 us partitioned)";
    "stall-limit" => stall_limit: OptionKind::Float,
        "stop a rank-bounded search once it has ranked a candidate and its best `top` have not changed for this many seconds, nor for as long as the search had run when they last changed (0: off, search to `time-limit` or the proof). Where the bound cannot prove the best (causal prefill: tensor-core work and masked tiles are not in it), the search finds them in its first seconds and the rest of the time limit finds nothing better; a stalled search is not a proof (a remark says so), and `partition-race` still runs after it";
    "partition-fallback" => partition_fallback: OptionKind::Bool,
        "where a rank-bounded search of a whole function ranks nothing (no candidate with a legal schedule) after the other fallbacks, search the function partitioned (as `partition` does: values crossing a cut are stored) for its share of the time, each subgraph saturated with every rule family and searched on its own, and compose their candidates. Off when the preceding `saturate` chooses its `families`";
});

#[derive(Clone)]
pub struct ExtractPass {
    compaction: Compaction,
    hole_order: HoleOrder,
    hole_context: HoleContext,
    max_candidates: usize,
    time_limit: Seconds,
    max_memory: Option<usize>,
    max_kernels: Option<usize>,
    no_pointwise_kernels: bool,
    stored_grids: StoredGrids,
    top: usize,
    device: DeviceChoice,
    part_time_limit: Seconds,
    /// The seconds the subgraphs of compositions share (`parts_budget`).
    parts_pool: PartsPool,
    /// Whether the output's candidates are run against their source (`super::net`).
    check_candidates: bool,
    partition_fallback: bool,
    partition_race: bool,
    /// `stall-limit` (`None`: 0, off).
    stall_limit: Option<Duration>,
    /// What the output's memory limit reads: the process's resident size. (A test gives it
    /// another, to stop the output where it chooses.)
    resident_mib: fn() -> Option<usize>,
    /// Set by the whole search a partitioned search races: its searches stop
    /// (`ExtractStop::Cancelled`) when the whole search has made them unneeded.
    cancel: Option<Arc<AtomicBool>>,
}

impl NamedPass for ExtractPass {
    const NAME: &'static str = "extract";
    type Options = ExtractOptions;

    fn summary() -> String {
        "Enumerate the candidate programs of each e-graph (one per class of equivalent programs) as functions name.c0, name.c1, …".into()
    }

    fn with_options(o: ExtractOptions, spans: OptionSpans) -> ExtractPass {
        ExtractPass {
            compaction: match o.compaction {
                CompactionChoice::Early => Compaction::Early,
                CompactionChoice::After => Compaction::After,
                CompactionChoice::None => Compaction::None,
            },
            hole_order: match o.hole_order {
                HoleOrderChoice::Fewest => HoleOrder::FewestNodes,
                HoleOrderChoice::Walk => HoleOrder::Walk,
                HoleOrderChoice::Most => HoleOrder::MostNodes,
                HoleOrderChoice::Scattered => HoleOrder::Scattered(o.hole_seed),
            },
            hole_context: match o.hole_context {
                HoleContextChoice::Forms => HoleContext::Forms,
                HoleContextChoice::Picks => HoleContext::Picks,
            },
            max_candidates: o.max_candidates,
            time_limit: o.time_limit,
            max_memory: match o.max_memory {
                MaxMemory::MiB(mib) => Some(mib).filter(|n| *n > 0),
                MaxMemory::Default => Some(default_memory_limit(machine_mib())),
            },
            max_kernels: Some(o.max_kernels).filter(|n| *n > 0),
            no_pointwise_kernels: o.pointwise_kernels == PointwiseKernels::Drop,
            stored_grids: o.stored_grids,
            top: o.top,
            device: o.device,
            part_time_limit: o.part_time_limit,
            // A `time-limit` the user chose is the whole search's, subgraphs included,
            // unless `part-time-limit` is chosen too.
            parts_pool: if spans.get("time-limit").is_some()
                && spans.get("part-time-limit").is_none()
            {
                PartsPool::Total(o.time_limit)
            } else {
                PartsPool::PerPart
            },
            check_candidates: o.check_candidates,
            partition_fallback: o.partition_fallback,
            partition_race: o.partition_race,
            stall_limit: (o.stall_limit.0 > 0.0).then(|| o.stall_limit.duration()),
            resident_mib: crate::egraph::extract::resident_mib,
            cancel: None,
        }
    }
}

impl ExtractPass {
    /// The best `top` programs of composition `comp` from its callees' ranked candidates
    /// (`parts`): a k-best merge of estimate sums, each choice inlined, verified and checked
    /// against the source function of that name.
    fn compose(
        &self,
        comp: &Function,
        parts: &BTreeMap<String, Vec<(f64, Function)>>,
        top: usize,
        reducers: &[crate::ir::ReducerDef],
        cx: &mut PassContext,
    ) -> Result<Vec<Function>, Diagnostic> {
        let start = Instant::now();
        let calls = crate::partition::compose::calls(comp);
        let mut lists: Vec<&[(f64, Function)]> = Vec::new();
        for c in &calls {
            // Unranked candidates (no legal schedule) cannot be composed.
            match parts
                .get(c)
                .filter(|l| l.first().is_some_and(|(e, _)| *e < f64::MAX))
            {
                Some(l) => lists.push(l),
                None => {
                    return Err(Diagnostic::error(
                        comp.name_span,
                        format!("extract @{}: no ranked candidate of `{c}` to compose", comp.name),
                    )
                    .with_help("every subgraph needs a candidate with a legal schedule (the warnings and `--stats=json` say what its search found); a larger `saturate{partition-size=…}` keeps more of the function together"))
                }
            }
        }
        let sums: Vec<Vec<f64>> = lists
            .iter()
            .map(|l| l.iter().map(|(e, _)| *e).collect())
            .collect();
        let best = crate::partition::compose::k_best(&sums, top);
        let mut out = Vec::new();
        for (i, (sum, ix)) in best.iter().enumerate() {
            let chosen: Vec<&Function> = ix.iter().zip(&lists).map(|(j, l)| &l[*j].1).collect();
            let mut f =
                crate::partition::compose::inline(comp, &chosen, &format!("{}.c{i}", comp.name));
            let names: Vec<&str> = chosen.iter().map(|g| g.name.as_str()).collect();
            f.comment = Some(format!(
                "composed of {}: {sum:.2} us estimated (sum of parts)",
                names.join(" + ")
            ));
            out.push(f);
        }
        // Typed, as the checks and later passes need them.
        let mut typed = Module {
            reducers: cx.original.reducers.clone(),
            funcs: out,
            egraphs: Vec::new(),
        };
        typed.reducers.extend(
            reducers
                .iter()
                .filter(|r| !cx.original.reducers.iter().any(|o| o.name == r.name))
                .cloned(),
        );
        if let Err(mut d) = crate::verify::verify_module(&mut typed) {
            let mut first = d.remove(0);
            first.message = format!(
                "extract @{}: a composed candidate does not verify (a bug in composition): {}",
                comp.name, first.message
            );
            return Err(first);
        }
        let mut out = typed.funcs;
        let mut line = format!(
            "// extract @{}: composed {} of {} calls ({} distinct subgraphs) by a k-best merge in {:.3} s",
            comp.name,
            out.len(),
            calls.len(),
            calls.iter().collect::<std::collections::BTreeSet<_>>().len(),
            start.elapsed().as_secs_f64()
        );
        if self.check_candidates {
            if let Some(source) = cx.original.funcs.iter().find(|f| f.name == comp.name) {
                // The source's module (its callees, if it was written with calls) with the
                // reducers saturation made.
                let mut module = cx.original.clone();
                module.reducers.extend(
                    reducers
                        .iter()
                        .filter(|r| !cx.original.reducers.iter().any(|o| o.name == r.name))
                        .cloned(),
                );
                let report = super::net::check_candidates(&module, source, &out, cx.seed);
                if let Some(caveat) = &report.caveat {
                    cx.diagnostics
                        .push(super::net::caveat_remark(&comp.name, caveat));
                }
                let wrong: Vec<usize> = report.wrong.iter().map(|(i, _)| *i).collect();
                for (i, why) in &report.wrong {
                    cx.diagnostics.push(super::net::wrong_candidate(
                        &module, &comp.name, &out[*i], why,
                    ));
                }
                match &report.skipped {
                    Some(why) => {
                        cx.diagnostics.push(Diagnostic::global(
                            Severity::Warning,
                            format!(
                                "extract @{}: composed candidates not checked: {why}",
                                comp.name
                            ),
                        ));
                        line.push_str(&format!("; not checked: {why}"));
                    }
                    None => line.push_str(&format!(
                        "; {} checked against the source, {} wrong and dropped",
                        report.checked,
                        wrong.len()
                    )),
                }
                let mut k = 0;
                out.retain(|_| {
                    k += 1;
                    !wrong.contains(&(k - 1))
                });
            }
        }
        cx.report.push(line);
        Ok(out)
    }

    /// The partitioned fallback: `functions` (a partition's subgraph functions and their
    /// composition) saturated with every family and extracted in `share`, the parts' time
    /// split evenly. The composed candidates, checked against the source by `compose`.
    fn search_partitioned(
        &self,
        functions: Vec<Function>,
        reducers: &[crate::ir::ReducerDef],
        share: Duration,
        cx: &mut PassContext,
    ) -> Result<Vec<Function>, Vec<Diagnostic>> {
        let start = Instant::now();
        let parts = functions.len().saturating_sub(1).max(1);
        let mut sub = Module {
            reducers: reducers.to_vec(),
            funcs: functions,
            egraphs: Vec::new(),
        };
        crate::verify::verify_module(&mut sub)?;
        // The nested passes' counters would replace this pass's.
        let counters = std::mem::take(&mut cx.counters);
        let mut saturate = super::saturate::SaturatePass::with_options(
            super::saturate::SaturateOptions {
                partition_above: 0,
                ..Default::default()
            },
            OptionSpans::default(),
        );
        let result = saturate.run(&mut sub, cx).and_then(|()| {
            // Tenths of a second, as the other fallbacks' shares.
            let tenths = |s: f64| (s * 10.0).floor() / 10.0;
            let left = tenths(share.saturating_sub(start.elapsed()).as_secs_f64());
            let mut extract = ExtractPass {
                time_limit: Seconds(left),
                part_time_limit: Seconds(tenths(left / parts as f64)),
                parts_pool: PartsPool::Total(Seconds(left)),
                partition_fallback: false,
                ..self.clone()
            };
            extract.run(&mut sub, cx)
        });
        cx.counters = counters;
        result.map(|()| sub.funcs)
    }

    /// Searches split function `p` partitioned in `share` (the fallback, or the race: `why`)
    /// and returns its composed candidates, if any. Why it gave none becomes remarks, marked
    /// with `why`: what the whole function's search found is said on its own.
    fn search_split(
        &self,
        p: super::partition::Partitioned,
        why: &str,
        reducers: &[crate::ir::ReducerDef],
        share: Duration,
        cx: &mut PassContext,
    ) -> Option<Vec<Function>> {
        cx.report.push(p.line);
        match self.search_partitioned(p.functions, reducers, share, cx) {
            Ok(fs) if !fs.is_empty() => Some(fs),
            Ok(_) => None,
            Err(ds) => {
                for mut d in ds {
                    d.severity = Severity::Remark;
                    d.message = format!("({why}) {}", d.message);
                    cx.diagnostics.push(d);
                }
                None
            }
        }
    }

    /// Rank-bounded extraction's bound and scorer (`top` > 0), on `device`.
    fn rank_bound(
        &self,
        env: &crate::verify::typing::TypeEnv,
        top: usize,
    ) -> Result<Option<RankBound>, Vec<Diagnostic>> {
        if top == 0 {
            return Ok(None);
        }
        let dev = device(self.device.word())
            .map_err(|m| vec![Diagnostic::global(Severity::Error, format!("extract: {m}"))])?;
        Ok(Some(rank_bound_on(env, dev, top)))
    }

    /// The pass reading the resident size from `reader` instead of the process (a test stops
    /// the output where it chooses).
    pub fn with_resident_reader(mut self, reader: fn() -> Option<usize>) -> ExtractPass {
        self.resident_mib = reader;
        self
    }
}

impl Pass for ExtractPass {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        // The module's e-graph dumps; a module without any is extracted from its functions.
        let graphs = super::saturate::module_egraphs(module, module.egraphs.is_empty())?;
        let extractor = Extractor::default()
            .with_compaction(self.compaction)
            .with_hole_order(self.hole_order)
            .with_hole_context(self.hole_context)
            .with_max_candidates(self.max_candidates)
            .with_time_limit(self.time_limit.duration())
            .with_memory_limit(self.max_memory)
            .with_max_kernels(self.max_kernels)
            .with_no_pointwise_kernels(self.no_pointwise_kernels)
            .with_cancel(self.cancel.clone());
        let mut funcs = Vec::new();
        let mut per_graph = Vec::new();
        let mut errors = Vec::new();
        // Subgraphs a composition calls: their best candidates (by the rank model) are kept
        // aside for the composition, not output.
        let compositions: Vec<Function> = module
            .funcs
            .iter()
            .filter(|f| crate::partition::has_calls(f))
            .cloned()
            .collect();
        let callees: std::collections::BTreeSet<String> = compositions
            .iter()
            .flat_map(crate::partition::compose::calls)
            .collect();
        let compose_top = if self.top > 0 { self.top } else { COMPOSE_TOP };
        let mut parts_budget = PartsBudget::new(
            self.parts_pool,
            self.part_time_limit,
            graphs.iter().filter(|g| callees.contains(&g.name)).count(),
        );
        let mut parts: BTreeMap<String, Vec<(f64, Function)>> = BTreeMap::new();
        for g in &graphs {
            let is_part = callees.contains(&g.name);
            let stored_grids = match self.stored_grids {
                StoredGrids::True | StoredGrids::Every => true,
                StoredGrids::False => false,
                // What ranks best is what rank-bounded extraction looks for: attention
                // split by batch and head is the only way to fill the GPU at decode (MHA
                // decode at B = 16: 1,478.94 us best without, 360.05 us with, 10 s each).
                // Only results of rank 3 or more have two dimensions besides the one a
                // kernel's tile spans; for the rest (MLPs) it only adds candidates.
                // A value reshaped from one (heads merged into `BxH`) counts as one.
                StoredGrids::Auto => {
                    let rank3 = |c: egg::Id| matches!(&g.egraph[c].data, Some(crate::ir::Type::Tensor(t)) if t.shape.len() >= 3);
                    // Heads merged (a reshape of a rank-3-or-more value to fewer
                    // dimensions) anywhere: attention whose output is merged, gated or
                    // projected afterwards (a gated decode: 219.99 us without, 51.71 with).
                    let merged = || {
                        g.egraph.classes().any(|c| {
                            c.nodes.iter().any(|n| {
                                matches!(&n.op, crate::egraph::lang::Op::Reshape(s)
                                    if n.children.iter().any(|k| {
                                        matches!(&g.egraph[*k].data, Some(crate::ir::Type::Tensor(t)) if t.shape.len() >= 3 && s.len() < t.shape.len())
                                    }))
                            })
                        })
                    };
                    (self.top > 0 || is_part) && (g.roots.iter().any(|r| rank3(*r)) || merged())
                }
            };
            let built = if self.stored_grids == StoredGrids::Every {
                ExtractGraph::with_every_stored_grid(g)
            } else if stored_grids {
                ExtractGraph::with_stored_grids(g)
            } else {
                ExtractGraph::new(g)
            };
            let mut x = match built {
                Ok(x) => x,
                Err(e) => {
                    errors.push(
                        Diagnostic::error(g.name_span, format!("extract @{}: {e}", g.name))
                            .with_help(if e.contains("`lower` refuses") {
                                "write the construct `lower` refuses another way (docs/lower.md), or saturate with the refinement rules so that every matmul has a tiled implementation"
                            } else {
                                "saturate with the refinement rules so that every matmul has a tiled implementation"
                            }),
                    );
                    continue;
                }
            };
            let top = if is_part { compose_top } else { self.top };
            let limit = if is_part {
                parts_budget.next_share()
            } else {
                self.time_limit.duration()
            };
            // The function as written (not one a dump holds), or the subgraph `saturate` made
            // (`cx.parts`), split as the partitioned fallback and the race search it.
            let split = if !self.partition_fallback || top == 0 {
                None
            } else if is_part {
                cx.parts.get(&g.name).and_then(fallback_partition)
            } else {
                cx.original
                    .funcs
                    .iter()
                    .find(|f| f.name == g.name && !crate::partition::has_calls(f))
                    .and_then(fallback_partition)
            };
            // With a race, the whole search stops at three quarters of the limit. Not a
            // subgraph's: its parts' candidates compose already.
            let race =
                self.partition_race && !is_part && split.is_some() && limit >= RACE_MIN_LIMIT;
            let whole_limit = if race { limit.mul_f64(0.75) } else { limit };
            let mut extractor = extractor
                .clone()
                .with_time_limit(whole_limit)
                .with_stall_limit(self.stall_limit)
                .with_lowerable(lower_check(&g.egraph.analysis.env))
                .with_rank_bound(self.rank_bound(&g.egraph.analysis.env, top)?);
            let shown = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            if cx.progress {
                let (name, shown) = (g.name.clone(), shown.clone());
                extractor = extractor.with_progress(std::sync::Arc::new(move |p| {
                    shown.store(true, std::sync::atomic::Ordering::Relaxed);
                    // The best estimates so far, and when they last changed.
                    let best = match (p.best_us, p.kth_us) {
                        (Some(b), Some(k)) => format!(
                            ", best {b:.2} us, last of top {k:.2} us (top changed at {} expanded)",
                            p.last_improvement
                        ),
                        (Some(b), None) => format!(", best {b:.2} us"),
                        _ => String::new(),
                    };
                    eprint!(
                        "\r// extract @{name}: {} expanded, {} complete, {} distinct, {} waiting{best}, {:.1} s   ",
                        p.expanded, p.complete, p.distinct, p.worklist, p.seconds
                    );
                }));
            }
            // A rank-bounded search that finds nothing with a legal schedule in a third of its
            // time in the default order (most constrained hole first, which can dive into
            // programs holding whole large tiles: differential attention) searches the rest
            // in walk order.
            let retry = extractor.rank_bound.is_some()
                && extractor.hole_order == HoleOrder::FewestNodes
                && limit > Duration::from_secs(3);
            if retry {
                extractor = extractor.with_unranked_after(Some(whole_limit / 3));
            }
            let started = Instant::now();
            let ranked = |r: &crate::egraph::extract::ExtractReport| {
                r.candidates.iter().any(|c| c.estimate.is_some())
            };
            // The race: a partitioned search runs beside the whole search once that has
            // gone on for `RACE_DELAY` (a whole search proving its best sooner has the
            // machine to itself), and stops as soon as the whole search ends unless that
            // ran to its limit with ranked candidates: then both searches' candidates are
            // output. (MHA prefill: the whole search stalls at 4.8 s, the partitioned one
            // needs 5 s more; one after the other they took 10 s.)
            let racer = split
                .clone()
                .filter(|_| race)
                .map(|p| Racer::spawn(self, p, &module.reducers, cx, started, limit));
            let mut report = extractor.run(&x);
            let whole_stopped = started.elapsed();
            let keep = ranked(&report)
                && matches!(
                    report.stop,
                    crate::egraph::extract::ExtractStop::TimeLimit(_)
                        | crate::egraph::extract::ExtractStop::Stalled(_)
                );
            // A whole search that ranks nothing falls back to other searches, the last of
            // them partitioned: the partitioned search beside it goes on meanwhile and is
            // that one's answer.
            let unranked = !ranked(&report)
                && matches!(
                    report.stop,
                    crate::egraph::extract::ExtractStop::NothingRanked(_)
                        | crate::egraph::extract::ExtractStop::Exhausted
                );
            let (beside, mut in_hand) = match racer {
                Some(r) if keep => (r.finish(false), None),
                Some(r) if unranked => {
                    r.start_now();
                    (None, Some(r))
                }
                Some(r) => {
                    r.finish(true);
                    (None, None)
                }
                None => (None, None),
            };
            // A rank-bounded search that ranks nothing (no candidate with a legal schedule, by
            // a third of its time or exhausted) gives the time left to other searches in turn,
            // each an equal share of what is left, until one ranks a candidate:
            // - every stored grid (`stored-grids=every`, under `auto`): a `BxTxH · HxH`
            //   product keeps its tiles small only stored by a two-axis grid whose class
            //   another program reads inside a kernel;
            // - walk order (most constrained hole first can dive into programs that hold
            //   whole large tiles: differential attention).
            let unranked_at = match report.stop {
                crate::egraph::extract::ExtractStop::NothingRanked(s) => Some(s),
                _ => None,
            };
            let mut composed: Option<Vec<Function>> = None;
            if extractor.rank_bound.is_some()
                && !ranked(&report)
                && (unranked_at.is_some()
                    || report.stop == crate::egraph::extract::ExtractStop::Exhausted)
            {
                let auto = self.stored_grids == StoredGrids::Auto;
                let mut steps = Vec::new();
                if auto {
                    steps.push(Fallback::EveryGrid);
                }
                if unranked_at.is_some() {
                    steps.push(Fallback::WalkOrder);
                }
                if split.is_some() {
                    steps.push(Fallback::Partitioned);
                }
                let mut split = split.clone();
                let n = steps.len();
                for (i, step) in steps.into_iter().enumerate() {
                    // The partitioned search beside the whole one is this step: its
                    // answer is taken below.
                    if step == Fallback::Partitioned && in_hand.is_some() {
                        break;
                    }
                    let left = limit.saturating_sub(started.elapsed()) / (n - i) as u32;
                    let share = Duration::from_secs_f64((left.as_secs_f64() * 10.0).round() / 10.0);
                    if share < Duration::from_millis(100) {
                        break;
                    }
                    let graph = match step {
                        Fallback::EveryGrid => Some(ExtractGraph::with_every_stored_grid(g)),
                        Fallback::WalkOrder | Fallback::Partitioned => None,
                    };
                    if let Some(Err(_)) = graph {
                        continue;
                    }
                    let after = match (i, unranked_at) {
                        (0, Some(s)) => format!(" after {s:.1} s"),
                        _ => String::new(),
                    };
                    cx.diagnostics.push(Diagnostic::global(
                        Severity::Remark,
                        format!(
                            "extract @{}: no candidate with a legal schedule{after} ({} states{}): searching {} for {:.1} s",
                            g.name,
                            report.expanded,
                            if i == 0 && unranked_at.is_some() {
                                ", most constrained hole first"
                            } else {
                                ""
                            },
                            step.what(),
                            share.as_secs_f64()
                        ),
                    ));
                    crate::release_free_memory();
                    if step == Fallback::Partitioned {
                        let Some(p) = split.take() else { break };
                        composed = self.search_split(
                            p,
                            "partitioned fallback",
                            &module.reducers,
                            share,
                            cx,
                        );
                        break;
                    }
                    let mut again = extractor
                        .clone()
                        .with_unranked_after(None)
                        .with_time_limit(share);
                    if step == Fallback::WalkOrder {
                        again = again.with_hole_order(HoleOrder::Walk);
                    }
                    match graph {
                        Some(Ok(other)) => {
                            let r = again.run(&other);
                            if ranked(&r) {
                                report = r;
                                x = other;
                                break;
                            }
                        }
                        _ => {
                            report = again.run(&x);
                            if ranked(&report) {
                                break;
                            }
                        }
                    }
                }
            }
            if let Some(r) = in_hand.take() {
                if ranked(&report) {
                    r.finish(true);
                } else if let Some(b) = r.finish(false) {
                    // Started beside the whole search, or when it ended (before the race's
                    // delay) as the fallback's.
                    let how = if !b.asked {
                        format!(
                            "the partitioned search that ran beside the whole search from {} s answers (`partition-race`)",
                            b.at.as_secs_f64()
                        )
                    } else {
                        format!(
                            "searching {} for {:.1} s",
                            Fallback::Partitioned.what(),
                            b.share.as_secs_f64()
                        )
                    };
                    cx.diagnostics.push(Diagnostic::global(
                        Severity::Remark,
                        format!(
                            "extract @{}: no candidate with a legal schedule ({} states): {how}",
                            g.name, report.expanded,
                        ),
                    ));
                    cx.report.extend(b.report);
                    cx.diagnostics.extend(b.diagnostics);
                    composed = b.functions;
                }
            }
            // Under `stored-grids=auto`, a search that proved its top K proved it only among
            // programs storing values along one grid axis (results of rank 2: MLPs) or
            // storing only what no kernel reads (`true`, rank 3); every stored grid may hold
            // a better one (two chained GEMMs at M = 4096: 357.22 us proven, 90.11 us with
            // every grid; a bf16 SwiGLU over BxTxH: 2,082.89 us proven with `true`, whose
            // hidden activation some fused program reads, 192.90 us). It gets twice the
            // time the proof took (at least two seconds, at most what is left: the GELU
            // MLP's best takes 7,500 states, half a second here and more on a loaded
            // machine), and its candidates replace the proven ones where its best ranks
            // better.
            let best = |r: &crate::egraph::extract::ExtractReport| {
                r.candidates
                    .iter()
                    .filter_map(|c| c.estimate)
                    .fold(f64::INFINITY, f64::min)
            };
            let mut retried = false;
            if self.stored_grids == StoredGrids::Auto
                && composed.is_none()
                && extractor.rank_bound.is_some()
                && ranked(&report)
                && report.stop.searched_all()
            {
                let spent = started.elapsed();
                let share = limit
                    .saturating_sub(spent)
                    .min((spent * 2).max(Duration::from_secs(2)));
                if share >= Duration::from_millis(100) {
                    if let Ok(other) = ExtractGraph::with_every_stored_grid(g) {
                        // Half in the search's own order, then, unless that proved its top K,
                        // half in walk order: most constrained hole first dives into the
                        // fused programs (the SwiGLU above: nothing better in 11 s; walk
                        // order finds 192.90 us within 2 s).
                        let half = floor_tenths(share / 2);
                        let mut r = extractor
                            .clone()
                            .with_unranked_after(None)
                            .with_time_limit(half)
                            .run(&other);
                        if !r.stop.searched_all() && extractor.hole_order != HoleOrder::Walk {
                            let walked = extractor
                                .clone()
                                .with_unranked_after(None)
                                .with_hole_order(HoleOrder::Walk)
                                .with_time_limit(floor_tenths(share.saturating_sub(half)))
                                .run(&other);
                            if best(&walked) < best(&r) {
                                r = walked;
                            }
                        }
                        let (was, now) = (best(&report), best(&r));
                        if now < was {
                            cx.diagnostics.push(Diagnostic::global(
                                Severity::Remark,
                                format!(
                                    "extract @{}: with every stored grid the best ranks {now:.2} us, against {was:.2} us proven {}: its candidates are output (`stored-grids=auto`)",
                                    g.name,
                                    if stored_grids {
                                        "storing only tiles no kernel reads"
                                    } else {
                                        "with one grid axis"
                                    }
                                ),
                            ));
                            report = r;
                            x = other;
                            retried = true;
                        }
                    }
                }
            }
            // The race: a whole search that ran to its limit with ranked candidates leaves
            // the rest of the limit to the partitioned search, whose candidates join its own.
            let mut raced: Option<Vec<Function>> = None;
            if let Some(b) = beside {
                cx.diagnostics.push(Diagnostic::global(
                    Severity::Remark,
                    format!(
                        "extract @{}: the whole search stopped at {} s without proving its top {top}: a partitioned search ran beside it from {} s for up to {} s (`partition-race`)",
                        g.name,
                        match report.stop {
                            crate::egraph::extract::ExtractStop::Stalled(_) =>
                                floor_tenths(whole_stopped).as_secs_f64(),
                            _ => whole_limit.as_secs_f64(),
                        },
                        b.at.as_secs_f64(),
                        b.share.as_secs_f64()
                    ),
                ));
                cx.report.extend(b.report);
                cx.diagnostics.extend(b.diagnostics);
                raced = b.functions;
            }
            // The whole search ended before the partitioned one started: it runs now, in the
            // time left. (Not after the every-grid search replaced a proven top K: its time
            // was spent there.)
            else if race
                && !retried
                && composed.is_none()
                && ranked(&report)
                && matches!(
                    report.stop,
                    crate::egraph::extract::ExtractStop::TimeLimit(_)
                        | crate::egraph::extract::ExtractStop::Stalled(_)
                )
            {
                let left = limit.saturating_sub(started.elapsed());
                let share = floor_tenths(left);
                if let (Some(p), true) = (split, share >= Duration::from_millis(100)) {
                    cx.diagnostics.push(Diagnostic::global(
                        Severity::Remark,
                        format!(
                            "extract @{}: the whole search stopped at {} s without proving its top {top}: searching partitioned for up to {:.1} s (`partition-race`)",
                            g.name,
                            match report.stop {
                                crate::egraph::extract::ExtractStop::Stalled(_) =>
                                    floor_tenths(started.elapsed()).as_secs_f64(),
                                _ => whole_limit.as_secs_f64(),
                            },
                            share.as_secs_f64()
                        ),
                    ));
                    crate::release_free_memory();
                    raced = self.search_split(p, "partition race", &module.reducers, share, cx);
                }
            }
            if is_part {
                parts_budget.spent(started.elapsed());
            }
            // The search's seen-set and worklist are gone: what the output may use is measured
            // from what is live now.
            crate::release_free_memory();
            if shown.load(std::sync::atomic::Ordering::Relaxed) {
                eprintln!();
            }
            if let Some(fs) = composed {
                cx.diagnostics.push(Diagnostic::global(
                    Severity::Remark,
                    format!(
                        "extract @{}: {} candidate(s) composed from its partitioned search (the whole function's search ranked none)",
                        g.name,
                        fs.len()
                    ),
                ));
                let mut row = search_counters(&report);
                row.insert("egraph".into(), g.name.clone().into());
                row.insert("fallback".into(), "partitioned".into());
                row.insert("output".into(), fs.len().into());
                per_graph.push(serde_json::Value::Object(row));
                if is_part {
                    // A subgraph's candidates go to its composition, ranked by the model.
                    let score = self
                        .rank_bound(&g.egraph.analysis.env, top)?
                        .map(|rb| rb.score);
                    let scored = fs
                        .into_iter()
                        .map(|f| {
                            let e = score.as_ref().and_then(|s| s(&f).ok().flatten());
                            (e.unwrap_or(f64::MAX), f)
                        })
                        .collect();
                    parts.insert(g.name.clone(), scored);
                    continue;
                }
                funcs.extend(fs);
                continue;
            }
            if report.stop != crate::egraph::extract::ExtractStop::Exhausted {
                cx.diagnostics.push(Diagnostic::global(
                    Severity::Remark,
                    format!("extract @{}: stopped: {}", g.name, report.stop),
                ));
            }
            if let Some(reason) = &x.first_unlowerable {
                cx.diagnostics.push(Diagnostic::global(
                    Severity::Remark,
                    format!(
                        "extract @{}: {} e-node(s) never picked because `lower` refuses them in any program; the first: {reason}",
                        g.name, x.unlowerable
                    ),
                ));
            }
            if let Some(reason) = &report.first_refusal {
                cx.diagnostics.push(Diagnostic::global(
                    Severity::Remark,
                    format!(
                        "extract @{}: {} complete program(s) not output because `lower` refuses them; the first: {reason}",
                        g.name, report.not_lowerable
                    ),
                ));
            }
            // Written once the output is built, whose size it gives.
            let compaction = format!("{:?}", self.compaction).to_lowercase();
            // Shown only when some were left out: most programs have none.
            let renamed = match report.renamed {
                0 => String::new(),
                n => format!(
                    "{n} renaming{} of output axes, ",
                    if n == 1 { "" } else { "s" }
                ),
            };
            let summary_line = |output: usize| {
                format!(
                    "// extract @{}: compaction={compaction}, {} expanded, {} complete, {} distinct, {renamed}{output} output, {} without launch order, {} not lowerable, {} unlowerable e-nodes pruned, {}, {:.3} s",
                    g.name,
                    report.expanded,
                    report.complete,
                    report.distinct,
                    report.rejected,
                    report.not_lowerable,
                    report.unlowerable_enodes,
                    report.stop,
                    report.seconds
                )
            };
            let total = report.candidates.len();
            // The output replaces the e-graph by its candidates: with none it would be an
            // empty module, which is no program.
            if total == 0 {
                cx.report.push(summary_line(0));
                // The counters the help points to: where the complete programs went.
                let mut row = search_counters(&report);
                row.insert("egraph".into(), g.name.clone().into());
                row.insert("output".into(), 0.into());
                per_graph.push(serde_json::Value::Object(row));
                let help = match report.stop {
                    crate::egraph::extract::ExtractStop::Exhausted if report.first_too_large.is_some() && report.complete == 0 => format!("every program computes a tile larger than any schedule holds in registers ({} partial programs pruned; the first: {}): a rule that splits its large dimensions would make one", report.too_large_value, report.first_too_large.as_deref().unwrap_or("")),
                    crate::egraph::extract::ExtractStop::Exhausted => "every complete program was refused (no launch order, not lowerable, over max-kernels, with a pointwise kernel under pointwise-kernels=drop, or a fused result nobody reads; counters in --stats=json)".to_string(),
                    _ => "raise the limit that stopped the search".to_string(),
                };
                errors.push(
                    Diagnostic::error(
                        g.name_span,
                        format!("extract @{}: no candidate ({})", g.name, report.stop),
                    )
                    .with_help(help),
                );
                continue;
            }
            // Building the output of a long run takes seconds (MHA decode at 8 GiB: 272,160
            // functions in 10 s), so a run that shows progress shows it here too, on the same
            // terms: once the run is past a second, every quarter second.
            let output_start = Instant::now();
            let mut next_report = Duration::from_secs(1);
            let mut output_shown = false;
            let elapsed = || Duration::from_secs_f64(report.seconds) + output_start.elapsed();
            let show = |built: usize, elapsed: Duration| {
                eprint!(
                    "\r// extract @{}: {built} of {total} output functions built, {:.1} s   ",
                    g.name,
                    elapsed.as_secs_f64()
                );
            };
            let stop_before = |built: usize| {
                let elapsed = elapsed();
                if cx.progress && elapsed >= next_report {
                    next_report = elapsed + Duration::from_millis(250);
                    output_shown = true;
                    show(built, elapsed);
                }
                // Reading the resident size costs microseconds: once a chunk (`OUTPUT_CHUNK`).
                self.max_memory
                    .is_some_and(|limit| (self.resident_mib)().is_some_and(|m| m >= limit))
            };
            let output =
                candidate_functions(&x, &g.name, &report.candidates, OUTPUT_CHUNK, stop_before);
            if output_shown {
                show(output.functions.len(), elapsed());
                eprintln!();
            }
            let output_stop = (output.functions.len() < total).then(|| {
                let limit = self.max_memory.unwrap_or_default();
                cx.diagnostics.push(Diagnostic::global(
                    Severity::Remark,
                    format!(
                        "extract @{}: output stopped at the memory limit ({limit} MiB): the first {} of {total} candidates are output",
                        g.name,
                        output.functions.len()
                    ),
                ));
                format!("memory limit ({limit} MiB) reached")
            });
            let mut output = output;
            if is_part {
                cx.report.push(summary_line(output.functions.len()));
                let estimates = report
                    .candidates
                    .iter()
                    .map(|c| c.estimate.unwrap_or(f64::MAX));
                parts.insert(g.name.clone(), estimates.zip(output.functions).collect());
                let mut row = search_counters(&report);
                row.insert("egraph".into(), g.name.clone().into());
                row.insert("output".into(), report.candidates.len().into());
                row.insert("seconds".into(), report.seconds.into());
                per_graph.push(serde_json::Value::Object(row));
                continue;
            }
            let net = self.check_candidates.then(|| self.net(g, &mut output, cx));
            let output_count = output.functions.len();
            cx.report.push(summary_line(output_count));
            if let Some(line) = net.as_ref().map(|n| n.line.clone()) {
                cx.report.push(line);
            }
            // Moved, not copied, where it is the only e-graph's (the copy would hold both).
            if funcs.is_empty() {
                funcs = output.functions;
            } else {
                funcs.extend(output.functions);
            }
            // The race's candidates after the whole search's, numbered on from them.
            let raced_count = raced.as_ref().map(Vec::len);
            if let Some(fs) = raced {
                cx.diagnostics.push(Diagnostic::global(
                    Severity::Remark,
                    format!(
                        "extract @{}: {} candidate(s) from the whole search and {} composed from the partitioned one (`partition-race`), for `rank` to order",
                        g.name,
                        output_count,
                        fs.len()
                    ),
                ));
                for (i, mut f) in fs.into_iter().enumerate() {
                    f.name = format!("{}.c{}", g.name, output_count + i);
                    funcs.push(f);
                }
            }
            let mut row = serde_json::json!({
                "egraph": g.name,
                "compaction": format!("{:?}", self.compaction).to_lowercase(),
                "output": output_count,
                // Why fewer candidates than were found are output (null: all are).
                "output_stop": output_stop,
                // The limits in force, defaults included (null: none).
                "limits": {
                    "max_candidates": self.max_candidates,
                    "time_limit_s": self.time_limit.0,
                    "max_memory_mib": self.max_memory,
                    "max_kernels": self.max_kernels,
                },
                "seconds": report.seconds,
            });
            // Moved in: `json!` would serialise a copy of the list (one row per output
            // candidate), allocated after the output stopped at the memory limit.
            if let Some(fields) = row.as_object_mut() {
                fields.extend(search_counters(&report));
                if let Some(net) = net {
                    fields.insert("candidate_check".into(), net.stats);
                }
                // Candidates composed by the partition race, output after these (null: none).
                fields.insert("partition_race".into(), raced_count.into());
                fields.insert("candidates".into(), serde_json::Value::Array(output.listed));
            }
            per_graph.push(row);
        }
        if errors.is_empty() {
            for comp in &compositions {
                match self.compose(comp, &parts, compose_top, &module.reducers, cx) {
                    Ok(composed) => funcs.extend(composed),
                    Err(d) => errors.push(d),
                }
            }
        }
        cx.counters
            .insert("egraphs".into(), serde_json::Value::Array(per_graph));
        if !errors.is_empty() {
            return Err(errors);
        }
        module.egraphs.clear();
        module.funcs = funcs;
        Ok(())
    }
}

/// How long a whole search runs alone before a partitioned search races it.
const RACE_DELAY: Duration = Duration::from_secs(1);

/// What the partitioned search racing a whole search gave (`RACE_DELAY`): its composed
/// candidates, its report lines and remarks, when it started and its time limit.
struct RaceBeside {
    functions: Option<Vec<Function>>,
    report: Vec<String>,
    diagnostics: Vec<Diagnostic>,
    at: Duration,
    share: Duration,
    /// Started when the whole search asked for it (ranking nothing), not beside it.
    asked: bool,
}

/// The partitioned search racing a whole search, on its own thread: it starts once the
/// whole search has run for `RACE_DELAY`, or when told to start now, never once told the
/// whole search is done first; it runs to the end of the limit, its own stall, or its cancel
/// flag.
struct Racer {
    handle: std::thread::JoinHandle<Option<RaceBeside>>,
    cancel: Arc<AtomicBool>,
    signal: Arc<(std::sync::Mutex<RaceSignal>, std::sync::Condvar)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RaceSignal {
    Wait,
    StartNow,
    WholeDone,
}

impl Racer {
    fn spawn(
        pass: &ExtractPass,
        p: super::partition::Partitioned,
        reducers: &[crate::ir::ReducerDef],
        cx: &PassContext,
        started: Instant,
        limit: Duration,
    ) -> Racer {
        let cancel = Arc::new(AtomicBool::new(false));
        let signal = Arc::new((
            std::sync::Mutex::new(RaceSignal::Wait),
            std::sync::Condvar::new(),
        ));
        let pass = ExtractPass {
            cancel: Some(cancel.clone()),
            ..pass.clone()
        };
        let reducers = reducers.to_vec();
        // The thread owns what it reads: the pass goes on while it runs.
        let (mut sources, original) = (cx.sources.clone(), cx.original.clone());
        let (seed, progress, base_dir) = (cx.seed, cx.progress, cx.base_dir.clone());
        let told = signal.clone();
        let handle = std::thread::spawn(move || {
            let (lock, cv) = &*told;
            let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
            let (guard, _) = cv
                .wait_timeout_while(guard, RACE_DELAY, |s| *s == RaceSignal::Wait)
                .unwrap_or_else(|e| e.into_inner());
            if *guard == RaceSignal::WholeDone {
                return None;
            }
            let asked = *guard == RaceSignal::StartNow;
            drop(guard);
            let share = floor_tenths(limit.saturating_sub(started.elapsed()));
            let mut parts = BTreeMap::new();
            let mut rcx = PassContext {
                sources: &mut sources,
                original: &original,
                seed,
                base_dir,
                report: Vec::new(),
                diagnostics: Vec::new(),
                counters: BTreeMap::new(),
                emitted: None,
                progress,
                parts: &mut parts,
            };
            let at = floor_tenths(started.elapsed());
            let functions = pass.search_split(p, "partition race", &reducers, share, &mut rcx);
            Some(RaceBeside {
                functions,
                report: rcx.report,
                diagnostics: rcx.diagnostics,
                at,
                share,
                asked,
            })
        });
        Racer {
            handle,
            cancel,
            signal,
        }
    }

    /// Tells the thread, unless it has started (or been told) already.
    fn tell(&self, s: RaceSignal) {
        let mut state = self.signal.0.lock().unwrap_or_else(|e| e.into_inner());
        if *state == RaceSignal::Wait {
            *state = s;
        }
        self.signal.1.notify_all();
    }

    /// Its answer is wanted (the fallback's partitioned search): it starts now if it has
    /// not.
    fn start_now(&self) {
        self.tell(RaceSignal::StartNow);
    }

    /// Its answer (`None` if it never started); `cancel` stops it first, for an answer
    /// that is dropped.
    fn finish(self, cancel: bool) -> Option<RaceBeside> {
        if cancel {
            self.cancel.store(true, Ordering::Relaxed);
        }
        // The whole search has ended: a race not yet started never starts.
        self.tell(RaceSignal::WholeDone);
        self.handle
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}

/// The shortest time limit a race splits: below it the partitioned search's quarter is too
/// short to saturate and search its parts.
const RACE_MIN_LIMIT: Duration = Duration::from_secs(2);

/// How the partitioned fallback splits `f`: at the default subgraph size, or in two or more
/// where `f` is smaller (`partition` keeps the cut that moves the fewest bytes); `None` when
/// `f` has fewer than two compute nodes or no cut.
fn fallback_partition(f: &Function) -> Option<super::partition::Partitioned> {
    let nodes = crate::partition::compute_nodes(f);
    if nodes < 2 {
        return None;
    }
    let size = super::partition::PartitionOptions::default()
        .size
        .min(nodes - 1);
    super::partition::partition_function(f, size).ok().flatten()
}

/// What the net found on one e-graph's output: its report line and `--stats=json` object.
struct NetOutcome {
    line: String,
    stats: serde_json::Value,
}

impl ExtractPass {
    /// Runs the output's candidates against the function the e-graph was built from
    /// (`super::net`), drops the wrong ones with a warning each, and numbers the rest again.
    fn net(
        &self,
        g: &crate::egraph::TypedEGraph,
        output: &mut CandidateOutput,
        cx: &mut PassContext,
    ) -> NetOutcome {
        let Some(source) = cx.original.funcs.iter().find(|f| f.name == g.name) else {
            let why = "no source function of that name (extracted from a dump): run `check{against=SOURCE}`";
            return NetOutcome {
                line: format!("// extract @{}: candidates not checked: {why}", g.name),
                stats: serde_json::json!({ "checked": 0, "skipped": why }),
            };
        };
        let module = Module {
            reducers: g.egraph.analysis.env.reducers().to_vec(),
            ..Module::default()
        };
        let report = super::net::check_candidates(&module, source, &output.functions, cx.seed);
        let sizes: Vec<String> = report
            .sizes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if let Some(caveat) = &report.caveat {
            cx.diagnostics
                .push(super::net::caveat_remark(&g.name, caveat));
        }
        if let Some(why) = &report.skipped {
            cx.diagnostics.push(Diagnostic::global(
                Severity::Warning,
                format!("extract @{}: candidates not checked: {why}", g.name),
            ));
        }
        let wrong: Vec<usize> = report.wrong.iter().map(|(i, _)| *i).collect();
        // One diagnostic each for the first few; the rest in one line. The first says which
        // rules it needs (each saturation again without one rule: seconds, once).
        for (n, (i, why)) in report.wrong.iter().take(WRONG_SHOWN).enumerate() {
            let f = &output.functions[*i];
            let mut d = super::net::wrong_candidate(&module, &g.name, f, why);
            if n == 0 {
                let diagnosis = super::net::diagnose(
                    source,
                    &cx.original.reducers,
                    f,
                    &module.reducers,
                    &crate::egraph::rules::all_rules(),
                    DIAGNOSIS_BUDGET,
                );
                d.notes.push(crate::diag::Note {
                    span: None,
                    message: super::net::diagnosis_note(&diagnosis),
                });
            }
            cx.diagnostics.push(d);
        }
        if report.wrong.len() > WRONG_SHOWN {
            let rest: Vec<&str> = report.wrong[WRONG_SHOWN..]
                .iter()
                .map(|(i, _)| output.functions[*i].name.as_str())
                .collect();
            cx.diagnostics.push(Diagnostic::global(
                super::net::wrong_candidate_severity(),
                format!(
                    "extract @{}: {} more wrong candidates dropped: {}",
                    g.name,
                    rest.len(),
                    rest.join(", ")
                ),
            ));
        }
        if !wrong.is_empty() {
            drop_candidates(output, &wrong, &g.name);
        }
        let per = if report.checked > 0 {
            report.seconds * 1e3 / report.checked as f64
        } else {
            0.0
        };
        let line = match &report.skipped {
            Some(why) => format!("// extract @{}: candidates not checked: {why}", g.name),
            None => format!(
                "// extract @{}: {} candidates checked against the source {} in {:.3} s ({per:.2} ms each), {} wrong and dropped",
                g.name,
                report.checked,
                // A function without sizes runs at its own shapes.
                if sizes.is_empty() {
                    "at its own shapes".to_string()
                } else {
                    format!("at {}", sizes.join(" "))
                },
                report.seconds,
                wrong.len()
            ),
        };
        NetOutcome {
            line,
            stats: serde_json::json!({
                "checked": report.checked,
                "wrong": wrong.len(),
                "sizes": sizes,
                "seconds": report.seconds,
                "ms_per_candidate": per,
                "skipped": report.skipped,
            }),
        }
    }
}

/// The search's counters for `--stats=json`: what it expanded and where complete programs went.
fn search_counters(
    report: &crate::egraph::extract::ExtractReport,
) -> serde_json::Map<String, serde_json::Value> {
    let counters = serde_json::json!({
        "expanded_states": report.expanded,
        "walked_states": report.walked,
        "complete_candidates": report.complete,
        "rejected_no_launch_order": report.rejected,
        "pruned_over_max_kernels": report.over_kernels,
        "pruned_pointwise_kernels": report.pointwise_kernels,
        "pruned_dead_components": report.dead_components,
        "pruned_store_read_in_kernel": report.store_read_in_kernel,
        "pruned_computing_twice": report.recomputed,
        "forced_picks": report.forced,
        "pruned_equivalent": report.equivalent,
        "pruned_over_bound": report.over_bound,
        "expanded_at_last_improvement": report.last_improvement,
        "pruned_too_large_value": report.too_large_value,
        "pruned_no_launch_order": report.no_launch_order,
        "rejected_not_lowerable": report.not_lowerable,
        "pruned_unlowerable_enodes": report.unlowerable_enodes,
        "distinct_candidates": report.distinct,
        "axis_renamings": report.renamed,
        "stop_reason": report.stop.to_string(),
    });
    match counters {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

/// How long the first wrong candidate's diagnosis may saturate its source again.
const DIAGNOSIS_BUDGET: Duration = Duration::from_secs(30);

/// Wrong candidates reported one diagnostic each; more are named in one line.
const WRONG_SHOWN: usize = 8;

/// Removes the candidates at `wrong` (sorted indices) from `output` and numbers the rest
/// `name.c0`, `name.c1`, … again, with their comments' count.
fn drop_candidates(output: &mut CandidateOutput, wrong: &[usize], name: &str) {
    let keep = |i: usize| wrong.binary_search(&i).is_err();
    let mut i = 0;
    output.functions.retain(|_| {
        i += 1;
        keep(i - 1)
    });
    let mut i = 0;
    output.listed.retain(|_| {
        i += 1;
        keep(i - 1)
    });
    let total = output.functions.len();
    for (i, (f, row)) in output
        .functions
        .iter_mut()
        .zip(output.listed.iter_mut())
        .enumerate()
    {
        f.name = format!("{name}.c{i}");
        if let Some(comment) = f.comment.as_mut() {
            let rest = comment
                .split_once(": ")
                .map_or(comment.as_str(), |(_, rest)| rest)
                .to_string();
            *comment = format!("candidate {i} of {total}: {rest}");
        }
        if let Some(fields) = row.as_object_mut() {
            fields.insert("name".into(), f.name.clone().into());
        }
    }
}

/// The functions of an extraction's candidates and their `--stats=json` rows.
pub struct CandidateOutput {
    /// `name.c0`, `name.c1`, …, each with its summary comment.
    pub functions: Vec<Function>,
    pub listed: Vec<serde_json::Value>,
}

/// Rebuilds `candidates` (of e-graph `name`) as functions, in order. Building them takes
/// memory of its own: at the end of a 20 s MHA decode run it added 44% to the search's
/// peak. So `stop_before` is asked, with the number built so far, before each `chunk` of them
/// after the first (the pass: `OUTPUT_CHUNK`; it checks the memory limit and shows progress),
/// and once it says so the rest are left out: the first candidates, which the search found
/// first, are kept. A chunk's functions are built in parallel and kept in order, so the
/// output does not depend on the threads.
pub fn candidate_functions(
    x: &ExtractGraph,
    name: &str,
    candidates: &[Candidate],
    chunk: usize,
    mut stop_before: impl FnMut(usize) -> bool,
) -> CandidateOutput {
    let size = chunk.max(1);
    // Room for every candidate from the start: a list that doubles as it fills holds its old
    // and new blocks at once while it copies. Room not yet written is not resident.
    let mut output = CandidateOutput {
        functions: Vec::with_capacity(candidates.len()),
        listed: Vec::with_capacity(candidates.len()),
    };
    for (n, part) in candidates.chunks(size).enumerate() {
        // The first chunk is output whatever the limit says: a search that ended at the limit
        // still gives its first candidates.
        if n > 0 && stop_before(output.functions.len()) {
            break;
        }
        let first = n * size;
        let built: Vec<(Function, serde_json::Value)> = part
            .par_iter()
            .enumerate()
            .map(|(j, c)| {
                let fname = format!("{name}.c{}", first + j);
                let mut f = reconstruct(x, &c.choice(), &fname);
                let summary = summarize(&mut f);
                // The comment starts with the count of candidates output, known only at the
                // end: room is kept for it, so that writing it allocates nothing once the
                // output may have stopped at the memory limit. (A new comment per function took
                // MHA decode's output 15 MiB past a 2 GiB limit after it had stopped.)
                let line = summary.line();
                let mut comment = String::with_capacity(COUNT_ROOM + line.len() + COST_ROOM);
                comment.push_str(&line);
                let _ = write!(comment, "; estimated cost: {}", c.cost);
                f.comment = Some(comment);
                let row = serde_json::json!({
                    "name": fname,
                    "kernels": summary.kernels,
                    "estimated_cost": c.cost,
                    "stored": summary.stored,
                    "parallel_axes": summary.axes,
                });
                (f, row)
            })
            .collect();
        for (f, row) in built {
            output.listed.push(row);
            output.functions.push(f);
        }
    }
    let total = output.functions.len();
    let mut count = String::with_capacity(COUNT_ROOM);
    for (i, f) in output.functions.iter_mut().enumerate() {
        count.clear();
        let _ = write!(count, "candidate {i} of {total}: ");
        if let Some(comment) = f.comment.as_mut() {
            comment.insert_str(0, &count);
        }
    }
    output
}

/// The longest `candidate I of N: ` and `; estimated cost: C` with 64-bit numbers.
const COUNT_ROOM: usize = "candidate  of : ".len() + 2 * 20;
const COST_ROOM: usize = "; estimated cost: ".len() + 20;

/// Candidates built between two looks at the resident size, in parallel. On the 2-core
/// development machine this took the building of RMSNorm–SwiGLU's 24,404 output functions
/// from 0.99–1.03 s to 0.65–0.67 s (the pass's wall time less the search's, three runs each
/// alternated, 2026-11-26).
pub const OUTPUT_CHUNK: usize = 32;

/// The `max-memory` an unset option means: `MEMORY_CAP_MIB`, or three quarters of the machine's
/// memory (`total_mib`, where the system reports it) when that is less, so that on a small
/// machine the search stops gracefully before the system runs out.
pub fn default_memory_limit(total_mib: Option<usize>) -> usize {
    total_mib.map_or(MEMORY_CAP_MIB, |total| {
        MEMORY_CAP_MIB.min(total / 4 * 3).max(1)
    })
}

/// The most an unset `max-memory` allows, on a machine of any size.
const MEMORY_CAP_MIB: usize = 8192;

/// The machine's memory in MiB (`MemTotal` of `/proc/meminfo`), where the system reports it.
fn machine_mib() -> Option<usize> {
    crate::egraph::extract::proc_mib("/proc/meminfo", "MemTotal:")
}

/// `d` rounded down to a tenth of a second: a search's share of a limit, as its remarks show
/// it.
fn floor_tenths(d: Duration) -> Duration {
    Duration::from_secs_f64((d.as_secs_f64() * 10.0).floor() / 10.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_memory_limit_follows_a_small_machine_and_is_capped_on_a_large_one() {
        assert_eq!(default_memory_limit(None), 8192);
        assert_eq!(default_memory_limit(Some(24 * 1024)), 8192);
        assert_eq!(default_memory_limit(Some(4096)), 3072);
        assert_eq!(default_memory_limit(Some(0)), 1);
    }

    /// The output stopped at the memory limit: the summary line, the remark and the
    /// `--stats=json` row give the number output, not the number found. (The real resident
    /// size cannot stop it at a chosen place; this reader is over any limit at every look.)
    #[test]
    fn an_output_stopped_at_the_memory_limit_is_counted_as_output() {
        let text = include_str!("../../examples/gated_mlp.ef");
        let mut sources = crate::diag::SourceMap::default();
        let source = sources.add("gated_mlp.ef", text);
        let module = crate::parse::parse_module(text, source).expect("parses");
        // `saturate` from the registry, then this pass with its options set in code and a
        // reader over any limit.
        let mut pm = crate::passes::PassManager::parse("saturate", &mut sources).expect("parses");
        pm.add(
            ExtractPass::with_options(
                ExtractOptions {
                    max_candidates: usize::MAX,
                    max_memory: MaxMemory::MiB(4096),
                    ..ExtractOptions::default()
                },
                OptionSpans::default(),
            )
            .with_resident_reader(|| Some(usize::MAX)),
        );
        let result = pm.run(module, &mut sources);
        assert_eq!(result.failure, None, "{:?}", result.diagnostics);
        let module = result.module().expect("a module");
        let counters = result.counters(1).expect("extract ran");
        // The search does not read this reader: it finds every candidate.
        let row = &counters["egraphs"][0];
        let found = row["distinct_candidates"].as_u64().expect("a count") as usize;
        assert!(found > OUTPUT_CHUNK, "{found} candidates");
        // The first chunk is output whatever the limit says; the limit stops the rest.
        assert_eq!(module.funcs.len(), OUTPUT_CHUNK);
        assert_eq!(row["output"], OUTPUT_CHUNK);
        assert_eq!(
            row["candidates"].as_array().map(Vec::len),
            Some(OUTPUT_CHUNK)
        );
        assert_eq!(row["output_stop"], "memory limit (4096 MiB) reached");
        let summary = result
            .report
            .iter()
            .find(|l| l.contains(" distinct, "))
            .expect("a summary line");
        assert!(
            summary.contains(&format!(", {found} distinct, {OUTPUT_CHUNK} output,")),
            "{summary}"
        );
        let remark = format!(
            "extract @gated_mlp: output stopped at the memory limit (4096 MiB): the first {OUTPUT_CHUNK} of {found} candidates are output"
        );
        assert!(
            result.diagnostics.iter().any(|d| d.message == remark),
            "{:?}",
            result
                .diagnostics
                .iter()
                .map(|d| &d.message)
                .collect::<Vec<_>>()
        );
        let comment = module.funcs[0].comment.as_deref().unwrap_or_default();
        assert!(
            comment.starts_with(&format!("candidate 0 of {OUTPUT_CHUNK}: ")),
            "{comment}"
        );
    }

    #[test]
    fn this_machine_reports_its_memory_where_it_is_linux() {
        if cfg!(target_os = "linux") {
            assert!(machine_mib().is_some_and(|m| m > 0));
        }
    }

    #[test]
    fn subgraphs_share_their_time() {
        let secs = |d: Duration| d.as_secs_f64();
        // Default: part-time-limit each, and what one leaves goes to those after it.
        let mut b = PartsBudget::new(PartsPool::PerPart, Seconds(5.0), 3);
        assert_eq!(secs(b.next_share()), 5.0);
        b.spent(Duration::from_millis(200));
        assert_eq!(secs(b.next_share()), 7.4);
        // One that ran past its share (a fallback, the output) takes from the last, down to
        // the even share.
        b.spent(Duration::from_secs(10));
        assert_eq!(secs(b.next_share()), 5.0);
        // A chosen time-limit is all the subgraphs get, whatever part-time-limit says.
        let mut b = PartsBudget::new(PartsPool::Total(Seconds(3.0)), Seconds(5.0), 4);
        assert_eq!(secs(b.next_share()), 0.75);
        b.spent(Duration::from_millis(750));
        assert_eq!(secs(b.next_share()), 0.75);
        b.spent(Duration::from_millis(100));
        assert_eq!(secs(b.next_share()), 1.0);
        b.spent(Duration::from_secs(9));
        assert_eq!(secs(b.next_share()), 0.75);
        // No limit stays no limit, with no overflow.
        let mut b = PartsBudget::new(PartsPool::PerPart, Seconds(f64::INFINITY), 2);
        assert!(b.next_share() > Duration::from_secs(1 << 40));
    }

    #[test]
    fn a_chosen_time_limit_is_shared_by_the_subgraphs() {
        let pass = |opts: &str| {
            let mut spans = BTreeMap::new();
            for o in opts.split_whitespace() {
                spans.insert(o.to_string(), crate::diag::Span::default());
            }
            ExtractPass::with_options(ExtractOptions::default(), OptionSpans::from_map(spans))
        };
        assert_eq!(pass("").parts_pool, PartsPool::PerPart);
        assert_eq!(
            pass("time-limit").parts_pool,
            PartsPool::Total(Seconds(60.0))
        );
        assert_eq!(
            pass("time-limit part-time-limit").parts_pool,
            PartsPool::PerPart
        );
    }
}
