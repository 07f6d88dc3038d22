//! Traffic and work of a plan over the tiles its programs visit, at the `where` sizes and a
//! schedule's blocks: what the `# lower` line reports (docs/lower.md, "Traffic and work").
//!
//! - Bytes read and written are [`crate::lower::cost`]'s (every value a kernel reads counts
//!   once per kernel), except that a tensor a kernel loads only tile by tile in loops that
//!   skip masked tiles counts only the tiles some program visits.
//! - Work in a tiled kernel is counted per block at the schedule's block sizes: each value
//!   computed (elementwise: one per element; a product: 2·M·N·K; a block reduction: one per
//!   element reduced; a fold update: its reducer's body, or one per element for a built-in)
//!   times how often the program computes it (the iterations of the loops it lives in: a
//!   skipping loop's visited tiles, per program) and the number of programs. A tensor-level
//!   operator's kernel keeps [`crate::lower::cost`]'s count.

use super::{Env, LoopSkip};
use crate::ir::*;
use crate::lower::plan::{FoldKind, KernelPlan, PlannedKernel, Schedule};
use crate::lower::walk::{blocks, field_types, Block, Step};
use crate::lower::{kernel_cost, stack_of, Cost};
use crate::verify::typing::{reducer_body_types, TypeEnv};
use std::collections::{BTreeMap, BTreeSet};

/// Past this many programs (over the grid axes a mask reads), an even sample of them is
/// evaluated and scaled.
const MAX_PROGRAMS: u64 = 1 << 16;
/// Past this many visited tiles in all, the tiles are not enumerated: the tensors count whole.
const MAX_TILES: u64 = 1 << 22;

/// A plan's sizes and blocks under a schedule, and one program's grid coordinates.
pub struct PlanEnv<'p> {
    bindings: BTreeMap<String, u64>,
    dims: BTreeMap<String, DimBase>,
    schedule: &'p Schedule,
    pub coords: BTreeMap<String, i64>,
}

impl<'p> PlanEnv<'p> {
    pub fn new(plan: &KernelPlan, schedule: &'p Schedule) -> PlanEnv<'p> {
        PlanEnv {
            bindings: plan
                .function
                .bindings
                .iter()
                .map(|b| (b.name.clone(), b.value))
                .collect(),
            dims: plan.axis_dims(),
            schedule,
            coords: BTreeMap::new(),
        }
    }

    /// A dimension's size (an axis extent for `|a|`).
    pub fn size(&self, d: &DimBase) -> i64 {
        let n = match d {
            DimBase::Lit(n) => *n,
            DimBase::Sym(s) => self.bindings.get(s.as_str()).copied().unwrap_or(1),
            DimBase::Extent(a) => return self.tiles(a),
        };
        n.min(i64::MAX as u64) as i64
    }
}

impl Env for PlanEnv<'_> {
    fn coord(&self, axis: &str) -> i64 {
        self.coords.get(axis).copied().unwrap_or(0)
    }

    fn block(&self, axis: &str) -> i64 {
        self.schedule.block.get(axis).map_or(1, |b| *b as i64)
    }

    fn padded(&self, d: &DimBase) -> i64 {
        // The host pads to the next power of two, to 16 when a product needs it: the larger.
        let n = self.size(d).max(16) as u64;
        n.checked_next_power_of_two().unwrap_or(n) as i64
    }

    fn size(&self, d: &DimBase) -> i64 {
        PlanEnv::size(self, d)
    }

    fn tiles(&self, axis: &str) -> i64 {
        match self.dims.get(axis) {
            Some(d) if !matches!(d, DimBase::Extent(_)) => {
                let (n, b) = (self.size(d), self.block(axis).max(1));
                n.saturating_add(b - 1) / b
            }
            _ => 1,
        }
    }
}

/// Every program's coordinates along `axes` (an even sample past [`MAX_PROGRAMS`]), each
/// with the number of programs it stands for.
fn programs(env: &PlanEnv, axes: &[String]) -> Vec<(BTreeMap<String, i64>, f64)> {
    let extents: Vec<i64> = axes.iter().map(|a| env.tiles(a).max(1)).collect();
    let total: u64 = extents
        .iter()
        .fold(1u64, |t, e| t.saturating_mul(*e as u64));
    let stride = total.div_ceil(MAX_PROGRAMS).max(1);
    let mut out = Vec::new();
    let mut i = 0u64;
    while i < total {
        let mut rest = i;
        let mut coords = BTreeMap::new();
        for (a, e) in axes.iter().zip(&extents) {
            coords.insert(a.clone(), (rest % *e as u64) as i64);
            rest /= *e as u64;
        }
        out.push((coords, stride.min(total - i) as f64));
        i += stride;
    }
    out
}

/// Traffic and work of a plan at its `where` sizes and default schedule, over the tiles its
/// programs visit.
pub fn plan_cost(p: &KernelPlan) -> Cost {
    let schedule = Schedule::of(p);
    let mut c = Cost {
        kernels: p.kernels.len(),
        ..Cost::default()
    };
    for pk in &p.kernels {
        let kc = kernel_cost(p.function, &p.graph, &pk.kernel);
        let mut env = PlanEnv::new(p, &schedule);
        let read = kc.bytes_read.saturating_sub(skipped_bytes(p, pk, &mut env));
        let flops = if pk.kernel.default_tiled {
            kc.flops
        } else {
            tiled_work(p, pk, &mut env)
        };
        c.bytes_read = c.bytes_read.saturating_add(read);
        c.bytes_written = c.bytes_written.saturating_add(kc.bytes_written);
        c.flops = c.flops.saturating_add(flops);
    }
    c
}

/// The grid axes the kernel's skipping loops read, and how many programs the others make.
fn mask_axes(pk: &PlannedKernel, env: &PlanEnv) -> (Vec<String>, f64) {
    let read: BTreeSet<String> = pk.skips.iter().flat_map(|s| s.visits.coords()).collect();
    let axes: Vec<String> = pk
        .grid_axes
        .iter()
        .filter(|a| read.contains(*a))
        .cloned()
        .collect();
    let others = pk
        .grid_axes
        .iter()
        .filter(|a| !read.contains(*a))
        .map(|a| env.tiles(a).max(1) as f64)
        .product();
    (axes, others)
}

/// Bytes of the tensors the kernel loads only in skipping loops, in the tiles no program
/// visits. A tile of such a tensor is named by its key tile and by the program's tile along
/// each grid axis the mask reads that splits it; along other dimensions every tile is read.
fn skipped_bytes(p: &KernelPlan, pk: &PlannedKernel, env: &mut PlanEnv) -> u64 {
    if pk.skips.is_empty() {
        return 0;
    }
    let (axes, _) = mask_axes(pk, env);
    let progs = programs(env, &axes);
    let mut saved = 0u64;
    // A sample of the programs would miss the tiles only the others visit.
    if progs.iter().any(|(_, w)| *w > 1.0) {
        return saved;
    }
    let skipped_axes: BTreeSet<&str> = pk.skips.iter().map(|s| s.axis.as_str()).collect();
    for axis in skipped_axes {
        // Every loop over the axis skips, else the tensor is read whole there.
        let loops = pk
            .steps
            .iter()
            .filter(|s| matches!(s, Step::OpenLoop { axis: a } if a == axis))
            .count();
        let skips: Vec<&LoopSkip> = pk.skips.iter().filter(|s| s.axis == axis).collect();
        if loops != skips.len() {
            continue;
        }
        // The key tiles each program visits.
        let mut visits: Vec<(BTreeMap<String, i64>, BTreeSet<i64>)> = Vec::new();
        let mut enumerated = 0u64;
        for (coords, _) in &progs {
            env.coords = coords.clone();
            enumerated = skips
                .iter()
                .fold(enumerated, |t, s| t.saturating_add(s.visits.count(env)));
            if enumerated > MAX_TILES {
                return saved;
            }
            let mut tiles = BTreeSet::new();
            for s in &skips {
                for (lo, hi, _) in s.visits.eval(env) {
                    tiles.extend(lo.max(0)..hi.min(env.tiles(axis)));
                }
            }
            visits.push((coords.clone(), tiles));
        }
        let buffers: BTreeSet<_> = pk
            .loads
            .iter()
            .filter(|l| l.per_iteration_of.iter().any(|a| a == axis))
            .map(|l| l.buffer)
            .collect();
        for key in buffers {
            let loads: Vec<_> = pk.loads.iter().filter(|l| l.buffer == key).collect();
            let in_loop = loads
                .iter()
                .all(|l| l.per_iteration_of.iter().any(|a| a == axis));
            // One blocking for all its loads, the key dimension split once.
            let blocking = &loads[0].blocks;
            let key_dims = blocking
                .iter()
                .filter(|b| **b == Block::Split(axis.to_string()))
                .count();
            if !in_loop || key_dims != 1 || loads.iter().any(|l| &l.blocks != blocking) {
                continue;
            }
            let Some(buf) = p.buffer(key) else { continue };
            if buf.shape.len() != blocking.len() {
                continue;
            }
            // The elements of one tile along a dimension split by `a` at coordinate `c`.
            let clipped = |d: &DimBase, a: &str, c: i64| {
                let (n, b) = (env.size(d), env.block(a).max(1));
                (n.min((c + 1) * b) - c * b).max(0) as u64
            };
            let mut distinct: BTreeSet<(Vec<i64>, i64)> = BTreeSet::new();
            for (coords, tiles) in &visits {
                let named: Vec<i64> = blocking
                    .iter()
                    .filter_map(|b| match b {
                        Block::Split(a) if coords.contains_key(a) => Some(coords[a]),
                        _ => None,
                    })
                    .collect();
                for j in tiles {
                    distinct.insert((named.clone(), *j));
                }
            }
            let mut kept = 0u64;
            for (named, j) in &distinct {
                let mut named = named.iter();
                let mut elements = 1u64;
                for (b, d) in blocking.iter().zip(&buf.shape) {
                    let n = match b {
                        Block::Split(a) if a == axis => clipped(d, a, *j),
                        Block::Split(a) if axes.contains(a) => {
                            clipped(d, a, named.next().copied().unwrap_or(0))
                        }
                        _ => env.size(d).max(0) as u64,
                    };
                    elements = elements.saturating_mul(n);
                }
                kept = kept.saturating_add(elements.saturating_mul(buf.dtype.size_bytes()));
            }
            let bytes = buf
                .shape
                .iter()
                .fold(1u64, |t, d| t.saturating_mul(env.size(d).max(0) as u64))
                .saturating_mul(buf.dtype.size_bytes());
            saved = saved.saturating_add(bytes.saturating_sub(kept));
        }
    }
    saved
}

/// How a loop open around a step iterates.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Iter {
    /// A constant number of times per program.
    Times(f64),
    /// The tiles the skipping loop `pk.skips[i]` visits in each program.
    Skip(usize),
    /// Those of its tiles that may be partly masked: where its selects and the values only
    /// their conditions read are computed.
    SkipMasked(usize),
}

/// Elements of a block of type `t`: split dimensions at the schedule's block, whole ones at
/// their size.
fn block_elements(t: &TensorType, whole: &BTreeSet<String>, env: &PlanEnv) -> f64 {
    blocks(t, whole)
        .iter()
        .map(|b| match b {
            Block::Split(a) => env.block(a) as f64,
            Block::One => 1.0,
            Block::Whole(d) => env.size(d) as f64,
        })
        .product()
}

fn type_elements(t: Option<&Type>, whole: &BTreeSet<String>, env: &PlanEnv) -> f64 {
    field_types(t)
        .map(|(fs, _)| fs.iter().map(|t| block_elements(t, whole, env)).sum())
        .unwrap_or(0.0)
}

/// One computation of a value on its blocks.
fn node_work(body: &Body, n: NodeId, whole: &BTreeSet<String>, env: &PlanEnv) -> f64 {
    let node = body.node(n);
    let out = || type_elements(node.ty.as_ref().or(node.annot.as_ref()), whole, env);
    match &node.kind {
        ExprKind::Unary(..) | ExprKind::Binary(..) | ExprKind::Select(..) => out(),
        ExprKind::MatMul { a, .. } | ExprKind::TileMatMul { a, .. } => {
            let depth = match body.ty(*a) {
                Some(Type::Tensor(t)) => blocks(t, whole).last().map_or(1.0, |b| match b {
                    Block::Split(x) => env.block(x) as f64,
                    Block::One => 1.0,
                    Block::Whole(d) => env.size(d) as f64,
                }),
                _ => 1.0,
            };
            2.0 * out() * depth
        }
        ExprKind::Reduce {
            input,
            over: ReduceOver::Axis(_),
            ..
        } => type_elements(body.ty(*input), whole, env),
        _ => 0.0,
    }
}

/// What one update of a fold's state computes.
pub enum Update {
    /// A built-in reducer takes this item: one operation per element.
    Item(NodeId),
    /// A user reducer's body, typed at the fold's items.
    Body(Body),
}

/// What one update of fold `fold` computes, or `None` where it is no fold or its reducer's
/// body does not type at the fold's items.
pub fn fold_update(p: &KernelPlan, fold: NodeId) -> Option<Update> {
    let body = &p.function.body;
    let ExprKind::Reduce {
        input,
        over,
        reducer,
        ..
    } = &body.node(fold).kind
    else {
        return None;
    };
    match reducer {
        ReducerRef::Builtin(_) => Some(Update::Item(
            match &body.node(stack_of(body, *input)).kind {
                ExprKind::Collection(_, x) => *x,
                _ => *input,
            },
        )),
        ReducerRef::User(r) => {
            let (def, t) = (p.info.reducer(r)?, body.ty(*input)?);
            let tenv = TypeEnv::new(p.info.reducers());
            let types = reducer_body_types(def, t, over, &tenv).ok()?;
            let mut typed = def.body.clone();
            for (n, t) in typed.nodes.iter_mut().zip(types) {
                n.ty = Some(t);
            }
            Some(Update::Body(typed))
        }
    }
}

/// One update of a fold's state: its reducer's body on the blocks (one per element of the
/// item for a built-in).
fn update_work(p: &KernelPlan, pk: &PlannedKernel, fold: NodeId, env: &PlanEnv) -> f64 {
    let whole = &pk.whole_axes;
    match fold_update(p, fold) {
        Some(Update::Item(x)) => type_elements(p.function.body.ty(x), whole, env),
        Some(Update::Body(typed)) => typed.ids().map(|n| node_work(&typed, n, whole, env)).sum(),
        None => 0.0,
    }
}

/// Work of a tiled kernel: each step's work times the iterations of its loops, summed over
/// programs.
fn tiled_work(p: &KernelPlan, pk: &PlannedKernel, env: &mut PlanEnv) -> u64 {
    let body = &p.function.body;
    // Work per loop context (how the loops open around it iterate, outermost first).
    let mut work: Vec<(Vec<Iter>, f64)> = Vec::new();
    let mut open: Vec<Iter> = Vec::new();
    let mut recent: Vec<NodeId> = Vec::new();
    let add = |work: &mut Vec<(Vec<Iter>, f64)>, ctx: &[Iter], w: f64| match work
        .iter_mut()
        .find(|(c, _)| c == ctx)
    {
        Some((_, total)) => *total += w,
        None => work.push((ctx.to_vec(), w)),
    };
    for (i, s) in pk.steps.iter().enumerate() {
        match s {
            Step::Value { node, level } => {
                let within = level.map_or(0, |l| l + 1).min(open.len());
                let w = node_work(body, *node, &pk.whole_axes, env);
                let mut ctx = open[..within].to_vec();
                for it in ctx.iter_mut() {
                    if let Iter::Skip(k) = *it {
                        let s = &pk.skips[k];
                        if s.selects.iter().any(|(x, _)| x == node) || s.mask_only.contains(node) {
                            *it = Iter::SkipMasked(k);
                        }
                    }
                }
                add(&mut work, &ctx, w);
            }
            Step::FoldUpdate { fold } => {
                let w = update_work(p, pk, *fold, env);
                add(&mut work, &open, w);
            }
            Step::FoldInit { fold, .. } => recent.push(*fold),
            Step::OpenLoop { axis } => {
                recent.clear();
                open.push(match pk.skips.iter().position(|s| s.open == i) {
                    Some(k) => Iter::Skip(k),
                    None => Iter::Times(env.tiles(axis) as f64),
                });
            }
            Step::OpenElementLoop => {
                // A stored stack's entries, or a block's elements (at the default block).
                let stack = recent.iter().find_map(|f| {
                    pk.folds
                        .iter()
                        .find(|x| x.node == *f && x.kind == FoldKind::Stack)
                        .and_then(|x| x.axis.clone())
                });
                let times = match stack {
                    Some(a) => env.tiles(&a) as f64,
                    None => 16.0,
                };
                recent.clear();
                open.push(Iter::Times(times));
            }
            Step::CloseLoop { .. } | Step::CloseElementLoop { .. } => {
                open.pop();
            }
            Step::Store { .. } => {}
        }
    }
    let (axes, others) = mask_axes(pk, env);
    let progs = programs(env, &axes);
    let mut total = 0.0f64;
    for (coords, weight) in progs {
        env.coords = coords;
        let counts: Vec<(f64, f64)> = pk
            .skips
            .iter()
            .map(|s| {
                (
                    s.visits.count(env) as f64,
                    s.visits.masked_count(env) as f64,
                )
            })
            .collect();
        for (ctx, w) in &work {
            let times: f64 = ctx
                .iter()
                .map(|it| match it {
                    Iter::Times(t) => *t,
                    Iter::Skip(i) => counts.get(*i).map_or(0.0, |c| c.0),
                    Iter::SkipMasked(i) => counts.get(*i).map_or(0.0, |c| c.1),
                })
                .product();
            total += w * times * weight;
        }
    }
    let total = total * others;
    if total >= u64::MAX as f64 {
        u64::MAX
    } else {
        total as u64
    }
}

/// Per skipping loop of `pk` (in `pk.skips` order): the tiles one program visits and, of
/// them, those that may be partly masked, averaged over the programs (a sample past
/// [`MAX_PROGRAMS`]) at `schedule`'s blocks. For the rank model.
pub fn skip_visits(p: &KernelPlan, pk: &PlannedKernel, schedule: &Schedule) -> Vec<(f64, f64)> {
    let mut env = PlanEnv::new(p, schedule);
    let (axes, _) = mask_axes(pk, &env);
    let progs = programs(&env, &axes);
    let mut sums = vec![(0.0f64, 0.0f64); pk.skips.len()];
    let mut weight = 0.0f64;
    for (coords, w) in progs {
        env.coords = coords;
        for (s, sum) in pk.skips.iter().zip(sums.iter_mut()) {
            sum.0 += s.visits.count(&env) as f64 * w;
            sum.1 += s.visits.masked_count(&env) as f64 * w;
        }
        weight += w;
    }
    let weight = weight.max(1.0);
    sums.into_iter()
        .map(|(v, m)| (v / weight, m / weight))
        .collect()
}
