//! The cost of a planned function under a schedule θ (paper §6.2; docs/rank.md).
//!
//! Each kernel's demand on each resource is a sum of [`Term`]s: products of the schedule's
//! block sizes `b`, tile counts `⌈n/b⌉` and constants, built once per plan from its steps,
//! loads and stores ([`FunctionModel::new`]) and evaluated cheaply at any θ ([`FunctionModel::eval`]).
//!
//! Per kernel, at θ:
//! - **programs** P: the product of the tile counts of its grid axes;
//! - **DRAM bytes**: per buffer it reads, the *requested* bytes R (each tile a program loads,
//!   at its clipped extent, times the loop iterations it is loaded in — visited tiles only, in
//!   loops that skip masked tiles — times P) and the *distinct* bytes D (the same over the
//!   programs that read different tiles). L2 rule: a buffer comes from DRAM once (D) when D
//!   fits in half the L2, or when the programs that share its tiles are adjacent in launch
//!   order (the shared grid axes vary fastest) and one wave's share of D fits in half the L2;
//!   otherwise once per wave, at most every request: min(R, D · waves) (the programs of a
//!   wave run together, so a tile they share is fetched once for all of them). Several
//!   loads of one buffer count D once (the largest). Stores write each stored buffer once;
//! - **work by unit**, at the blocks (padding included, as the hardware does it), times the
//!   iterations of the loops around it and P, so a value every program recomputes costs its
//!   work times the programs that recompute it: `tl.dot` products on tensor cores (bf16/f16
//!   operands at the bf16 rate, others at the tf32 rate; a block with fewer rows than the
//!   device's instruction multiplies costs as many), products with a block of one row or
//!   column, elementwise operators and reductions on CUDA cores, exp/log/sqrt/rsqrt/tanh/
//!   sigmoid/silu/gelu/reciprocal/pow on the special-function units;
//! - **parallelism**: blocks per SM (occupancy, from warps, shared memory and registers),
//!   waves = ⌈P / (SMs·occupancy)⌉ and the fraction of the SMs the grid keeps busy,
//!   u = min(1, P / (waves·SMs)): every rate is scaled by u;
//! - T_k(θ) = launch + max over resources of demand / (rate · u).
//!
//! T(θ) = Σ_k T_k(θ). Legal θ: every block value at most 2^20 elements (Triton's limit), the
//! `tl.dot` operand tiles (times `num_stages` inside a loop) within the shared memory of a
//! block, and the fold state plus the largest block value within the registers of the
//! block's threads (32 per thread kept for addresses and indices).

use super::device::Device;
use crate::ir::*;
use crate::lower::mask::cost::{fold_update, skip_visits, Update};
use crate::lower::plan::{KernelPlan, PlannedKernel, Range, Schedule};
use crate::lower::walk::{blocks, field_types, Block, Step};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// Triton's largest block (elements).
pub const MAX_NUMEL: f64 = (1u64 << 20) as f64;

/// Most programs a kernel launches: the backend's grid is one-dimensional (its programs are
/// numbered by `tl.program_id(0)`), and CUDA's grid holds at most 2^31 − 1 blocks along x. A
/// kernel with more has no legal schedule.
pub const MAX_PROGRAMS: f64 = ((1u64 << 31) - 1) as f64;
/// Registers per thread kept for addresses, indices and masks.
pub const RESERVED_REGS: u64 = 32;
pub const NUM_WARPS: [u64; 5] = [4, 8, 2, 16, 1];
pub const NUM_STAGES: [u64; 5] = [3, 2, 4, 1, 5];

/// Registers a thread needs to keep `words` 32-bit values live over `warps` warps, as
/// allocated (in units of 8), plus [`RESERVED_REGS`]; `None` above the per-thread limit.
pub fn registers(words: f64, warps: u64, dev: &Device) -> Option<u64> {
    let regs = (words / (32 * warps) as f64).ceil() as u64 + RESERVED_REGS;
    (regs <= dev.max_regs_per_thread).then(|| regs.div_ceil(8) * 8)
}

/// The most 32-bit values a kernel can keep live under some warps of [`NUM_WARPS`]: per
/// thread within the register limit, one block's registers within an SM's, and no block over
/// [`MAX_NUMEL`]. A kernel holding more has no legal schedule (`eval_at`), whatever its
/// blocks: rank-bounded extraction prunes programs with such a value.
pub fn max_live_words(dev: &Device) -> f64 {
    let fits = |words: u64, w: u64| {
        registers(words as f64, w, dev).is_some_and(|r| r * 32 * w <= dev.regs_per_sm)
            && w <= dev.max_warps_per_sm
    };
    let most = NUM_WARPS
        .iter()
        .map(|&w| {
            // Words fit iff ceil(words / threads) fits: the largest such multiple of threads.
            let threads = 32 * w;
            let per_thread = (0..=dev.max_regs_per_thread)
                .rev()
                .find(|r| fits(r * threads, w))
                .unwrap_or(0);
            per_thread * threads
        })
        .max()
        .unwrap_or(0);
    (most as f64).min(MAX_NUMEL)
}

/// The resources a kernel is bound by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    Dram,
    TensorCores,
    CudaCores,
    SpecialFunctions,
    /// Loads in a loop wait for DRAM: one latency per `num_stages` iterations.
    MemoryLatency,
    Launch,
}

impl Resource {
    pub fn name(self) -> &'static str {
        match self {
            Resource::Dram => "dram",
            Resource::TensorCores => "tensor-cores",
            Resource::CudaCores => "cuda-cores",
            Resource::SpecialFunctions => "special-functions",
            Resource::MemoryLatency => "memory-latency",
            Resource::Launch => "launch",
        }
    }
}

/// The unit a piece of work runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    TensorBf16 = 0,
    TensorTf32 = 1,
    Cuda = 2,
    Sfu = 3,
}
pub const UNITS: usize = 4;

/// Exponents of one schedule axis in a term: `min(b, n)^clipped · b^block · ⌈n/b⌉^tiles`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pow {
    pub clipped: i32,
    pub block: i32,
    pub tiles: i32,
}

impl Pow {
    pub fn is_zero(&self) -> bool {
        *self == Pow::default()
    }
}

/// `coeff · Π_axes factor · Π visited tiles of skipping loops`.
#[derive(Clone, Debug, PartialEq)]
pub struct Term {
    pub coeff: f64,
    /// One per schedule axis.
    pub pows: Vec<Pow>,
    /// Iterations of a skipping loop: its index in the kernel's skips, and whether only its
    /// partly masked tiles count.
    pub skips: Vec<(usize, bool)>,
    /// Blocks the hardware pads: `max(b, floor) / b` for (axis, floor) — rows of a tensor-
    /// core product below the instruction's height. At least 1, so a lower bound may omit it.
    pub pads: Vec<(usize, f64)>,
}

impl Term {
    pub fn constant(axes: usize, coeff: f64) -> Term {
        Term {
            coeff,
            pows: vec![Pow::default(); axes],
            skips: Vec::new(),
            pads: Vec::new(),
        }
    }

    fn times(&self, o: &Term) -> Term {
        let mut t = self.clone();
        t.coeff *= o.coeff;
        for (p, q) in t.pows.iter_mut().zip(&o.pows) {
            p.clipped += q.clipped;
            p.block += q.block;
            p.tiles += q.tiles;
        }
        t.skips.extend(o.skips.iter().copied());
        t.pads.extend(o.pads.iter().copied());
        t
    }

    /// The value at blocks `b` of dimensions `n`, with each skipping loop's (visited,
    /// masked) tiles per program.
    pub fn value(&self, b: &[f64], n: &[f64], skips: &[(f64, f64)]) -> f64 {
        let mut v = self.coeff;
        for (i, p) in self.pows.iter().enumerate() {
            if p.is_zero() {
                continue;
            }
            let (b, n) = (b[i], n[i]);
            v *= b.min(n).powi(p.clipped) * b.powi(p.block) * (n / b).ceil().max(1.0).powi(p.tiles);
        }
        for (i, floor) in &self.pads {
            v *= b[*i].max(*floor) / b[*i];
        }
        for (k, masked) in &self.skips {
            let (all, part) = skips.get(*k).copied().unwrap_or((0.0, 0.0));
            v *= if *masked { part } else { all };
        }
        v
    }
}

fn sum(terms: &[Term], b: &[f64], n: &[f64], s: &[(f64, f64)]) -> f64 {
    terms.iter().map(|t| t.value(b, n, s)).sum()
}

/// A buffer one kernel reads.
#[derive(Clone, Debug)]
pub struct BufferRead {
    /// Per load of it: bytes requested by all programs, and distinct bytes.
    pub requested: Vec<Term>,
    pub distinct: Vec<Term>,
    /// Per load: the positions in the kernel's grid of the axes its programs share tiles
    /// along.
    pub shared: Vec<Vec<usize>>,
}

/// One kernel's demands, as terms.
#[derive(Clone, Debug)]
pub struct KernelModel {
    /// Its grid axes in launch order (the first varies fastest): a schedule axis index, or
    /// `None` for an axis of one tile.
    pub grid: Vec<Option<usize>>,
    pub reads: Vec<BufferRead>,
    /// Bytes of the buffers it stores: a constant, except that a collection's leading
    /// dimension holds one slice per tile of its axis.
    pub store_bytes: Vec<Term>,
    /// Work by [`Unit`], summed over programs.
    pub work: [Vec<Term>; UNITS],
    /// `tl.dot` operand tiles (bytes), and whether the product sits in a loop (pipelined
    /// over `num_stages`).
    pub smem: Vec<(Term, bool)>,
    /// Loop-carried fold state, 32-bit words per program.
    pub state_words: Vec<Term>,
    /// Each block value's words (the largest counts toward registers; each must fit
    /// [`MAX_NUMEL`]).
    pub values: Vec<Term>,
    pub skip_count: usize,
    /// Per load, the iterations of the loops around it in one program: the rounds of
    /// dependent loads a program waits for (the largest counts).
    pub rounds: Vec<Term>,
}

/// Per kernel, per skipping loop: (visited, partly masked) tiles per program.
type SkipVisits = Vec<Vec<(f64, f64)>>;

/// A function's kernels as terms over its schedule axes.
pub struct FunctionModel<'p> {
    pub plan: &'p KernelPlan<'p>,
    /// Schedule axes: names, dimension sizes, log2 block ranges.
    pub axes: Vec<String>,
    pub sizes: Vec<f64>,
    pub lo: Vec<u32>,
    pub hi: Vec<u32>,
    pub kernels: Vec<KernelModel>,
    /// Visited tiles of each kernel's skipping loops, by blocks.
    skip_cache: Mutex<BTreeMap<Vec<u64>, SkipVisits>>,
}

/// One kernel at one schedule.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelCost {
    pub programs: f64,
    pub waves: f64,
    pub occupancy: u64,
    pub dram_bytes: f64,
    /// By [`Unit`].
    pub flops: [f64; UNITS],
    pub us: f64,
    pub bottleneck: Resource,
}

/// A whole function at one schedule.
#[derive(Clone, Debug)]
pub struct Cost {
    pub us: f64,
    pub kernels: Vec<KernelCost>,
}

impl Cost {
    pub fn dram_bytes(&self) -> f64 {
        self.kernels.iter().map(|k| k.dram_bytes).sum()
    }

    pub fn flops(&self) -> [f64; UNITS] {
        let mut f = [0.0; UNITS];
        for k in &self.kernels {
            for (a, b) in f.iter_mut().zip(k.flops) {
                *a += b;
            }
        }
        f
    }

    /// The resource that bounds the kernels that take most of the time.
    pub fn bottleneck(&self) -> Resource {
        let mut by: BTreeMap<Resource, f64> = BTreeMap::new();
        for k in &self.kernels {
            *by.entry(k.bottleneck).or_default() += k.us;
        }
        by.into_iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(Resource::Launch, |(r, _)| r)
    }
}

/// A point of the schedule domain: log2 block per schedule axis, warps, stages.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Point {
    pub log_blocks: Vec<u32>,
    pub num_warps: u64,
    pub num_stages: u64,
}

impl<'p> FunctionModel<'p> {
    /// The terms of `plan` on `dev` (whose tensor cores decide how rows of a product pad).
    pub fn new(plan: &'p KernelPlan<'p>, dev: &Device) -> FunctionModel<'p> {
        let bindings: BTreeMap<&str, u64> = plan
            .function
            .bindings
            .iter()
            .map(|b| (b.name.as_str(), b.value))
            .collect();
        let dims = plan.axis_dims();
        let mut axes = Vec::new();
        let (mut sizes, mut lo, mut hi) = (Vec::new(), Vec::new(), Vec::new());
        for (a, r) in &plan.space.block {
            let (min, max) = match r {
                Range::PowersOfTwo { min, max } => (*min, *max),
                Range::OneOf(v) => (
                    v.iter().copied().min().unwrap_or(16),
                    v.iter().copied().max().unwrap_or(16),
                ),
            };
            axes.push(a.clone());
            sizes.push(dims.get(a).map_or(1.0, |d| dim_size(d, &bindings)));
            lo.push(min.max(1).ilog2());
            hi.push(max.max(min).max(1).ilog2());
        }
        let cx = Cx {
            plan,
            axes: &axes,
            bindings: &bindings,
            min_rows: dev.tensor_min_rows,
        };
        let kernels = plan.kernels.iter().map(|pk| cx.kernel(pk)).collect();
        FunctionModel {
            plan,
            axes,
            sizes,
            lo,
            hi,
            kernels,
            skip_cache: Mutex::new(BTreeMap::new()),
        }
    }

    /// The [`Schedule`] of a point.
    pub fn schedule(&self, p: &Point) -> Schedule {
        Schedule {
            block: self
                .axes
                .iter()
                .zip(&p.log_blocks)
                .map(|(a, l)| (a.clone(), 1u64 << l))
                .collect(),
            num_warps: p.num_warps,
            num_stages: p.num_stages,
            kernels: BTreeMap::new(),
        }
    }

    fn skips(&self, log_blocks: &[u32]) -> SkipVisits {
        if self.kernels.iter().all(|k| k.skip_count == 0) {
            return vec![Vec::new(); self.kernels.len()];
        }
        let key: Vec<u64> = log_blocks.iter().map(|l| 1u64 << l).collect();
        if let Ok(cache) = self.skip_cache.lock() {
            if let Some(v) = cache.get(&key) {
                return v.clone();
            }
        }
        let sched = self.schedule(&Point {
            log_blocks: log_blocks.to_vec(),
            num_warps: 4,
            num_stages: 1,
        });
        let v: SkipVisits = self
            .plan
            .kernels
            .iter()
            .map(|pk| {
                if pk.skips.is_empty() {
                    Vec::new()
                } else {
                    skip_visits(self.plan, pk, &sched)
                }
            })
            .collect();
        if let Ok(mut cache) = self.skip_cache.lock() {
            cache.insert(key, v.clone());
        }
        v
    }

    /// The cost at `p`, or `None` where `p` is illegal on `dev`.
    pub fn eval(&self, dev: &Device, p: &Point) -> Option<Cost> {
        let at = self.at_blocks(&p.log_blocks);
        self.eval_at(dev, &at, p.num_warps, p.num_stages)
    }

    /// What does not depend on warps and stages, at some blocks.
    pub fn at_blocks(&self, log_blocks: &[u32]) -> AtBlocks {
        let b: Vec<f64> = log_blocks.iter().map(|l| (1u64 << l) as f64).collect();
        let n = &self.sizes;
        let skips = self.skips(log_blocks);
        let kernels = self
            .kernels
            .iter()
            .zip(&skips)
            .map(|(k, s)| {
                let programs: f64 = k
                    .grid
                    .iter()
                    .flatten()
                    .map(|i| (n[*i] / b[*i]).ceil().max(1.0))
                    .product();
                let tiles: Vec<f64> = k
                    .grid
                    .iter()
                    .map(|i| i.map_or(1.0, |i| (n[i] / b[i]).ceil().max(1.0)))
                    .collect();
                let reads = k
                    .reads
                    .iter()
                    .map(|r| {
                        let requested = sum(&r.requested, &b, n, s);
                        let distinct = r
                            .distinct
                            .iter()
                            .map(|t| t.value(&b, n, s))
                            .fold(0.0, f64::max);
                        // Sharers adjacent in launch order: every grid axis before the last
                        // one of more than one tile that the loads share is shared too.
                        let adjacent = r.shared.iter().all(|sh| {
                            let last = sh.iter().copied().filter(|g| tiles[*g] > 1.0).max();
                            last.is_none_or(|last| {
                                (0..last).all(|g| sh.contains(&g) || tiles[g] <= 1.0)
                            })
                        });
                        (requested, distinct, adjacent)
                    })
                    .collect();
                let mut work = [0.0; UNITS];
                for (w, terms) in work.iter_mut().zip(&k.work) {
                    *w = sum(terms, &b, n, s);
                }
                let smem = k.smem.iter().map(|(t, l)| (t.value(&b, n, s), *l)).fold(
                    (0.0, 0.0),
                    |(a, c), (v, l)| if l { (a, c + v) } else { (a + v, c) },
                );
                let values: Vec<f64> = k.values.iter().map(|t| t.value(&b, n, s)).collect();
                KernelAtBlocks {
                    programs,
                    reads,
                    store_bytes: sum(&k.store_bytes, &b, n, s),
                    work,
                    smem_fixed: smem.0,
                    smem_staged: smem.1,
                    state_words: sum(&k.state_words, &b, n, s),
                    largest_value: values.iter().copied().fold(0.0, f64::max),
                    rounds: k
                        .rounds
                        .iter()
                        .map(|t| t.value(&b, n, s))
                        .fold(1.0, f64::max),
                }
            })
            .collect();
        AtBlocks { kernels }
    }

    /// The cost at some blocks with `warps` and `stages`, or `None` where illegal.
    pub fn eval_at(&self, dev: &Device, at: &AtBlocks, warps: u64, stages: u64) -> Option<Cost> {
        let mut kernels = Vec::with_capacity(at.kernels.len());
        let mut total = 0.0;
        for k in &at.kernels {
            if k.largest_value > MAX_NUMEL || k.state_words > MAX_NUMEL || k.programs > MAX_PROGRAMS
            {
                return None;
            }
            let smem = k.smem_fixed + k.smem_staged * stages as f64;
            if smem > dev.smem_per_block as f64 {
                return None;
            }
            let regs = registers(k.state_words + k.largest_value, warps, dev)?;
            let by_smem = if smem > 0.0 {
                (dev.smem_per_sm as f64 / smem).floor() as u64
            } else {
                u64::MAX
            };
            let occupancy = dev
                .max_blocks_per_sm
                .min(dev.max_warps_per_sm / warps)
                .min(by_smem)
                .min(dev.regs_per_sm / (regs * 32 * warps));
            if occupancy == 0 {
                return None;
            }
            let slots = (dev.sms * occupancy) as f64;
            let waves = (k.programs / slots).ceil().max(1.0);
            let util = (k.programs / (waves * dev.sms as f64)).min(1.0);
            let wave = k.programs.min(slots);
            let half_l2 = dev.l2_bytes as f64 / 2.0;
            let mut dram = k.store_bytes;
            for (requested, distinct, adjacent) in &k.reads {
                let fits = *distinct <= half_l2
                    || (*adjacent && distinct * wave / k.programs.max(1.0) <= half_l2);
                // Programs of one wave run together: what they share comes from DRAM once
                // per wave at most.
                dram += if fits {
                    *distinct
                } else {
                    requested.min(distinct * waves).max(*distinct)
                };
            }
            let times = [
                (Resource::Dram, dram / dev.dram_bytes_per_s),
                (
                    Resource::TensorCores,
                    k.work[Unit::TensorBf16 as usize] / dev.tensor_bf16_flops
                        + k.work[Unit::TensorTf32 as usize] / dev.tensor_tf32_flops,
                ),
                (
                    Resource::CudaCores,
                    k.work[Unit::Cuda as usize] / dev.cuda_f32_ops,
                ),
                (
                    Resource::SpecialFunctions,
                    k.work[Unit::Sfu as usize] / dev.sfu_ops,
                ),
            ];
            // Each wave's programs wait one DRAM latency for their first loads, then one per
            // `num_stages` further rounds (the loads of a loop iteration are issued that many
            // iterations ahead).
            let latency = waves * (1.0 + (k.rounds - 1.0) / stages as f64) * dev.dram_latency_s;
            let (bottleneck, t) =
                times.iter().copied().fold(
                    (Resource::Launch, 0.0),
                    |a, b| if b.1 > a.1 { b } else { a },
                );
            let (bottleneck, t) = if latency > t / util {
                (Resource::MemoryLatency, latency * util)
            } else {
                (bottleneck, t)
            };
            let us = (dev.launch_s + t / util) * 1e6;
            total += us;
            kernels.push(KernelCost {
                programs: k.programs,
                waves,
                occupancy,
                dram_bytes: dram,
                flops: k.work,
                us,
                bottleneck,
            });
        }
        Some(Cost { us: total, kernels })
    }

    /// Why no schedule is legal, read at the smallest blocks with the most lenient warps and
    /// stages: the first kernel and limit that fail there (every demand grows with the
    /// blocks). `None` where a schedule is legal.
    pub fn illegal_reason(&self, dev: &Device) -> Option<String> {
        if self.best_at(dev, &self.lo).is_some() {
            return None;
        }
        let at = self.at_blocks(&self.lo);
        for (i, k) in at.kernels.iter().enumerate() {
            let largest = k.largest_value.max(k.state_words);
            if largest > MAX_NUMEL {
                return Some(format!(
                    "kernel {i} holds a block of {largest} elements at the smallest block sizes (Triton's limit is 2^20): an operator over a whole large tensor that no rule tiles"
                ));
            }
            if k.smem_fixed + k.smem_staged > dev.smem_per_block as f64 {
                return Some(format!(
                    "kernel {i}'s matrix-product tiles take {} bytes of shared memory at the smallest block sizes (a block has {}): a product over a whole large dimension",
                    k.smem_fixed + k.smem_staged,
                    dev.smem_per_block
                ));
            }
            let words = k.state_words + k.largest_value;
            let regs = (words / (32.0 * 16.0)).ceil() as u64 + RESERVED_REGS;
            if regs > dev.max_regs_per_thread || regs.div_ceil(8) * 8 * 32 * 16 > dev.regs_per_sm {
                return Some(format!(
                    "kernel {i} keeps {words} 32-bit values live at the smallest block sizes: {regs} registers a thread even with 16 warps (an SM has {} for 512 threads, at most {} a thread)",
                    dev.regs_per_sm, dev.max_regs_per_thread
                ));
            }
        }
        Some("no warps and stages fit at the smallest block sizes".into())
    }

    /// The best warps and stages at some blocks (the first best in [`NUM_WARPS`] ×
    /// [`NUM_STAGES`] order: ties keep 4 warps and 3 stages).
    pub fn best_at(&self, dev: &Device, log_blocks: &[u32]) -> Option<(Point, Cost)> {
        let at = self.at_blocks(log_blocks);
        let mut best: Option<(Point, Cost)> = None;
        for w in NUM_WARPS {
            for s in NUM_STAGES {
                if let Some(c) = self.eval_at(dev, &at, w, s) {
                    if best.as_ref().is_none_or(|(_, b)| c.us < b.us) {
                        best = Some((
                            Point {
                                log_blocks: log_blocks.to_vec(),
                                num_warps: w,
                                num_stages: s,
                            },
                            c,
                        ));
                    }
                }
            }
        }
        best
    }

    /// Every point of the block domain, in increasing order.
    pub fn block_points(&self) -> impl Iterator<Item = Vec<u32>> + '_ {
        let count: u64 = self
            .lo
            .iter()
            .zip(&self.hi)
            .map(|(l, h)| u64::from(h - l + 1))
            .product();
        (0..count).map(move |mut i| {
            let mut v = Vec::with_capacity(self.lo.len());
            for (l, h) in self.lo.iter().zip(&self.hi) {
                let span = u64::from(h - l + 1);
                v.push(l + (i % span) as u32);
                i /= span;
            }
            v
        })
    }

    /// How many block points the domain has.
    pub fn block_count(&self) -> u64 {
        self.lo
            .iter()
            .zip(&self.hi)
            .map(|(l, h)| u64::from(h - l + 1))
            .fold(1u64, u64::saturating_mul)
    }
}

/// A function's kernels at some blocks.
pub struct AtBlocks {
    pub kernels: Vec<KernelAtBlocks>,
}

pub struct KernelAtBlocks {
    pub programs: f64,
    /// Per buffer read: requested bytes, distinct bytes, sharers adjacent in launch order.
    pub reads: Vec<(f64, f64, bool)>,
    pub store_bytes: f64,
    pub work: [f64; UNITS],
    pub smem_fixed: f64,
    pub smem_staged: f64,
    pub state_words: f64,
    pub largest_value: f64,
    pub rounds: f64,
}

fn dim_size(d: &DimBase, bindings: &BTreeMap<&str, u64>) -> f64 {
    match d {
        DimBase::Lit(n) => *n as f64,
        DimBase::Sym(s) => bindings.get(s.as_str()).copied().unwrap_or(1) as f64,
        // A collection's extent: tiles, not elements (one block each).
        DimBase::Extent(_) => 1.0,
    }
}

/// Building a kernel's terms.
struct Cx<'a, 'p> {
    plan: &'a KernelPlan<'p>,
    axes: &'a [String],
    bindings: &'a BTreeMap<&'a str, u64>,
    min_rows: u64,
}

impl Cx<'_, '_> {
    fn one(&self) -> Term {
        Term::constant(self.axes.len(), 1.0)
    }

    fn axis(&self, a: &str) -> Option<usize> {
        self.axes.iter().position(|x| x == a)
    }

    fn size(&self, d: &DimBase) -> f64 {
        dim_size(d, self.bindings)
    }

    /// The tiles of axis `a` (1 for an axis that splits nothing).
    fn tiles(&self, a: &str) -> Term {
        let mut t = self.one();
        if let Some(i) = self.axis(a) {
            t.pows[i].tiles += 1;
        }
        t
    }

    /// `t` times dimension `d`: its size, or for a collection's extent `|a|` the tiles of `a`
    /// (one slice per program of the kernel that stored it).
    fn extent_or_size(&self, d: &DimBase, t: Term) -> Term {
        match d {
            DimBase::Extent(a) => t.times(&self.tiles(a.as_str())),
            d => {
                let mut t = t;
                t.coeff *= self.size(d);
                t
            }
        }
    }

    /// Elements of one block of `t`: split dimensions at the block (clipped to the dimension
    /// for bytes), whole ones at their size (padded to a power of two, for work).
    fn block(&self, t: &TensorType, whole: &BTreeSet<String>, clipped: bool) -> Term {
        let mut term = self.one();
        for b in blocks(t, whole) {
            match b {
                Block::Split(a) => {
                    if let Some(i) = self.axis(&a) {
                        if clipped {
                            term.pows[i].clipped += 1;
                        } else {
                            term.pows[i].block += 1;
                        }
                    }
                }
                Block::One => {}
                // A whole collection extent: one slice per tile of its axis.
                Block::Whole(DimBase::Extent(a)) => term = term.times(&self.tiles(a.as_str())),
                Block::Whole(d) => {
                    let n = self.size(&d);
                    // The backend pads a whole dimension to a power of two (to 16 where a
                    // `tl.dot` multiplies along it: not counted here).
                    term.coeff *= if clipped {
                        n
                    } else {
                        (n.max(1.0) as u64).next_power_of_two() as f64
                    };
                }
            }
        }
        term
    }

    fn blocks_of(&self, ty: Option<&Type>, whole: &BTreeSet<String>) -> Vec<(Term, DType)> {
        field_types(ty)
            .map(|(fs, _)| {
                fs.iter()
                    .map(|t| (self.block(t, whole, false), t.dtype))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn kernel(&self, pk: &PlannedKernel) -> KernelModel {
        let p = self.plan;
        let body = &p.function.body;
        let whole = &pk.whole_axes;
        let grid: Vec<Option<usize>> = pk.grid_axes.iter().map(|a| self.axis(a)).collect();
        let programs = pk
            .grid_axes
            .iter()
            .fold(self.one(), |t, a| t.times(&self.tiles(a)));
        // Iterations of each loop, by the step that opens it.
        let skip_of = |i: usize| pk.skips.iter().position(|s| s.open == i);
        let mut work: [Vec<Term>; UNITS] = Default::default();
        let mut smem = Vec::new();
        let mut state_words = Vec::new();
        let mut values = Vec::new();
        let loaded: BTreeSet<NodeId> = pk.loads.iter().map(|l| l.node).collect();
        let stored: BTreeSet<NodeId> = pk.stores.iter().map(|s| s.node).collect();
        let mut open: Vec<(Term, Option<usize>)> = Vec::new();
        let mut recent: Vec<NodeId> = Vec::new();
        let context = |open: &[(Term, Option<usize>)], node: Option<NodeId>| -> Term {
            let mut t = programs.clone();
            for (iter, skip) in open {
                match skip {
                    Some(k) => {
                        let s = &pk.skips[*k];
                        let masked = node.is_some_and(|n| {
                            s.selects.iter().any(|(x, _)| *x == n) || s.mask_only.contains(&n)
                        });
                        t.skips.push((*k, masked));
                    }
                    None => t = t.times(iter),
                }
            }
            t
        };
        for (i, s) in pk.steps.iter().enumerate() {
            match s {
                Step::Value { node, level } => {
                    let within = level.map_or(0, |l| l + 1).min(open.len());
                    let ctx = context(&open[..within], Some(*node));
                    for (unit, w) in self.node_work(body, *node, whole) {
                        work[unit as usize].push(ctx.times(&w));
                    }
                    // A view in a chain is no value of its own: only the tile loaded
                    // through it, and computed values, are held.
                    let view = matches!(
                        body.node(*node).kind,
                        ExprKind::Input
                            | ExprKind::Param
                            | ExprKind::Partition(..)
                            | ExprKind::Replicate(..)
                            | ExprKind::Combination(..)
                            | ExprKind::Collection(..)
                            | ExprKind::Transpose(..)
                            | ExprKind::Reshape(..)
                            | ExprKind::Broadcast(..)
                            | ExprKind::Slice(..)
                            | ExprKind::Tuple(..)
                            | ExprKind::Get(..)
                    );
                    // A view stored as it is (a broadcast result) is materialised whole.
                    let stored_view = stored.contains(node)
                        && !matches!(
                            body.node(*node).kind,
                            ExprKind::Combination(..)
                                | ExprKind::Collection(..)
                                | ExprKind::Tuple(..)
                                | ExprKind::Get(..)
                        );
                    if !view || loaded.contains(node) || stored_view {
                        for (t, _) in self.blocks_of(body.ty(*node), whole) {
                            values.push(t);
                        }
                    }
                    for b in self.dot_operands(body, *node, whole).into_iter().flatten() {
                        smem.push((b, within > 0));
                    }
                }
                Step::FoldUpdate { fold } => {
                    let ctx = context(&open, None);
                    for (unit, w) in self.update_work(pk, *fold) {
                        work[unit as usize].push(ctx.times(&w));
                    }
                }
                Step::FoldInit { fold, .. } => {
                    recent.push(*fold);
                    for (t, _) in self.blocks_of(body.ty(*fold), whole) {
                        state_words.push(t);
                    }
                }
                Step::OpenLoop { axis } => {
                    recent.clear();
                    open.push((self.tiles(axis), skip_of(i)));
                }
                Step::OpenElementLoop => {
                    let stack = recent.iter().find_map(|f| {
                        pk.folds
                            .iter()
                            .find(|x| x.node == *f && x.kind == crate::lower::plan::FoldKind::Stack)
                            .and_then(|x| x.axis.clone())
                    });
                    let iter = match stack {
                        Some(a) => self.tiles(&a),
                        None => Term::constant(self.axes.len(), 16.0),
                    };
                    recent.clear();
                    open.push((iter, None));
                }
                Step::CloseLoop { .. } | Step::CloseElementLoop { .. } => {
                    open.pop();
                }
                Step::Store { .. } => {}
            }
        }
        // Loads, by buffer.
        let mut rounds = Vec::new();
        let mut reads: BTreeMap<(NodeId, usize), BufferRead> = BTreeMap::new();
        for l in &pk.loads {
            let Some(buf) = p.buffer(l.buffer) else {
                continue;
            };
            let of = l.node;
            let t = match field_types(body.ty(of)) {
                Ok((fs, _)) => fs.get(l.buffer.1).cloned(),
                Err(_) => None,
            };
            // A stack entry's tile, or a view's.
            let mut tile = match t {
                Some(t) if t.rank() == l.blocks.len() => self.block(&t, whole, true),
                _ => self.blocks_bytes(&l.blocks),
            };
            tile.coeff *= buf.dtype.size_bytes() as f64;
            let mut iters = self.one();
            for a in &l.per_iteration_of {
                match pk.skips.iter().position(|s| &s.axis == a) {
                    Some(k) => iters.skips.push((k, false)),
                    None => iters = iters.times(&self.tiles(a)),
                }
            }
            rounds.push(iters.clone());
            let per_program = tile.times(&iters);
            let requested = per_program.times(&programs);
            let distinct = pk
                .grid_axes
                .iter()
                .filter(|a| !l.shared_along.contains(a))
                .fold(per_program, |t, a| t.times(&self.tiles(a)));
            let shared = pk
                .grid_axes
                .iter()
                .enumerate()
                .filter(|(_, a)| l.shared_along.contains(a))
                .map(|(g, _)| g)
                .collect();
            let r = reads.entry(l.buffer).or_insert(BufferRead {
                requested: Vec::new(),
                distinct: Vec::new(),
                shared: Vec::new(),
            });
            r.requested.push(requested);
            r.distinct.push(distinct);
            r.shared.push(shared);
        }
        let mut store_bytes = Vec::new();
        for s in &pk.stores {
            for key in &s.buffers {
                if let Some(b) = p.buffer(*key) {
                    let bytes = b.shape.iter().fold(
                        Term::constant(self.axes.len(), b.dtype.size_bytes() as f64),
                        |t, d| self.extent_or_size(d, t),
                    );
                    store_bytes.push(bytes);
                }
            }
        }
        KernelModel {
            grid,
            reads: reads.into_values().collect(),
            store_bytes,
            work,
            smem,
            state_words,
            values,
            skip_count: pk.skips.len(),
            rounds,
        }
    }

    /// A tile described by its blocks alone (a load whose value's type has another rank).
    fn blocks_bytes(&self, bs: &[Block]) -> Term {
        let mut term = self.one();
        for b in bs {
            match b {
                Block::Split(a) => {
                    if let Some(i) = self.axis(a) {
                        term.pows[i].clipped += 1;
                    }
                }
                Block::One => {}
                Block::Whole(d) => term = self.extent_or_size(d, term),
            }
        }
        term
    }

    /// `tl.dot` operand tiles in bytes (f32 operands take 4 bytes, bf16/f16 2).
    fn dot_operands(&self, body: &Body, n: NodeId, whole: &BTreeSet<String>) -> Option<[Term; 2]> {
        let (a, b) = match &body.node(n).kind {
            ExprKind::MatMul { a, b, .. } | ExprKind::TileMatMul { a, b, .. } => (*a, *b),
            _ => return None,
        };
        let (Some(Type::Tensor(ta)), Some(Type::Tensor(tb))) = (body.ty(a), body.ty(b)) else {
            return None;
        };
        if !matches!(
            product_unit(ta, tb, whole),
            Unit::TensorBf16 | Unit::TensorTf32
        ) {
            return None;
        }
        let bytes = |t: &TensorType| if t.dtype == DType::F32 { 4.0 } else { 2.0 };
        let mut x = self.block(ta, whole, false);
        x.coeff *= bytes(ta);
        let mut y = self.block(tb, whole, false);
        y.coeff *= bytes(tb);
        Some([x, y])
    }

    /// One computation of a value on its blocks, by unit.
    fn node_work(&self, body: &Body, n: NodeId, whole: &BTreeSet<String>) -> Vec<(Unit, Term)> {
        let node = body.node(n);
        let ty = node.ty.as_ref().or(node.annot.as_ref());
        let out = || {
            self.blocks_of(ty, whole)
                .into_iter()
                .map(|(t, _)| t)
                .collect::<Vec<_>>()
        };
        let each = |unit: Unit, times: f64| -> Vec<(Unit, Term)> {
            out()
                .into_iter()
                .map(|mut t| {
                    t.coeff *= times;
                    (unit, t)
                })
                .collect()
        };
        match &node.kind {
            ExprKind::Unary(op, _) => match op {
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Square => each(Unit::Cuda, 1.0),
                _ => each(Unit::Sfu, 1.0),
            },
            ExprKind::Binary(BinaryOp::Pow, ..) => each(Unit::Sfu, 2.0),
            ExprKind::Binary(..) | ExprKind::Select(..) => each(Unit::Cuda, 1.0),
            ExprKind::MatMul { a, b, .. } | ExprKind::TileMatMul { a, b, .. } => {
                let (Some(Type::Tensor(ta)), Some(Type::Tensor(tb))) = (body.ty(*a), body.ty(*b))
                else {
                    return Vec::new();
                };
                let unit = product_unit(ta, tb, whole);
                let depth = match blocks(ta, whole).last() {
                    Some(Block::Split(x)) => {
                        let mut t = self.one();
                        if let Some(i) = self.axis(x) {
                            t.pows[i].block += 1;
                        }
                        t
                    }
                    Some(Block::Whole(d)) => Term::constant(
                        self.axes.len(),
                        (self.size(d).max(16.0) as u64).next_power_of_two() as f64,
                    ),
                    _ => self.one(),
                };
                // Tensor cores multiply at least `tensor_min_rows` rows at a time (Hopper's
                // wgmma: 64): fewer rows cost as many.
                let rows = blocks(ta, whole);
                let pad = match rows.get(rows.len().wrapping_sub(2)) {
                    Some(Block::Split(x)) if unit != Unit::Cuda => {
                        self.axis(x).map(|i| (i, self.min_rows as f64))
                    }
                    _ => None,
                };
                out()
                    .into_iter()
                    .map(|t| {
                        let mut w = t.times(&depth);
                        w.coeff *= 2.0;
                        w.pads.extend(pad);
                        (unit, w)
                    })
                    .collect()
            }
            ExprKind::Reduce {
                input,
                over: ReduceOver::Axis(_),
                ..
            } => self
                .blocks_of(body.ty(*input), whole)
                .into_iter()
                .map(|(t, _)| (Unit::Cuda, t))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// One update of a fold's state: its reducer's body on the blocks (one CUDA-core
    /// operation per element of the item for a built-in).
    fn update_work(&self, pk: &PlannedKernel, fold: NodeId) -> Vec<(Unit, Term)> {
        let whole = &pk.whole_axes;
        match fold_update(self.plan, fold) {
            Some(Update::Item(x)) => self
                .blocks_of(self.plan.function.body.ty(x), whole)
                .into_iter()
                .map(|(t, _)| (Unit::Cuda, t))
                .collect(),
            Some(Update::Body(typed)) => typed
                .ids()
                .flat_map(|n| self.node_work(&typed, n, whole))
                .collect(),
            None => Vec::new(),
        }
    }
}

/// The unit a product runs on: a block with one row, column or depth is no `tl.dot` (CUDA
/// cores); bf16/f16 operands of one dtype feed tensor cores at the bf16 rate, others at tf32.
pub fn product_unit(a: &TensorType, b: &TensorType, whole: &BTreeSet<String>) -> Unit {
    let (ba, bb) = (blocks(a, whole), blocks(b, whole));
    if ba.len() < 2 || bb.len() < 2 {
        return Unit::Cuda;
    }
    let one = |b: &Block| matches!(b, Block::One);
    if one(&ba[ba.len() - 2]) || one(&ba[ba.len() - 1]) || one(&bb[bb.len() - 1]) {
        return Unit::Cuda;
    }
    if a.dtype == b.dtype && matches!(a.dtype, DType::BF16 | DType::F16) {
        Unit::TensorBf16
    } else {
        Unit::TensorTf32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the limit some warps hold the values (registers a thread and an SM's registers
    /// for one block); one value more, none does.
    #[test]
    fn max_live_words_is_the_register_limit() {
        for dev in crate::rank::device::devices() {
            let fits = |words: f64| {
                NUM_WARPS.iter().any(|&w| {
                    registers(words, w, dev).is_some_and(|r| r * 32 * w <= dev.regs_per_sm)
                        && w <= dev.max_warps_per_sm
                })
            };
            let most = max_live_words(dev);
            assert!(most > 1024.0, "{}: {most}", dev.name);
            assert!(fits(most), "{}: {most}", dev.name);
            assert!(!fits(most + 1.0), "{}: {most}", dev.name);
        }
    }
}
