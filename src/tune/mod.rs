//! Tuning (paper §6.3): ranking is optimistic, so the choice among the ranked candidates is
//! settled by measuring them, and their schedules are tuned while doing so.
//!
//! - [`space`]: a candidate's schedules — block sizes per axis, warps, stages, as the rank
//!   model's domain has them — with the local moves, random mutations and random legal
//!   samples the search makes;
//! - [`halving`]: successive halving over (candidate, schedule) pairs within a budget, then
//!   kernel-by-kernel tuning of warps and stages for multi-kernel candidates;
//! - [`simulated`]: a [`Measure`] that answers from the rank model with seeded noise and
//!   deliberately mis-ranked and wrong candidates: the search is tested without a GPU;
//! - [`launch`]: the launch plan of a generated host function, compiled for the GPU by
//!   `python/efopt_cuda.py` (cached on disk);
//! - [`cuda`]: the GPU [`Measure`], with `cudarc`: load, validate, time.
//!
//! A measurement validates a configuration before it times it: its outputs are compared with
//! the reference interpreter's (relative L2 ≤ 0.01). A candidate with a wrong output is
//! excluded (never timed again, never chosen); a configuration that fails to compile or to
//! launch is dropped alone.

pub mod cuda;
pub mod halving;
pub mod launch;
pub mod simulated;
pub mod space;

pub use halving::{tune, TuneLog, TuneSettings};

use crate::rank::model::Point;

/// One configuration: a candidate (its index among those tuned) and its schedule. `kernels`
/// gives kernel i its own warps and stages (`kernels[i]`, when present); block sizes stay
/// those of the function, as they shape the buffers kernels share.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Config {
    pub candidate: usize,
    pub point: Point,
    pub kernels: Vec<(u64, u64)>,
}

impl Config {
    /// Kernel `k`'s warps and stages.
    pub fn kernel(&self, k: usize) -> (u64, u64) {
        self.kernels
            .get(k)
            .copied()
            .unwrap_or((self.point.num_warps, self.point.num_stages))
    }

    /// Whether any kernel has warps or stages of its own.
    pub fn per_kernel(&self) -> bool {
        self.kernels
            .iter()
            .any(|&ws| ws != (self.point.num_warps, self.point.num_stages))
    }
}

/// What a measurement gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The median latency (µs) of the timed repeats.
    Time(f64),
    /// The outputs differ from the reference: the candidate is wrong.
    Wrong(String),
    /// The configuration did not compile or launch (out of resources, a compiler error).
    Failed(String),
}

/// A device that validates and times configurations.
pub trait Measure {
    /// Validates `c` (once per configuration), then times it with `repeats` repeats.
    fn measure(&mut self, c: &Config, repeats: u32) -> Outcome;
    /// Compiles configurations about to be measured, together where the device can (a
    /// round's new configurations); measuring compiles anything left.
    fn prepare(&mut self, _configs: &[Config]) {}
    /// Budget spent so far (seconds): wall time on a GPU, modelled time when simulated.
    fn spent(&self) -> f64;
    /// What the device is, for the report.
    fn describe(&self) -> String;
}
