//! Static ranking of candidates (paper §6.2): an optimistic latency T̂ per candidate, the
//! minimum over its legal schedules θ of a roofline cost T(θ).
//!
//! - [`device`]: the GPU models (throughputs, limits) from `data/devices.json`;
//! - [`model`]: the cost T(θ) of a [`KernelPlan`] and the legality of θ;
//! - [`lp`]: the LP relaxation over log2 block sizes (a lower bound of T̂, and a point to
//!   round);
//! - here: T̂ by the LP and rounding (then a local search scored by the exact model), or by
//!   scoring every legal point ([`Solver::Exhaustive`]).

pub mod device;
pub mod lp;
pub mod model;

use crate::lower::plan::{KernelPlan, Schedule};
use device::Device;
use model::{Cost, FunctionModel, Point};

/// How T̂ is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Solver {
    /// The LP relaxation, rounded to the nearest block sizes, improved by a local search
    /// (one block size doubled or halved at a time) under the exact model.
    Lp,
    /// Every point of the discrete domain.
    Exhaustive,
}

/// A candidate's estimate.
#[derive(Clone, Debug)]
pub struct Estimate {
    pub point: Point,
    pub schedule: Schedule,
    pub cost: Cost,
    /// The LP optimum (µs), a lower bound of `cost.us` (`Solver::Lp` only).
    pub lp_bound_us: Option<f64>,
}

/// Past this many block points, an LP whose rounding finds no legal point does not fall
/// back to scoring them all.
const FALLBACK_POINTS: u64 = 4096;

/// T̂ of a plan on `dev`, or `None` when no schedule is legal.
pub fn estimate(plan: &KernelPlan, dev: &Device, solver: Solver) -> Option<Estimate> {
    let m = FunctionModel::new(plan, dev);
    estimate_model(&m, dev, solver)
}

pub fn estimate_model(m: &FunctionModel, dev: &Device, solver: Solver) -> Option<Estimate> {
    match solver {
        Solver::Exhaustive => exhaustive(m, dev),
        Solver::Lp => {
            // Every demand on shared memory and registers grows with the blocks: no legal
            // point at the smallest blocks, none at all.
            m.best_at(dev, &m.lo)?;
            let relaxed = lp::relax(m, dev);
            let start: Vec<u32> = match &relaxed {
                Some((_, x)) => x
                    .iter()
                    .zip(m.lo.iter().zip(&m.hi))
                    .map(|(v, (l, h))| (v.round().max(0.0) as u32).clamp(*l, *h))
                    .collect(),
                None => m.lo.clone(),
            };
            let mut found = local_search(m, dev, start);
            if found.is_none() && m.block_count() <= FALLBACK_POINTS {
                found = exhaustive(m, dev);
            }
            let mut e = found?;
            e.lp_bound_us = relaxed.map(|(b, _)| b);
            Some(e)
        }
    }
}

fn exhaustive(m: &FunctionModel, dev: &Device) -> Option<Estimate> {
    m.best_at(dev, &m.lo)?;
    let mut best: Option<(Point, Cost)> = None;
    for blocks in m.block_points() {
        if let Some((p, c)) = m.best_at(dev, &blocks) {
            if best.as_ref().is_none_or(|(_, b)| c.us < b.us) {
                best = Some((p, c));
            }
        }
    }
    best.map(|(point, cost)| Estimate {
        schedule: m.schedule(&point),
        point,
        cost,
        lp_bound_us: None,
    })
}

/// From `start` (made legal by halving its largest blocks if needed), move to the best
/// neighbour (one block size doubled or halved) while it improves.
fn local_search(m: &FunctionModel, dev: &Device, start: Vec<u32>) -> Option<Estimate> {
    let mut at = start;
    let mut current = loop {
        if let Some(found) = m.best_at(dev, &at) {
            break found;
        }
        // Halve the largest block above its minimum; none left: no legal point this way.
        let i = (0..at.len())
            .filter(|i| at[*i] > m.lo[*i])
            .max_by_key(|i| (at[*i] - m.lo[*i], std::cmp::Reverse(*i)))?;
        at[i] -= 1;
    };
    loop {
        let mut best: Option<(Point, Cost)> = None;
        for i in 0..at.len() {
            for up in [false, true] {
                let mut next = at.clone();
                if up && next[i] < m.hi[i] {
                    next[i] += 1;
                } else if !up && next[i] > m.lo[i] {
                    next[i] -= 1;
                } else {
                    continue;
                }
                if let Some((p, c)) = m.best_at(dev, &next) {
                    let threshold = best.as_ref().map_or(current.1.us, |(_, b)| b.us);
                    if c.us < threshold * (1.0 - 1e-9) {
                        best = Some((p, c));
                    }
                }
            }
        }
        match best {
            Some(b) => {
                at = b.0.log_blocks.clone();
                current = b;
            }
            None => break,
        }
    }
    let (point, cost) = current;
    Some(Estimate {
        schedule: m.schedule(&point),
        point,
        cost,
        lp_bound_us: None,
    })
}
