//! Successive halving over (candidate, schedule) pairs, then kernel-by-kernel warps and
//! stages.
//!
//! Round 0 measures every candidate at its ranked schedule (the few the model ranks best also
//! at some neighbours and one random legal sample), with a few repeats; the device may
//! compile a round's configurations together first ([`Measure::prepare`]). Each round then keeps the best `1/eta` of what it
//! measured — plus up to `reserve` places for the candidates the model ranks best that did not
//! make it, so a noisy first measurement does not lose them — adds each kept schedule's
//! unmeasured neighbours and one random mutation, and measures all of them with `eta` times
//! the repeats. It stops after `rounds` rounds, when one configuration is left, or when the
//! budget is spent (once some configuration has a time). For a candidate of several
//! kernels, each kernel's warps and stages are then tuned alone, one kernel at a time (block
//! sizes stay: they shape the buffers the kernels share), each step measured — so validated
//! — as a whole program.
//!
//! Everything is deterministic for a seed but the timings themselves.

use super::space::Space;
use super::{Config, Measure, Outcome};
use crate::interp::Rng;
use crate::rank::model::{Point, NUM_STAGES, NUM_WARPS};
use std::collections::{BTreeMap, BTreeSet};

/// The share of the budget successive halving leaves for tuning kernels one at a time, when
/// some candidate has several.
pub const PER_KERNEL_SHARE: f64 = 0.15;

#[derive(Clone, Debug)]
pub struct TuneSettings {
    /// Seconds of measurement (compilation included) before the search stops.
    pub budget: f64,
    pub rounds: u32,
    /// The fraction kept each round is 1/eta; repeats grow by eta.
    pub eta: u32,
    pub seed: u64,
    /// Places kept each round for the candidates with the lowest T̂.
    pub reserve: usize,
    /// Repeats of the first round.
    pub repeats: u32,
    /// Neighbours of a ranked schedule measured in round 0, and added per kept schedule.
    pub neighbours: usize,
    /// Candidates (best T̂ first) whose neighbours and a random sample round 0 measures too.
    pub explore: usize,
}

impl Default for TuneSettings {
    fn default() -> TuneSettings {
        TuneSettings {
            budget: 60.0,
            rounds: 4,
            eta: 3,
            seed: 0,
            reserve: 2,
            repeats: 3,
            neighbours: 2,
            explore: 3,
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LogRow {
    pub round: u32,
    pub candidate: usize,
    pub log_blocks: Vec<u32>,
    pub num_warps: u64,
    pub num_stages: u64,
    /// Per-kernel (warps, stages), when set.
    pub kernels: Vec<(u64, u64)>,
    pub repeats: u32,
    /// "time", "wrong" or "failed".
    pub outcome: &'static str,
    pub us: Option<f64>,
    pub reason: Option<String>,
    /// Budget spent after it.
    pub spent: f64,
}

#[derive(Clone, Debug, Default)]
pub struct TuneLog {
    pub rows: Vec<LogRow>,
    /// Each candidate's best configuration, at the most repeats it was measured with.
    pub best: BTreeMap<usize, (Config, f64, u32)>,
    /// Candidates whose outputs differed from the reference, with the reason.
    pub wrong: BTreeMap<usize, String>,
    pub rounds: u32,
    /// Why the search stopped.
    pub stop: String,
}

impl TuneLog {
    /// The chosen configuration: the fastest at the most repeats measured.
    pub fn chosen(&self) -> Option<(&Config, f64)> {
        let top = self.best.values().map(|b| b.2).max()?;
        self.best
            .values()
            .filter(|b| b.2 == top)
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
            .map(|b| (&b.0, b.1))
    }

    /// Candidates by their best measurement (most repeats first, then time), unmeasured ones
    /// left out.
    pub fn order(&self) -> Vec<usize> {
        let mut v: Vec<(&usize, &(Config, f64, u32))> = self.best.iter().collect();
        v.sort_by(|a, b| {
            b.1 .2
                .cmp(&a.1 .2)
                .then(a.1 .1.total_cmp(&b.1 .1))
                .then(a.0.cmp(b.0))
        });
        v.into_iter().map(|(c, _)| *c).collect()
    }
}

struct Search<'a, 's> {
    dev: &'a mut dyn Measure,
    s: &'s TuneSettings,
    log: TuneLog,
    failed: BTreeSet<Config>,
    measured: BTreeSet<Config>,
}

impl Search<'_, '_> {
    fn over_budget(&self) -> bool {
        self.dev.spent() >= self.s.budget
    }

    /// Measures `c`; its time, or `None` (wrong or failed, logged and remembered).
    fn measure(&mut self, c: &Config, repeats: u32, round: u32) -> Option<f64> {
        let outcome = self.dev.measure(c, repeats);
        self.measured.insert(c.clone());
        let (name, us, reason) = match &outcome {
            Outcome::Time(us) => ("time", Some(*us), None),
            Outcome::Wrong(r) => ("wrong", None, Some(r.clone())),
            Outcome::Failed(r) => ("failed", None, Some(r.clone())),
        };
        self.log.rows.push(LogRow {
            round,
            candidate: c.candidate,
            log_blocks: c.point.log_blocks.clone(),
            num_warps: c.point.num_warps,
            num_stages: c.point.num_stages,
            kernels: c.kernels.clone(),
            repeats,
            outcome: name,
            us,
            reason,
            spent: self.dev.spent(),
        });
        match outcome {
            Outcome::Time(us) => {
                let better = match self.log.best.get(&c.candidate) {
                    None => true,
                    Some((_, b, r)) => repeats > *r || (repeats == *r && us < *b),
                };
                if better {
                    self.log.best.insert(c.candidate, (c.clone(), us, repeats));
                }
                Some(us)
            }
            Outcome::Wrong(r) => {
                self.log.wrong.entry(c.candidate).or_insert(r);
                self.log.best.remove(&c.candidate);
                None
            }
            Outcome::Failed(_) => {
                self.failed.insert(c.clone());
                None
            }
        }
    }

    fn fresh(&self, c: &Config, next: &[Config]) -> bool {
        !self.measured.contains(c) && !self.failed.contains(c) && !next.contains(c)
    }
}

/// Tunes the candidates of `spaces` (in rank order, `starts` their ranked schedules,
/// `estimates` their T̂) on `dev` within `s.budget`.
pub fn tune(
    spaces: &[Space],
    starts: &[Point],
    estimates: &[f64],
    dev: &mut dyn Measure,
    s: &TuneSettings,
) -> TuneLog {
    let mut rng = Rng::new(s.seed);
    let mut search = Search {
        dev,
        s,
        log: TuneLog::default(),
        failed: BTreeSet::new(),
        measured: BTreeSet::new(),
    };
    let config = |candidate: usize, point: Point| Config {
        candidate,
        point,
        kernels: Vec::new(),
    };
    // Round 0: every candidate at its ranked schedule; the `explore` the model ranks best
    // also at a few neighbours and one random legal sample.
    let mut by_estimate: Vec<usize> = (0..spaces.len()).collect();
    by_estimate.sort_by(|a, b| estimates[*a].total_cmp(&estimates[*b]).then(a.cmp(b)));
    let mut pop: Vec<Config> = Vec::new();
    for (i, (sp, start)) in spaces.iter().zip(starts).enumerate() {
        if sp.legal(start) {
            pop.push(config(i, start.clone()));
        }
    }
    for &i in by_estimate.iter().take(s.explore) {
        let (sp, start) = (&spaces[i], &starts[i]);
        let mut more: Vec<Point> = sp
            .neighbours(start)
            .into_iter()
            .take(s.neighbours)
            .collect();
        more.extend(sp.sample(&mut rng));
        for q in more {
            let c = config(i, q);
            if !pop.contains(&c) {
                pop.push(c);
            }
        }
    }
    // With multi-kernel candidates, a share of the budget stays for their kernels.
    let halving_budget = if spaces.iter().any(|sp| sp.kernels() > 1) {
        s.budget * (1.0 - PER_KERNEL_SHARE)
    } else {
        s.budget
    };
    let eta = s.eta.max(2) as usize;
    let mut repeats = s.repeats.max(1);
    let mut stop = String::from("rounds done");
    if pop.is_empty() {
        search.log.stop = "no candidate has a legal schedule under the rank model".into();
        return search.log;
    }
    let mut round = 0;
    'rounds: while round < s.rounds.max(1) {
        let mut results: Vec<(f64, Config)> = Vec::new();
        let todo: Vec<Config> = pop
            .iter()
            .filter(|c| !search.log.wrong.contains_key(&c.candidate) && !search.failed.contains(c))
            .cloned()
            .collect();
        search.dev.prepare(&todo);
        for c in &pop {
            if search.log.wrong.contains_key(&c.candidate) || search.failed.contains(c) {
                continue;
            }
            // The budget stops the search once something has a time: a slow first
            // compilation does not leave a source function unmeasured.
            if search.dev.spent() >= halving_budget && !search.log.best.is_empty() {
                stop = format!("budget ({} s) spent", s.budget);
                search.log.rounds = round + 1;
                break 'rounds;
            }
            if let Some(us) = search.measure(c, repeats, round) {
                results.push((us, c.clone()));
            }
        }
        search.log.rounds = round + 1;
        results.retain(|r| !search.log.wrong.contains_key(&r.1.candidate));
        results.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        if results.len() <= 1 {
            stop = "one configuration left".into();
            break;
        }
        let keep = results.len().div_ceil(eta).max(1);
        let mut next: Vec<Config> = results[..keep].iter().map(|r| r.1.clone()).collect();
        // Places for the candidates the model ranks best that the noise may have dropped.
        let mut reserved = 0;
        for &cand in &by_estimate {
            if reserved >= s.reserve {
                break;
            }
            if next.iter().any(|c| c.candidate == cand) {
                continue;
            }
            if let Some(r) = results.iter().find(|r| r.1.candidate == cand) {
                next.push(r.1.clone());
                reserved += 1;
            }
        }
        // New schedules around the best kept.
        for r in &results[..keep] {
            let sp = &spaces[r.1.candidate];
            let mut added = 0;
            for q in sp.neighbours(&r.1.point) {
                if added >= s.neighbours {
                    break;
                }
                let c = config(r.1.candidate, q);
                if search.fresh(&c, &next) {
                    next.push(c);
                    added += 1;
                }
            }
            if let Some(q) = sp.mutate(&r.1.point, &mut rng) {
                let c = config(r.1.candidate, q);
                if search.fresh(&c, &next) {
                    next.push(c);
                }
            }
        }
        pop = next;
        repeats = repeats.saturating_mul(s.eta.max(2));
        round += 1;
    }
    // Kernel by kernel: warps and stages of one kernel at a time, the others fixed.
    if let Some((best, _)) = search.log.chosen().map(|(c, us)| (c.clone(), us)) {
        let sp = &spaces[best.candidate];
        let kernels = sp.kernels();
        if kernels > 1 && !search.over_budget() {
            let reps = search
                .log
                .best
                .get(&best.candidate)
                .map_or(repeats, |b| b.2);
            let mut cur = best.clone();
            cur.kernels = (0..kernels).map(|k| best.kernel(k)).collect();
            let mut cur_us = search.log.best.get(&best.candidate).map(|b| b.1);
            'kernels: for k in 0..kernels {
                let (w, st) = cur.kernel(k);
                let mut variants = Vec::new();
                for w2 in [w / 2, w * 2] {
                    if NUM_WARPS.contains(&w2) {
                        variants.push((w2, st));
                    }
                }
                for s2 in [st.wrapping_sub(1), st + 1] {
                    if NUM_STAGES.contains(&s2) {
                        variants.push((w, s2));
                    }
                }
                for v in variants {
                    if search.over_budget() {
                        stop = format!("budget ({} s) spent", s.budget);
                        break 'kernels;
                    }
                    let mut c = cur.clone();
                    c.kernels[k] = v;
                    if sp.config_us(&c).is_none() || !search.fresh(&c, &[]) {
                        continue;
                    }
                    match search.measure(&c, reps, round) {
                        Some(us) if cur_us.is_none_or(|b| us < b) => {
                            cur = c;
                            cur_us = Some(us);
                        }
                        Some(_) => {}
                        None if search.log.wrong.contains_key(&best.candidate) => break 'kernels,
                        None => {}
                    }
                }
            }
        }
    }
    search.log.stop = stop;
    search.log
}
