//! `tune`: measures the ranked candidates of each source function on a GPU and tunes their
//! schedules ([`crate::tune`]): successive halving over (candidate, schedule) pairs within
//! a budget, every configuration validated against the reference interpreter before it is
//! timed. The output keeps the measured candidates, fastest first, each with its tuned
//! schedule (`schedule(…)`, per-kernel warps and stages as `k<i>_num_warps`) and a comment
//! with its measured latency; candidates found wrong are dropped with a warning, and those
//! the budget left unmeasured follow in rank order. `device=simulated` runs the same search
//! on the rank model with seeded noise (no GPU; its figures are no measurements).

use super::lower::planned;
use super::options::{choice, pass_options, OptionKind, OptionSpans, Seconds};
use super::rank::{source_of, DeviceChoice};
use super::{NamedPass, Pass, PassContext};
use crate::diag::{Diagnostic, Severity};
use crate::ir::{Function, Module, ScheduleEntry};
use crate::lower::KernelPlan;
use crate::rank::device::device;
use crate::rank::model::FunctionModel;
use crate::tune::cuda::{CandidateSpec, CudaDevice, Workload};
use crate::tune::launch::Helper;
use crate::tune::simulated::Simulated;
use crate::tune::space::Space;
use crate::tune::{tune, Config, Measure, TuneLog, TuneSettings};
use std::collections::BTreeMap;
use std::time::Instant;

choice! {
    /// `tune{device=…}`.
    pub enum TuneDevice {
        /// The GPU `gpu=N`, through the CUDA driver.
        Cuda = "cuda",
        /// The rank model with seeded noise and mis-ranked candidates: the search without a
        /// GPU.
        Simulated = "simulated",
    }
}

choice! {
    /// `tune{target=…}`.
    pub enum TuneTarget {
        /// The GPU's own compute capability.
        Auto = "auto",
        Sm80 = "sm_80",
        Sm90 = "sm_90",
        Sm100 = "sm_100",
        Sm120 = "sm_120",
    }
}

#[derive(Clone, Debug)]
pub struct TuneOptions {
    pub budget: Seconds,
    pub rounds: usize,
    pub eta: usize,
    pub seed: usize,
    pub device: TuneDevice,
    pub gpu: usize,
    /// The rank model's device: the schedule domain and its legality, and the simulation.
    pub model: DeviceChoice,
    pub target: TuneTarget,
    pub python: Option<String>,
    /// The time limit of one compilation (a configuration that compiles longer fails).
    pub compile_limit: Seconds,
    /// With `device=simulated`: the candidate (1-based, in rank order; 0: none) whose
    /// outputs the simulation makes wrong.
    pub simulate_wrong: usize,
}

impl Default for TuneOptions {
    fn default() -> TuneOptions {
        TuneOptions {
            budget: Seconds(60.0),
            rounds: 4,
            eta: 3,
            seed: 0,
            device: TuneDevice::Cuda,
            gpu: 0,
            model: DeviceChoice::H100,
            target: TuneTarget::Auto,
            python: None,
            compile_limit: Seconds(crate::tune::launch::COMPILE_TIME_LIMIT.as_secs_f64()),
            simulate_wrong: 0,
        }
    }
}

pass_options!(TuneOptions {
    "budget" => budget: OptionKind::Float,
        "seconds of measurement per source function, compilation included";
    "rounds" => rounds: OptionKind::Count, "rounds of successive halving at most";
    "eta" => eta: OptionKind::Count,
        "each round keeps the best 1/eta and gives them eta times the repeats (at least 2)";
    "seed" => seed: OptionKind::Int, "seed of the random schedules (and of the simulation)";
    "device" => device: OptionKind::Choice(TuneDevice::WORDS),
        "`cuda` measures on the GPU; `simulated` runs the search on the rank model with seeded noise (no GPU, no measurement)";
    "gpu" => gpu: OptionKind::Int, "the CUDA device ordinal";
    "model" => model: OptionKind::Choice(DeviceChoice::WORDS),
        "the rank model's GPU: the schedules tried, their legality, and the simulation";
    "target" => target: OptionKind::Choice(TuneTarget::WORDS),
        "the compile target (`auto`: the GPU's compute capability)";
    "python" => python: OptionKind::Path,
        "Python with Triton for python/efopt_cuda.py (default: $EFOPT_PYTHON, else the checkout's .venv/bin/python)";
    "compile-limit" => compile_limit: OptionKind::Float,
        "seconds one configuration may take to compile before it is stopped and counted as failed";
    "simulate-wrong" => simulate_wrong: OptionKind::Int,
        "with device=simulated: the candidate (1-based, rank order) whose outputs the simulation makes wrong (0: none)";
});

pub struct TunePass {
    opts: TuneOptions,
}

impl NamedPass for TunePass {
    const NAME: &'static str = "tune";
    type Options = TuneOptions;

    fn summary() -> String {
        "Measure the ranked candidates on a GPU (validated against the reference interpreter) and tune their schedules by successive halving".into()
    }

    fn with_options(options: TuneOptions, _: OptionSpans) -> TunePass {
        TunePass { opts: options }
    }
}

/// The schedule of a configuration: the function's blocks, warps and stages, and each kernel's
/// own warps and stages where they differ.
fn tuned_schedule(model: &FunctionModel, c: &Config) -> crate::lower::plan::Schedule {
    let mut s = model.schedule(&c.point);
    for (k, ws) in c.kernels.iter().enumerate() {
        if *ws != (c.point.num_warps, c.point.num_stages) {
            s.kernels.insert(k, *ws);
        }
    }
    s
}

fn schedule_text(model: &FunctionModel, c: &Config) -> String {
    tuned_schedule(model, c)
        .entries()
        .into_iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Pass for TunePass {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        let err = |m: String| vec![Diagnostic::global(Severity::Error, m)];
        let dev = device(self.opts.model.word()).map_err(|m| err(format!("tune: {m}")))?;
        if self.opts.device == TuneDevice::Cuda && !crate::tune::cuda::driver_present() {
            return Err(vec![Diagnostic::global(
                Severity::Error,
                "tune: no CUDA driver (libcuda) on this machine: measuring needs a GPU",
            )
            .with_help("run on a machine with an NVIDIA GPU and driver, or `tune{device=simulated}` to run the search on the rank model")]);
        }
        let info = crate::verify::verify_module(module)?;
        let m: &Module = module;
        let (plans, _) = planned(&info, m.funcs.iter().collect(), cx);
        // Per source function, in module (rank) order.
        let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, p) in plans.iter().enumerate() {
            groups
                .entry(source_of(&p.function.name).to_string())
                .or_default()
                .push(i);
        }
        if groups.is_empty() {
            return Err(err("tune: no candidate lowers: nothing to measure".into()));
        }
        let settings = TuneSettings {
            budget: self.opts.budget.0,
            rounds: self.opts.rounds as u32,
            eta: self.opts.eta.max(2) as u32,
            seed: self.opts.seed as u64,
            ..TuneSettings::default()
        };
        let start = Instant::now();
        let mut results: BTreeMap<String, (Vec<usize>, TuneLog, String, Vec<String>)> =
            BTreeMap::new();
        let mut json_groups = Vec::new();
        let mut entries_by_plan: BTreeMap<usize, Vec<(String, u64)>> = BTreeMap::new();
        for (src, members) in &groups {
            let group: Vec<&KernelPlan> = members.iter().map(|i| &plans[*i]).collect();
            let models: Vec<FunctionModel> =
                group.iter().map(|p| FunctionModel::new(p, dev)).collect();
            let spaces: Vec<Space> = models.iter().map(|m| Space::new(m, dev)).collect();
            let mut starts = Vec::new();
            let mut estimates = Vec::new();
            for (p, m) in group.iter().zip(&models) {
                // The ranked schedule where `rank` gave one and it is in the domain.
                let e = crate::rank::estimate_model(m, dev, crate::rank::Solver::Lp);
                estimates.push(e.as_ref().map_or(f64::INFINITY, |e| e.cost.us));
                let own = own_point(p, m);
                starts.push(own.or(e.map(|e| e.point)).unwrap_or_else(|| {
                    crate::rank::model::Point {
                        log_blocks: m.lo.clone(),
                        num_warps: 4,
                        num_stages: 3,
                    }
                }));
            }
            let names: Vec<String> = group.iter().map(|p| p.function.name.clone()).collect();
            let (log, described) = match self.opts.device {
                TuneDevice::Simulated => {
                    let mut sim = Simulated::new(&spaces, settings.seed);
                    if (1..=spaces.len()).contains(&self.opts.simulate_wrong) {
                        sim.wrong.insert(self.opts.simulate_wrong - 1);
                    }
                    let log = tune(&spaces, &starts, &estimates, &mut sim, &settings);
                    (log, sim.describe())
                }
                TuneDevice::Cuda => {
                    let mut gpu = self.cuda(src, m, &group, &models, cx)?;
                    let log = tune(&spaces, &starts, &estimates, &mut gpu, &settings);
                    (log, gpu.describe())
                }
            };
            json_groups.push(serde_json::json!({
                "function": src,
                "device": described,
                "candidates": names,
                "estimates_us": estimates.iter().map(|e| if e.is_finite() { serde_json::json!(e) } else { serde_json::Value::Null }).collect::<Vec<_>>(),
                "rounds": log.rounds,
                "stop": log.stop,
                "wrong": log.wrong.iter().map(|(c, r)| serde_json::json!({"candidate": names[*c], "reason": r})).collect::<Vec<_>>(),
                "chosen": log.chosen().map(|(c, us)| serde_json::json!({"candidate": names[c.candidate], "us": us, "schedule": schedule_text(&models[c.candidate], c)})),
                "log": log.rows,
            }));
            // Per-kernel schedules as IR entries, by candidate.
            let mut entries: Vec<Vec<(String, u64)>> = vec![Vec::new(); group.len()];
            for (i, b) in &log.best {
                entries[*i] = tuned_schedule(&models[*i], &b.0).entries();
            }
            cx.report.push(match log.chosen() {
                Some((c, us)) => format!(
                    "// tune @{src}: {} candidate(s) on {described}, {} measurement(s) in {} round(s), {}: fastest `{}` at {us:.2} us ({}), {} wrong",
                    group.len(),
                    log.rows.len(),
                    log.rounds,
                    log.stop,
                    names[c.candidate],
                    schedule_text(&models[c.candidate], c),
                    log.wrong.len()
                ),
                None => format!(
                    "// tune @{src}: {} candidate(s) on {described}: none measured ({})",
                    group.len(),
                    log.stop
                ),
            });
            results.insert(src.clone(), (members.clone(), log, described, names));
            for (slot, e) in members.iter().zip(entries) {
                entries_by_plan.insert(*slot, e);
            }
        }
        let plan_names: Vec<String> = plans.iter().map(|p| p.function.name.clone()).collect();
        drop(plans);
        // Rewrite the module: per source, measured fastest first, then unmeasured in rank
        // order; wrong candidates dropped.
        let mut by_name: BTreeMap<String, Function> = module
            .funcs
            .drain(..)
            .map(|f| (f.name.clone(), f))
            .collect();
        let mut out = Vec::new();
        let simulated = self.opts.device == TuneDevice::Simulated;
        for (src, (members, log, described, names)) in &results {
            for (c, reason) in &log.wrong {
                cx.diagnostics.push(Diagnostic::global(
                    Severity::Warning,
                    format!("tune @{src}: `{}` dropped: {reason}", names[*c]),
                ));
                by_name.remove(&plan_names[members[*c]]);
            }
            let mut order = log.order();
            for i in 0..members.len() {
                if !order.contains(&i) && !log.wrong.contains_key(&i) {
                    order.push(i);
                }
            }
            for (rank, i) in order.into_iter().enumerate() {
                let Some(mut f) = by_name.remove(&plan_names[members[i]]) else {
                    continue;
                };
                let span = f.name_span;
                let line = match log.best.get(&i) {
                    Some((_, us, reps)) => {
                        if let Some(e) = entries_by_plan.remove(&members[i]) {
                            f.schedule = Some(
                                e.into_iter()
                                    .map(|(name, value)| ScheduleEntry { name, value, span })
                                    .collect(),
                            );
                        }
                        format!(
                            "tune: {} of {}: {us:.2} us {} (median of {reps}) on {described}",
                            rank + 1,
                            members.len(),
                            if simulated { "simulated" } else { "measured" }
                        )
                    }
                    None => "tune: not measured within the budget (rank order)".to_string(),
                };
                f.comment = Some(match f.comment.take() {
                    Some(old) => format!("{line}\n{old}"),
                    None => line,
                });
                out.push(f);
            }
        }
        // Functions that did not lower stay, after the tuned ones.
        out.extend(by_name.into_values());
        module.funcs = out;
        cx.counters.insert("groups".into(), json_groups.into());
        cx.counters.insert(
            "tune_seconds".into(),
            serde_json::json!(start.elapsed().as_secs_f64()),
        );
        Ok(())
    }
}

/// The point of the function's own `schedule(…)` (what `rank` chose), if it is one of the
/// model's domain.
fn own_point(p: &KernelPlan, m: &FunctionModel) -> Option<crate::rank::model::Point> {
    let s = crate::lower::plan::Schedule::of(p);
    p.function.schedule.as_ref()?;
    let log_blocks = m
        .axes
        .iter()
        .map(|a| s.block.get(a).map(|b| b.max(&1).ilog2()))
        .collect::<Option<Vec<u32>>>()?;
    Some(crate::rank::model::Point {
        log_blocks,
        num_warps: s.num_warps,
        num_stages: s.num_stages,
    })
}

impl TunePass {
    /// The GPU for one source function: its candidates emitted as one Triton module, its
    /// workload from the reference interpreter at the function's sizes.
    fn cuda(
        &self,
        src: &str,
        module: &Module,
        group: &[&KernelPlan],
        models: &[FunctionModel],
        cx: &PassContext,
    ) -> Result<CudaDevice, Vec<Diagnostic>> {
        let fail = |m: String| {
            vec![Diagnostic::global(
                Severity::Error,
                format!("tune @{src}: {m}"),
            )]
        };
        let owned: Vec<KernelPlan> = group.iter().map(|p| (*p).clone()).collect();
        let (source, hosts) = crate::backend::triton::emit_module(
            &owned,
            crate::backend::triton::TritonOptions {
                interpret: false,
                dot_bf16: false,
            },
        )
        .map_err(|(_, m, name)| fail(format!("`{name}` cannot be written: {m}")))?;
        let dir = std::env::temp_dir().join(format!("efopt-tune-{}-{}", std::process::id(), src));
        std::fs::create_dir_all(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        let module_path = dir.join("cands.py");
        std::fs::write(&module_path, source).map_err(|e| fail(e.to_string()))?;
        // The workload: seeded inputs, and the reference outputs at the function's own sizes:
        // of the source function where the pipeline started from it (tensor-level, the
        // fastest to interpret), else of the first candidate (all compute the same).
        let (f, reference_module) = match cx.original.funcs.iter().find(|g| g.name == src) {
            Some(g) => (g, cx.original),
            None => (group[0].function, module),
        };
        let sizes = crate::interp::Sizes::for_function(f, 4);
        let inputs = crate::interp::random_inputs(f, &sizes, cx.seed, 1.0)
            .map_err(|e| vec![e.into_diagnostic()])?;
        let outputs = crate::interp::Interpreter::new(reference_module, sizes)
            .run(f, &inputs)
            .map_err(|e| vec![e.into_diagnostic()])?;
        let mut ins = Vec::new();
        for (v, p) in inputs.iter().zip(&f.body.params) {
            let (Some(t), Some(crate::ir::Type::Tensor(ty))) = (v.dense(), f.body.ty(*p)) else {
                return Err(fail("an input that is no tensor".into()));
            };
            ins.push((
                t.clone(),
                crate::backend::triton::dtype_host(ty.dtype).to_string(),
            ));
        }
        let mut expected = Vec::new();
        for v in &outputs {
            expected.push(
                v.dense()
                    .cloned()
                    .ok_or_else(|| fail("a tuple-valued result cannot be compared".into()))?,
            );
        }
        let candidates = hosts
            .iter()
            .zip(models)
            .map(|(h, m)| CandidateSpec {
                module: module_path.clone(),
                host: h.clone(),
                axes: m.axes.clone(),
                workload: 0,
            })
            .collect();
        let target = match self.opts.target {
            TuneTarget::Auto => crate::tune::cuda::compute_target(self.opts.gpu).map_err(&fail)?,
            t => t.word().to_string(),
        };
        CudaDevice::open(
            self.opts.gpu,
            Helper {
                time_limit: std::time::Duration::from_secs_f64(
                    self.opts.compile_limit.0.max(0.001),
                ),
                ..Helper::new(self.opts.python.clone(), &target)
            },
            dir,
            candidates,
            vec![Workload {
                inputs: ins,
                expected,
            }],
        )
        .map_err(fail)
    }
}
