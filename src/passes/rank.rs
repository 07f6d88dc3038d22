//! `rank`: orders each function's candidates by the optimistic latency T̂ of the cost model
//! ([`crate::rank`]) on one GPU, keeps the best `top`, and gives each its schedule
//! (`schedule(…)`, which `lower` emits by default) and a comment that says why it ranks where
//! it does. The output is IR that parses and verifies again.

use super::lower::planned;
use super::options::{choice, pass_options, OptionKind, OptionSpans};
use super::{NamedPass, Pass, PassContext};
use crate::diag::{Diagnostic, Severity};
use crate::ir::{Function, Module, ScheduleEntry};
use crate::rank::device::{device, Device};
use crate::rank::{estimate, Estimate, Solver};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::time::Instant;

choice! {
    /// `rank{device=…}`: one entry of `data/devices.json` each.
    pub enum DeviceChoice {
        H100 = "h100",
        H200 = "h200",
        A100 = "a100",
        Rtx5090 = "rtx5090",
    }
}

choice! {
    /// `rank{solver=…}`.
    pub enum SolverChoice {
        /// The LP relaxation, rounded, then a local search under the exact model.
        Lp = "lp",
        /// Every legal point of the schedule domain.
        Exhaustive = "exhaustive",
    }
}

#[derive(Clone, Debug)]
pub struct RankOptions {
    pub device: DeviceChoice,
    /// Candidates kept per source function (0: all).
    pub top: usize,
    pub solver: SolverChoice,
}

impl Default for RankOptions {
    fn default() -> RankOptions {
        RankOptions {
            device: DeviceChoice::H100,
            top: 10,
            solver: SolverChoice::Lp,
        }
    }
}

pass_options!(RankOptions {
    "device" => device: OptionKind::Choice(DeviceChoice::WORDS),
        "the GPU whose model ranks (data/devices.json)";
    "top" => top: OptionKind::Int, "candidates kept per source function, best first (0: all)";
    "solver" => solver: OptionKind::Choice(SolverChoice::WORDS),
        "`lp` solves the LP relaxation over block sizes and rounds it (then improves it locally); `exhaustive` scores every legal schedule";
});

pub struct RankPass {
    opts: RankOptions,
}

impl NamedPass for RankPass {
    const NAME: &'static str = "rank";
    type Options = RankOptions;

    fn summary() -> String {
        "Order candidates by predicted latency on a GPU model (roofline over the best schedule), keep the best, and give each its schedule".into()
    }

    fn with_options(options: RankOptions, _: OptionSpans) -> RankPass {
        RankPass { opts: options }
    }
}

/// The source function a candidate was extracted from: `f` for `f.c12`, else itself.
pub(crate) fn source_of(name: &str) -> &str {
    match name.rsplit_once(".c") {
        Some((src, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => src,
        _ => name,
    }
}

fn count(n: f64) -> String {
    let n = n.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.3e}")
    }
}

const UNIT_NAMES: [&str; 4] = ["tensor-bf16", "tensor-tf32", "cuda", "sfu"];

/// The comment lines above a ranked candidate.
fn explain(e: &Estimate, rank: usize, of: usize, dev: &Device) -> String {
    let c = &e.cost;
    let flops = c.flops();
    let bound = e
        .lp_bound_us
        .map_or(String::new(), |b| format!(" (LP bound {b:.2} us)"));
    let mut lines = vec![format!(
        "rank {rank} of {of} on {}: {:.2} us predicted{bound}, bound by {}",
        dev.name,
        c.us,
        c.bottleneck().name()
    )];
    let work: Vec<String> = UNIT_NAMES
        .iter()
        .zip(flops)
        .filter(|(_, f)| *f > 0.0)
        .map(|(n, f)| format!("{n} {}", sci(f)))
        .collect();
    lines.push(format!(
        "  {} DRAM bytes; flops: {}",
        count(c.dram_bytes()),
        if work.is_empty() {
            "none".into()
        } else {
            work.join(", ")
        }
    ));
    for (i, k) in c.kernels.iter().enumerate() {
        lines.push(format!(
            "  kernel {i}: {} programs, {} wave(s) of {} per SM, {} DRAM bytes, {:.2} us, bound by {}",
            count(k.programs),
            count(k.waves),
            k.occupancy,
            count(k.dram_bytes),
            k.us,
            k.bottleneck.name()
        ));
    }
    let sched: Vec<String> = e
        .schedule
        .entries()
        .iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect();
    lines.push(format!("  schedule: {}", sched.join(" ")));
    lines.join("\n")
}

fn json(e: &Estimate, name: &str) -> serde_json::Value {
    let flops = e.cost.flops();
    let mut by_unit = serde_json::Map::new();
    for (n, f) in UNIT_NAMES.iter().zip(flops) {
        by_unit.insert(n.to_string(), serde_json::json!(f.round() as u64));
    }
    by_unit.insert(
        "total".into(),
        serde_json::json!(flops.iter().sum::<f64>().round() as u64),
    );
    let schedule: BTreeMap<String, u64> = e
        .schedule
        .block
        .iter()
        .map(|(a, b)| (format!("BLOCK_{a}"), *b))
        .chain([
            ("num_warps".to_string(), e.schedule.num_warps),
            ("num_stages".to_string(), e.schedule.num_stages),
        ])
        .collect();
    serde_json::json!({
        "name": name,
        "predicted_us": e.cost.us,
        "lp_bound_us": e.lp_bound_us,
        "dram_bytes": e.cost.dram_bytes().round() as u64,
        "flops": by_unit,
        "bottleneck": e.cost.bottleneck().name(),
        "kernels": e.cost.kernels.len(),
        "programs": e.cost.kernels.iter().map(|k| k.programs.round() as u64).collect::<Vec<_>>(),
        "waves": e.cost.kernels.iter().map(|k| k.waves.round() as u64).collect::<Vec<_>>(),
        "schedule": schedule,
    })
}

impl Pass for RankPass {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        let dev = device(self.opts.device.word())
            .map_err(|m| vec![Diagnostic::global(Severity::Error, format!("rank: {m}"))])?;
        if module.funcs.is_empty() {
            return Err(vec![Diagnostic::global(
                Severity::Error,
                "rank: the module has no functions to rank",
            )
            .with_help(
                "rank orders candidate functions: run `extract` after `saturate` first",
            )]);
        }
        let solver = match self.opts.solver {
            SolverChoice::Lp => Solver::Lp,
            SolverChoice::Exhaustive => Solver::Exhaustive,
        };
        let start = Instant::now();
        let info = crate::verify::verify_module(module)?;
        let m: &Module = module;
        let (plans, unlowerable) = planned(&info, m.funcs.iter().collect(), cx);
        let estimates: Vec<(String, Option<Estimate>)> = plans
            .par_iter()
            .map(|p| (p.function.name.clone(), estimate(p, dev, solver)))
            .collect();
        // For a source none of whose candidates has a legal schedule: why its first does not.
        let mut reasons: BTreeMap<String, String> = BTreeMap::new();
        for (p, (name, e)) in plans.iter().zip(&estimates) {
            let src = source_of(name).to_string();
            if e.is_none() && !reasons.contains_key(&src) {
                let m = crate::rank::model::FunctionModel::new(p, dev);
                if let Some(r) = m.illegal_reason(dev) {
                    reasons.insert(src, format!("`{name}`: {r}"));
                }
            }
        }
        drop(plans);
        let elapsed = start.elapsed().as_secs_f64();
        // Per source function, best first (ties by name).
        let mut groups: BTreeMap<String, Vec<(String, Estimate)>> = BTreeMap::new();
        let mut illegal: BTreeMap<String, usize> = BTreeMap::new();
        for (name, e) in estimates {
            let src = source_of(&name).to_string();
            match e {
                Some(e) => groups.entry(src).or_default().push((name, e)),
                None => *illegal.entry(src).or_default() += 1,
            }
        }
        let mut kept: Vec<(String, usize, usize, Estimate)> = Vec::new();
        let mut rows = Vec::new();
        for (src, mut list) in groups {
            // Times equal but for rounding tie; then less work, fewer kernels, the name.
            list.sort_by(|a, b| {
                let (x, y) = (a.1.cost.us, b.1.cost.us);
                let time = if (x - y).abs() <= 1e-9 * x.abs().max(y.abs()) {
                    std::cmp::Ordering::Equal
                } else {
                    x.total_cmp(&y)
                };
                let work = |e: &Estimate| e.cost.flops().iter().sum::<f64>();
                time.then(work(&a.1).total_cmp(&work(&b.1)))
                    .then(a.1.cost.kernels.len().cmp(&b.1.cost.kernels.len()))
                    .then(a.0.cmp(&b.0))
            });
            let of = list.len();
            let top = if self.opts.top == 0 {
                of
            } else {
                self.opts.top.min(of)
            };
            cx.report.push(format!(
                "// rank @{src}: {of} candidate(s) ranked on {} ({}, {}) in {elapsed:.3} s, {top} kept; best {:.2} us{}",
                dev.name,
                dev.full_name,
                self.opts.solver.word(),
                list[0].1.cost.us,
                match illegal.remove(&src) {
                    Some(n) => format!("; {n} without a legal schedule dropped"),
                    None => String::new(),
                }
            ));
            for (i, (name, e)) in list.into_iter().take(top).enumerate() {
                rows.push(json(&e, &name));
                kept.push((name, i + 1, of, e));
            }
        }
        for (src, n) in illegal {
            let mut d = Diagnostic::global(
                Severity::Warning,
                format!("rank @{src}: none of its {n} lowerable candidate(s) has a legal schedule on {}", dev.name),
            );
            if let Some(r) = reasons.get(&src) {
                d = d.with_note(None, r.clone());
            }
            cx.diagnostics.push(d);
        }
        if unlowerable > 0 {
            cx.report.push(format!(
                "// rank: {unlowerable} function(s) that cannot be lowered dropped"
            ));
        }
        if kept.is_empty() {
            return Err(vec![Diagnostic::global(
                Severity::Error,
                "rank: no candidate can be ranked (none lowers with a legal schedule)",
            )
            .with_help(
                "see the warnings above; extract{max-kernels=…} or larger limits may find others",
            )]);
        }
        let mut by_name: BTreeMap<String, Function> = module
            .funcs
            .drain(..)
            .map(|f| (f.name.clone(), f))
            .collect();
        for (name, rank, of, e) in kept {
            let Some(mut f) = by_name.remove(&name) else {
                continue;
            };
            let why = explain(&e, rank, of, dev);
            f.comment = Some(match f.comment.take() {
                Some(old) => format!("{why}\n{old}"),
                None => why,
            });
            let span = f.name_span;
            f.schedule = Some(
                e.schedule
                    .entries()
                    .into_iter()
                    .map(|(name, value)| ScheduleEntry { name, value, span })
                    .collect(),
            );
            module.funcs.push(f);
        }
        cx.counters.insert("candidates".into(), rows.into());
        cx.counters.insert("device".into(), dev.name.clone().into());
        cx.counters
            .insert("rank_seconds".into(), serde_json::json!(elapsed));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_choices_are_the_device_file() {
        let names: Vec<&str> = crate::rank::device::devices()
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(DeviceChoice::WORDS, names.as_slice());
    }

    #[test]
    fn candidates_group_by_source() {
        assert_eq!(source_of("f.c12"), "f");
        assert_eq!(source_of("a.b.c3"), "a.b");
        assert_eq!(source_of("f"), "f");
        assert_eq!(source_of("f.cx"), "f.cx");
        assert_eq!(count(1234567.0), "1,234,567");
    }
}
