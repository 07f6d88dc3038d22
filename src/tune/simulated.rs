//! A simulated device: the rank model's time of each configuration, times a per-candidate
//! factor (the model's error: most candidates within ±10 %, one deliberately mis-ranked far
//! faster than predicted), with seeded noise that shrinks as repeats grow; chosen candidates
//! can be made wrong (their validation fails). The budget is modelled too: a compilation
//! per new configuration, and each repeat. It drives the search in tests and in
//! `tune{device=simulated}` without a GPU; its timings are the model's, not measurements.

use super::space::Space;
use super::{Config, Measure, Outcome};
use crate::interp::Rng;
use std::collections::BTreeSet;

/// Modelled seconds to compile and load a new configuration (a round's compile together on
/// a GPU machine's cores: about a second each, eight at a time).
pub const COMPILE_S: f64 = 0.15;
/// Modelled seconds per repeat (a CUDA graph of many launches).
pub const REPEAT_S: f64 = 0.02;

pub struct Simulated<'a, 'm, 'p> {
    spaces: &'a [Space<'m, 'p>],
    /// True time = model time × factor.
    pub factor: Vec<f64>,
    /// Candidates whose outputs are wrong.
    pub wrong: BTreeSet<usize>,
    /// Relative standard deviation of one repeat.
    pub noise: f64,
    rng: Rng,
    spent: f64,
    compiled: BTreeSet<Config>,
}

impl<'a, 'm, 'p> Simulated<'a, 'm, 'p> {
    /// Factors in [0.9, 1.1] from `seed`, but for one candidate in the lower half of the
    /// ranking (when there are two or more): 0.5, the model's worst mistake.
    pub fn new(spaces: &'a [Space<'m, 'p>], seed: u64) -> Simulated<'a, 'm, 'p> {
        let mut rng = Rng::new(seed ^ 0x5157);
        let n = spaces.len();
        let mut factor: Vec<f64> = (0..n).map(|_| 0.9 + 0.2 * rng.uniform()).collect();
        if n >= 2 {
            let lower = n / 2 + rng.below((n - n / 2) as u64) as usize;
            factor[lower] = 0.5;
        }
        Simulated {
            spaces,
            factor,
            wrong: BTreeSet::new(),
            noise: 0.05,
            rng,
            spent: 0.0,
            compiled: BTreeSet::new(),
        }
    }

    /// The true (noise-free) time of a configuration; `None` where it cannot launch.
    pub fn truth(&self, c: &Config) -> Option<f64> {
        Some(self.spaces.get(c.candidate)?.config_us(c)? * self.factor[c.candidate])
    }

    /// The fastest configuration of a correct candidate over every function-level schedule.
    pub fn optimum(&self) -> Option<(Config, f64)> {
        let mut best: Option<(Config, f64)> = None;
        for (i, sp) in self.spaces.iter().enumerate() {
            if self.wrong.contains(&i) {
                continue;
            }
            for p in sp.points() {
                let c = Config {
                    candidate: i,
                    point: p,
                    kernels: Vec::new(),
                };
                if let Some(t) = self.truth(&c) {
                    if best.as_ref().is_none_or(|b| t < b.1) {
                        best = Some((c, t));
                    }
                }
            }
        }
        best
    }
}

impl Measure for Simulated<'_, '_, '_> {
    fn measure(&mut self, c: &Config, repeats: u32) -> Outcome {
        if self.compiled.insert(c.clone()) {
            self.spent += COMPILE_S;
        }
        if self.wrong.contains(&c.candidate) {
            return Outcome::Wrong("simulated: outputs differ from the reference".into());
        }
        let Some(t) = self.truth(c) else {
            return Outcome::Failed("simulated: no legal launch (out of resources)".into());
        };
        let repeats = repeats.max(1);
        self.spent += REPEAT_S * f64::from(repeats);
        // The median of `repeats` noisy runs: its spread shrinks like 1/√repeats.
        let e = self.noise * self.rng.normal() / f64::from(repeats).sqrt();
        Outcome::Time(t * (1.0 + e).max(0.5))
    }

    fn spent(&self) -> f64 {
        self.spent
    }

    fn describe(&self) -> String {
        "simulated (rank model with seeded noise; not a measurement)".into()
    }
}
