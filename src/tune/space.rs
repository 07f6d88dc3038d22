//! A candidate's schedules as the rank model's domain has them: a power-of-two block size per
//! schedule axis between the plan's bounds, warps from [`NUM_WARPS`], stages from
//! [`NUM_STAGES`]. A point is *legal* where the model finds it within the GPU's registers,
//! shared memory and Triton's block limit; the search only proposes legal points.

use super::Config;
use crate::interp::Rng;
use crate::rank::device::Device;
use crate::rank::model::{AtBlocks, Cost, FunctionModel, Point, NUM_STAGES, NUM_WARPS};
use std::cell::RefCell;
use std::collections::BTreeMap;

pub struct Space<'m, 'p> {
    pub model: &'m FunctionModel<'p>,
    dev: &'m Device,
    /// The model's terms at each block point evaluated so far.
    at: RefCell<BTreeMap<Vec<u32>, std::rc::Rc<AtBlocks>>>,
}

impl<'m, 'p> Space<'m, 'p> {
    pub fn new(model: &'m FunctionModel<'p>, dev: &'m Device) -> Space<'m, 'p> {
        Space {
            model,
            dev,
            at: RefCell::new(BTreeMap::new()),
        }
    }

    pub fn kernels(&self) -> usize {
        self.model.kernels.len()
    }

    fn at(&self, log_blocks: &[u32]) -> std::rc::Rc<AtBlocks> {
        if let Some(a) = self.at.borrow().get(log_blocks) {
            return a.clone();
        }
        let a = std::rc::Rc::new(self.model.at_blocks(log_blocks));
        self.at.borrow_mut().insert(log_blocks.to_vec(), a.clone());
        a
    }

    /// The model's cost at a point, `None` where illegal.
    pub fn cost(&self, p: &Point) -> Option<Cost> {
        let at = self.at(&p.log_blocks);
        self.model.eval_at(self.dev, &at, p.num_warps, p.num_stages)
    }

    /// The model's time (µs) of a configuration, each kernel at its own warps and stages;
    /// `None` where some kernel is illegal there.
    pub fn config_us(&self, c: &Config) -> Option<f64> {
        let at = self.at(&c.point.log_blocks);
        let mut total = 0.0;
        let mut by_ws: BTreeMap<(u64, u64), Option<Cost>> = BTreeMap::new();
        for k in 0..self.kernels() {
            let ws = c.kernel(k);
            let cost = by_ws
                .entry(ws)
                .or_insert_with(|| self.model.eval_at(self.dev, &at, ws.0, ws.1));
            total += cost.as_ref()?.kernels.get(k)?.us;
        }
        Some(total)
    }

    pub fn legal(&self, p: &Point) -> bool {
        p.log_blocks.len() == self.model.lo.len()
            && p.log_blocks
                .iter()
                .zip(self.model.lo.iter().zip(&self.model.hi))
                .all(|(l, (lo, hi))| lo <= l && l <= hi)
            && self.cost(p).is_some()
    }

    /// The legal points one move away, in a fixed order: each block halved, then doubled;
    /// warps halved, doubled; stages one less, one more.
    pub fn neighbours(&self, p: &Point) -> Vec<Point> {
        let mut out = Vec::new();
        for i in 0..p.log_blocks.len() {
            for up in [false, true] {
                let mut q = p.clone();
                let l = q.log_blocks[i];
                q.log_blocks[i] = if up { l + 1 } else { l.wrapping_sub(1) };
                if l == 0 && !up {
                    continue;
                }
                out.push(q);
            }
        }
        for w in [p.num_warps / 2, p.num_warps * 2] {
            if NUM_WARPS.contains(&w) {
                out.push(Point {
                    num_warps: w,
                    ..p.clone()
                });
            }
        }
        for s in [p.num_stages.wrapping_sub(1), p.num_stages + 1] {
            if NUM_STAGES.contains(&s) {
                out.push(Point {
                    num_stages: s,
                    ..p.clone()
                });
            }
        }
        out.retain(|q| self.legal(q));
        out
    }

    /// Two or three random moves away, legal; `None` after a few tries.
    pub fn mutate(&self, p: &Point, rng: &mut Rng) -> Option<Point> {
        for _ in 0..16 {
            let mut q = p.clone();
            for _ in 0..2 + rng.below(2) {
                let n = self.neighbours(&q);
                if n.is_empty() {
                    break;
                }
                q = n[rng.below(n.len() as u64) as usize].clone();
            }
            if &q != p {
                return Some(q);
            }
        }
        None
    }

    /// A uniformly random legal point; `None` after 64 illegal draws.
    pub fn sample(&self, rng: &mut Rng) -> Option<Point> {
        for _ in 0..64 {
            let log_blocks = self
                .model
                .lo
                .iter()
                .zip(&self.model.hi)
                .map(|(lo, hi)| lo + rng.below(u64::from(hi - lo + 1)) as u32)
                .collect();
            let p = Point {
                log_blocks,
                num_warps: NUM_WARPS[rng.below(NUM_WARPS.len() as u64) as usize],
                num_stages: NUM_STAGES[rng.below(NUM_STAGES.len() as u64) as usize],
            };
            if self.legal(&p) {
                return Some(p);
            }
        }
        None
    }

    /// Every point of the domain (legal or not), for exhaustive comparisons in tests.
    pub fn points(&self) -> Vec<Point> {
        let mut out = Vec::new();
        for b in self.model.block_points() {
            for w in NUM_WARPS {
                for s in NUM_STAGES {
                    out.push(Point {
                        log_blocks: b.clone(),
                        num_warps: w,
                        num_stages: s,
                    });
                }
            }
        }
        out
    }
}
