//! The kernel plan: every decision about how a verified candidate runs on a GPU, made once,
//! before any code is written.
//!
//! [`plan`] partitions the function into kernels (their launch order), gives every stored
//! tensor a buffer (inputs, results, intermediates, with shapes and dtypes), decides per
//! kernel its grid, loop and whole axes, its folds and their kind, its loads and stores and
//! the order and loop in which it computes each value ([`Step`]s, see [`super::walk`]), and
//! names the schedule parameters it leaves open (a block size per split axis, `num_warps`,
//! `num_stages`) with their legal ranges. What cannot be lowered is refused here, with the
//! node and the reason, so a candidate the plan accepts is one the backend can write.
//!
//! For the cost model, each kernel lists which tiles a program loads and how often (once, or
//! once per iteration of the loops around the load), along which grid axes several programs
//! read the same tile, and which values every program recomputes.

use super::mask::LoopSkip;
use super::walk::{self, field_types, varies_along, Block, Step, Walk};
use super::{kernel_graph, store_axes, tiled, Kernel, KernelGraph};
use crate::ir::*;
use crate::verify::ModuleInfo;
use std::collections::{BTreeMap, BTreeSet};

/// A stored tensor: a node and, for a tuple-valued node, the field (0 for a tensor).
pub type BufferKey = (NodeId, usize);

/// Why a function cannot be lowered: the construct, at the node that has it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{reason}")]
pub struct Refusal {
    pub node: NodeId,
    pub reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferRole {
    /// The function's input at this position.
    Input(usize),
    /// The function's result at this position.
    Result(usize),
    /// Written by one kernel, read by later ones.
    Intermediate,
}

#[derive(Clone, Debug)]
pub struct Buffer {
    pub key: BufferKey,
    pub role: BufferRole,
    pub shape: Vec<DimBase>,
    pub dtype: DType,
    /// The kernel that writes it (`None` for an input).
    pub writer: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldKind {
    /// `reduce … parallel=a`: a loop over the tiles of `a` with loop-carried state.
    Loop,
    /// `reduce (collection[a](x)) axis=0`: the same loop, instead of a stored stack.
    Collection,
    /// A user reducer that is no product of built-ins over a block dimension: a loop over
    /// its elements, one at a time.
    Sequential,
    /// The same over the entries of a stack another kernel stored: a loop over its axis.
    Stack,
    /// A built-in reducer (or a product of them) over a block dimension: `tl.sum` and kin.
    Block,
}

#[derive(Clone, Debug)]
pub struct Fold {
    pub node: NodeId,
    pub kind: FoldKind,
    /// The parallel axis it loops over (`Loop`, `Collection`, `Stack`).
    pub axis: Option<String>,
}

/// A tile a program reads from global memory.
#[derive(Clone, Debug)]
pub struct Load {
    /// The view (or tensor-level value read whole) that loads it.
    pub node: NodeId,
    pub buffer: BufferKey,
    /// How each dimension of the tile is blocked.
    pub blocks: Vec<Block>,
    /// The loops the load sits in: a program loads one tile per iteration of each.
    pub per_iteration_of: Vec<String>,
    /// Grid axes along which the tile is the same: that many programs read it.
    pub shared_along: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Store {
    pub node: NodeId,
    /// One buffer per field.
    pub buffers: Vec<BufferKey>,
    /// The axes it is written along (`combination`s, a `collection`).
    pub axes: Vec<String>,
    /// The loop it is stored in, tile by tile (`None`: once per program).
    pub in_loop: Option<String>,
}

/// A value every program computes although it does not vary along some grid axes.
#[derive(Clone, Debug)]
pub struct Recomputed {
    pub node: NodeId,
    pub along: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct PlannedKernel {
    pub kernel: Kernel,
    /// Grid axes: one program per tile coordinate (axes combined whole excluded).
    pub grid_axes: Vec<String>,
    pub loop_axes: Vec<String>,
    /// Axes the kernel combines inside itself: one block spans their dimension.
    pub whole_axes: BTreeSet<String>,
    pub folds: Vec<Fold>,
    pub loads: Vec<Load>,
    pub stores: Vec<Store>,
    /// Stored tensors it reads, in first-read order.
    pub reads: Vec<BufferKey>,
    pub recomputed: Vec<Recomputed>,
    /// What it computes, in order, and in which loop.
    pub steps: Vec<Step>,
    /// The fold loops that visit only the key tiles their mask may keep (see
    /// [`super::mask`]): the loads in them are read once per *visited* iteration.
    pub skips: Vec<LoopSkip>,
}

/// A parallel axis the function names.
#[derive(Clone, Debug)]
pub struct PlannedAxis {
    pub name: String,
    /// The dimension it splits (its block size is a schedule parameter), if any.
    pub splits: Option<DimBase>,
}

/// A schedule parameter's legal values: powers of two in `min..=max`, or the listed ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Range {
    PowersOfTwo { min: u64, max: u64 },
    OneOf(Vec<u64>),
}

/// The parameters a plan leaves open.
#[derive(Clone, Debug)]
pub struct ScheduleSpace {
    /// One block size per axis that splits a dimension.
    pub block: Vec<(String, Range)>,
    pub num_warps: Range,
    pub num_stages: Range,
}

/// One point of a [`ScheduleSpace`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub block: BTreeMap<String, u64>,
    pub num_warps: u64,
    pub num_stages: u64,
    /// Warps and stages of single kernels (by launch index) where they differ (`tune`);
    /// block sizes are the function's, as they shape the buffers kernels share.
    pub kernels: BTreeMap<usize, (u64, u64)>,
}

/// A per-kernel schedule entry `k<i>_num_warps` / `k<i>_num_stages`: (i, the parameter).
pub fn per_kernel_entry(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix('k')?;
    let (i, param) = rest.split_once('_')?;
    let i: usize = i.parse().ok()?;
    matches!(param, "num_warps" | "num_stages").then_some((i, param))
}

/// Block sizes past this make a tile of more elements than Triton allows per block in two
/// dimensions (2^20), and no GPU has registers for them.
const MAX_BLOCK: u64 = 1024;
/// `tl.dot` needs 16 rows, columns and depth.
pub(crate) const MIN_BLOCK: u64 = 16;

impl Schedule {
    /// The schedule a host function uses unless told otherwise: blocks of 16, four warps,
    /// two pipeline stages.
    pub fn default_for(plan: &KernelPlan) -> Schedule {
        Schedule {
            block: plan
                .axes
                .iter()
                .filter(|a| a.splits.is_some())
                .map(|a| (a.name.clone(), MIN_BLOCK))
                .collect(),
            num_warps: 4,
            num_stages: 2,
            kernels: BTreeMap::new(),
        }
    }
}

impl Schedule {
    /// The function's own `schedule(…)` (what `rank` chose) over [`Schedule::default_for`]:
    /// what `lower` emits.
    pub fn of(plan: &KernelPlan) -> Schedule {
        let mut s = Schedule::default_for(plan);
        let mut own: BTreeMap<usize, (Option<u64>, Option<u64>)> = BTreeMap::new();
        for e in plan.function.schedule.iter().flatten() {
            if let Some((k, param)) = per_kernel_entry(&e.name) {
                let slot = own.entry(k).or_default();
                if param == "num_warps" {
                    slot.0 = Some(e.value);
                } else {
                    slot.1 = Some(e.value);
                }
                continue;
            }
            match e.name.as_str() {
                "num_warps" => s.num_warps = e.value,
                "num_stages" => s.num_stages = e.value,
                a => {
                    if let Some(b) = s.block.get_mut(a) {
                        *b = e.value;
                    }
                }
            }
        }
        for (k, (w, st)) in own {
            if k < plan.kernels.len() {
                s.kernels
                    .insert(k, (w.unwrap_or(s.num_warps), st.unwrap_or(s.num_stages)));
            }
        }
        s
    }

    /// As a function's `schedule(…)`: block sizes by axis, then `num_warps`, `num_stages`.
    pub fn entries(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self.block.iter().map(|(a, b)| (a.clone(), *b)).collect();
        v.push(("num_warps".into(), self.num_warps));
        v.push(("num_stages".into(), self.num_stages));
        for (k, (w, s)) in &self.kernels {
            v.push((format!("k{k}_num_warps"), *w));
            v.push((format!("k{k}_num_stages"), *s));
        }
        v
    }
}

/// The plan of one function.
#[derive(Clone, Debug)]
pub struct KernelPlan<'a> {
    pub function: &'a Function,
    pub info: &'a ModuleInfo,
    pub graph: KernelGraph,
    /// In launch order.
    pub kernels: Vec<PlannedKernel>,
    /// Inputs first, then each kernel's outputs in launch order, a buffer per field.
    pub buffers: Vec<Buffer>,
    /// Every parallel axis the function names, by name.
    pub axes: Vec<PlannedAxis>,
    pub space: ScheduleSpace,
}

impl KernelPlan<'_> {
    pub fn buffer(&self, key: BufferKey) -> Option<&Buffer> {
        self.buffers.iter().find(|b| b.key == key)
    }

    /// The dimension each axis splits.
    pub fn axis_dims(&self) -> BTreeMap<String, DimBase> {
        self.axes
            .iter()
            .filter_map(|a| a.splits.clone().map(|d| (a.name.clone(), d)))
            .collect()
    }
}

/// Plans a verified function, or says what in it cannot be lowered.
pub fn plan<'a>(info: &'a ModuleInfo, f: &'a Function) -> Result<KernelPlan<'a>, Refusal> {
    // What no context lowers (`lowerable`), before anything is derived from it.
    let (_, constant) = super::loads_and_constants(&f.body);
    if let Some((node, reason)) = super::lowerable::function_refusal(info, f, &constant) {
        return Err(Refusal { node, reason });
    }
    let graph = kernel_graph(f);
    if !graph.launch_order {
        return Err(Refusal {
            node: f.body.results.first().copied().unwrap_or(NodeId(0)),
            reason: "no launch order: a kernel reads a value it writes itself".into(),
        });
    }
    let body = &f.body;
    let mut buffers = Vec::new();
    for (i, p) in body.params.iter().enumerate() {
        if let Some(Type::Tensor(t)) = body.ty(*p) {
            buffers.push(Buffer {
                key: (*p, 0),
                role: BufferRole::Input(i),
                shape: t.shape.iter().map(|d| d.base.clone()).collect(),
                dtype: t.dtype,
                writer: None,
            });
        }
    }
    let mut keys: BTreeSet<BufferKey> = body.params.iter().map(|p| (*p, 0)).collect();
    let axes = planned_axes(f);
    let mut kernels = Vec::new();
    for (ki, k) in graph.kernels.iter().enumerate() {
        for o in &k.outputs {
            if keys.contains(&(*o, 0)) {
                continue;
            }
            let (fields, _) = field_types(body.ty(*o)).map_err(|m| Refusal {
                node: *o,
                reason: format!("a stored value: {m}"),
            })?;
            let role = match body.results.iter().position(|r| r == o) {
                Some(p) => BufferRole::Result(p),
                None => BufferRole::Intermediate,
            };
            for (i, t) in fields.into_iter().enumerate() {
                keys.insert((*o, i));
                buffers.push(Buffer {
                    key: (*o, i),
                    role,
                    shape: t.shape.iter().map(|d| d.base.clone()).collect(),
                    dtype: t.dtype,
                    writer: Some(ki),
                });
            }
        }
        let whole = whole_axes(f, k)?;
        let walked = Walk::new(f, info, &graph, k, &whole, &keys).run()?;
        kernels.push(planned_kernel(f, info, &graph, k, whole, walked));
    }
    let dot_axes = dot_axes(f);
    let space = ScheduleSpace {
        block: axes
            .iter()
            .filter_map(|a| {
                let d = a.splits.as_ref()?;
                let size = match d {
                    DimBase::Lit(n) => Some(*n),
                    DimBase::Sym(s) => f
                        .bindings
                        .iter()
                        .find(|b| b.name == s.as_str())
                        .map(|b| b.value),
                    DimBase::Extent(_) => None,
                };
                // `tl.dot` needs 16 rows, columns and depth; other blocks may be one row.
                let min = if dot_axes.contains(&a.name) {
                    MIN_BLOCK
                } else {
                    1
                };
                // A size past 2^63 has no next power of two: it is past MAX_BLOCK anyway.
                let max = size
                    .and_then(|n| n.max(1).checked_next_power_of_two())
                    .unwrap_or(MAX_BLOCK)
                    .clamp(min, MAX_BLOCK);
                Some((a.name.clone(), Range::PowersOfTwo { min, max }))
            })
            .collect(),
        num_warps: Range::OneOf(vec![1, 2, 4, 8, 16]),
        num_stages: Range::OneOf(vec![1, 2, 3, 4, 5]),
    };
    Ok(KernelPlan {
        function: f,
        info,
        graph,
        kernels,
        buffers,
        axes,
        space,
    })
}

/// Axes that split a dimension some matrix product multiplies along or produces (rows and
/// columns of either operand): `tl.dot` needs blocks of at least 16 there.
fn dot_axes(f: &Function) -> BTreeSet<String> {
    let body = &f.body;
    let mut axes = BTreeSet::new();
    for n in &body.nodes {
        let (a, b) = match &n.kind {
            ExprKind::MatMul { a, b, .. } | ExprKind::TileMatMul { a, b, .. } => (*a, *b),
            _ => continue,
        };
        for x in [a, b] {
            if let Some(Type::Tensor(t)) = body.ty(x) {
                let bs = walk::blocks(t, &BTreeSet::new());
                for b in bs.iter().skip(bs.len().saturating_sub(2)) {
                    if let Block::Split(a) = b {
                        axes.insert(a.clone());
                    }
                }
            }
        }
    }
    axes
}

/// The kernel's folds, loads, stores and recomputed values, from its walk.
fn planned_kernel(
    f: &Function,
    info: &ModuleInfo,
    g: &KernelGraph,
    k: &Kernel,
    whole: BTreeSet<String>,
    walked: walk::Walked,
) -> PlannedKernel {
    let body = &f.body;
    let grid_axes: Vec<String> = k
        .grid_axes
        .iter()
        .filter(|a| !whole.contains(*a))
        .cloned()
        .collect();
    // The loops open at each step, to place loads and stores.
    let mut open: Vec<String> = Vec::new();
    let mut loops_at: Vec<(NodeId, Vec<String>)> = Vec::new();
    let mut stores = Vec::new();
    let mut folds = walked.folds.clone();
    for s in &walked.steps {
        match s {
            Step::OpenLoop { axis } => open.push(axis.clone()),
            Step::OpenElementLoop => open.push(String::new()),
            Step::CloseLoop { .. } | Step::CloseElementLoop { .. } => {
                open.pop();
            }
            Step::Value { node, level } => {
                let within = level.map_or(0, |l| l + 1);
                loops_at.push((*node, open[..within.min(open.len())].to_vec()));
            }
            Step::Store { output, level } => {
                let fields = field_types(body.ty(*output)).map_or(1, |(fs, _)| fs.len());
                stores.push(Store {
                    node: *output,
                    buffers: (0..fields).map(|i| (*output, i)).collect(),
                    axes: store_axes(body, *output),
                    in_loop: level.and_then(|l| open.get(l).cloned()),
                });
            }
            Step::FoldInit { .. } | Step::FoldUpdate { .. } => {}
        }
    }
    // Folds over a block dimension are values, not loops.
    for (n, _) in &loops_at {
        if let ExprKind::Reduce {
            over: ReduceOver::Axis(_),
            reducer,
            ..
        } = &body.node(*n).kind
        {
            let by_blocks = match reducer {
                ReducerRef::Builtin(_) => true,
                ReducerRef::User(r) => info.reducer(r).is_some_and(|d| d.as_product().is_some()),
            };
            if by_blocks && !folds.iter().any(|x: &Fold| x.node == *n) {
                folds.push(Fold {
                    node: *n,
                    kind: FoldKind::Block,
                    axis: None,
                });
            }
        }
    }
    let shared = |t: &TensorType| -> Vec<String> {
        let t = Type::Tensor(t.clone());
        grid_axes
            .iter()
            .filter(|a| !varies_along(Some(&t), a))
            .cloned()
            .collect()
    };
    let mut loads = Vec::new();
    for l in &walked.loads {
        // The tile's type: the view's (or the value's, read whole), or a stack entry's.
        let of = if l.stack_entry { l.buffer.0 } else { l.node };
        let fields = field_types(body.ty(of))
            .map(|(fs, _)| fs)
            .unwrap_or_default();
        let Some(t) = fields.get(l.buffer.1) else {
            continue;
        };
        loads.push(Load {
            node: l.node,
            buffer: l.buffer,
            blocks: walk::blocks(t, &whole),
            per_iteration_of: l.loops.clone().unwrap_or_default(),
            shared_along: shared(t),
        });
    }
    let loaded: BTreeSet<NodeId> = walked.loads.iter().map(|l| l.node).collect();
    let mut recomputed = Vec::new();
    for (n, _) in &loops_at {
        let Some(Type::Tensor(t)) = body.ty(*n) else {
            continue;
        };
        let along = shared(t);
        if !along.is_empty() && !loaded.contains(n) && !g.constant[n.index()] {
            recomputed.push(Recomputed { node: *n, along });
        }
    }
    let grid_axes = launch_order(grid_axes, &loads);
    let skips = super::mask::plan_skips(&super::mask::KernelCx {
        f,
        info,
        g,
        whole: &whole,
        grid: &grid_axes,
        outputs: &k.outputs,
        steps: &walked.steps,
        folds: &folds,
    });
    PlannedKernel {
        kernel: k.clone(),
        grid_axes,
        loop_axes: k.loop_axes.clone(),
        whole_axes: whole,
        folds,
        loads,
        stores,
        reads: walked.reads,
        recomputed,
        steps: walked.steps,
        skips,
    }
}

/// The grid axes in launch order: the flattened program id varies fastest along the axes
/// whose programs share the most loaded tiles (a tile loaded in a loop counts a thousand
/// times one loaded once), so that programs reading the same tiles run together and find
/// them in L2 (a K/V tile every query block of a head reads). Ties keep the given order.
fn launch_order(mut grid: Vec<String>, loads: &[Load]) -> Vec<String> {
    let mut weight: BTreeMap<&str, u64> = BTreeMap::new();
    for l in loads {
        let w = if l.per_iteration_of.is_empty() {
            1
        } else {
            1000
        };
        for a in &l.shared_along {
            *weight.entry(a.as_str()).or_default() += w;
        }
    }
    let key = |a: &String| std::cmp::Reverse(weight.get(a.as_str()).copied().unwrap_or(0));
    grid.sort_by_key(key);
    grid
}

/// Every parallel axis the function names (views, stores, folds, collection extents), with
/// the dimension the first view along it splits.
fn planned_axes(f: &Function) -> Vec<PlannedAxis> {
    let mut names = BTreeSet::new();
    let mut splits: BTreeMap<String, DimBase> = BTreeMap::new();
    for n in &f.body.nodes {
        let mut stack: Vec<&Type> = n.ty.iter().collect();
        while let Some(t) = stack.pop() {
            match t {
                Type::Tensor(t) => {
                    names.extend(t.par.axes().map(|a| a.to_string()));
                    for d in &t.shape {
                        if let DimBase::Extent(a) = &d.base {
                            names.insert(a.to_string());
                        }
                    }
                }
                Type::Tuple(ts) => stack.extend(ts),
            }
        }
        match &n.kind {
            ExprKind::Reduce {
                over: ReduceOver::Parallel(a),
                ..
            } => {
                names.insert(a.to_string());
            }
            ExprKind::Partition(d, a, x) => {
                if let Some(Type::Tensor(t)) = f.body.ty(*x) {
                    if let Ok(i) = resolve_dim(&t.shape, d) {
                        splits
                            .entry(a.to_string())
                            .or_insert(t.shape[i].base.clone());
                    }
                }
            }
            _ => {}
        }
    }
    names
        .into_iter()
        .map(|name| PlannedAxis {
            splits: splits.get(&name).cloned(),
            name,
        })
        .collect()
}

/// Axes combined inside kernel `k` (a `combination` whose result is still tiled). The kernel
/// computes all their tiles at once, as one block spanning the dimension: the same value as
/// long as nothing between the views and the combination depends on the tiling. Reductions
/// and product contractions across the split dimension cannot occur there (the verifier
/// types their results partial, which no combination accepts); a fold or collection over the
/// axis, a reshape or broadcast of its tiles, or a dimension split twice is refused.
fn whole_axes(f: &Function, k: &Kernel) -> Result<BTreeSet<String>, Refusal> {
    let body = &f.body;
    // The combinations an output is stored through (`combination[M,m](combination[N,n](x))`
    // stores tiles of x along m and n: a two-dimensional grid, nothing combined inside).
    let mut stored = BTreeSet::new();
    for o in &k.outputs {
        let mut at = *o;
        while let ExprKind::Combination(_, _, x) = &body.node(at).kind {
            stored.insert(at);
            at = *x;
        }
    }
    let mut whole = BTreeSet::new();
    for id in &k.nodes {
        if let ExprKind::Combination(_, a, _) = &body.node(*id).kind {
            if tiled(body.ty(*id)) && !stored.contains(id) {
                whole.insert(a.to_string());
            }
        }
    }
    for id in &k.nodes {
        let node = body.node(*id);
        for a in &whole {
            let over_axis = match &node.kind {
                ExprKind::Reduce {
                    over: ReduceOver::Parallel(p),
                    ..
                }
                | ExprKind::Collection(p, _) => p == a,
                ExprKind::Reshape(..) | ExprKind::Broadcast(..) => has_axis(node.ty.as_ref(), a),
                _ => false,
            };
            let split_twice = match node.ty.as_ref() {
                Some(Type::Tensor(t)) => t
                    .shape
                    .iter()
                    .any(|d| d.splits.len() > 1 && d.splits.iter().any(|s| s == a)),
                _ => false,
            };
            if over_axis || split_twice {
                return Err(Refusal {
                    node: *id,
                    reason: format!(
                        "work across the tiles of axis `{a}`, which the kernel combines inside itself, is not lowered yet"
                    ),
                });
            }
        }
    }
    Ok(whole)
}

fn has_axis(t: Option<&Type>, a: &str) -> bool {
    match t {
        Some(Type::Tensor(t)) => t.par.0.contains_key(a),
        Some(Type::Tuple(ts)) => ts.iter().any(|t| has_axis(Some(t), a)),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(in_loop: bool, shared: &[&str]) -> Load {
        Load {
            node: NodeId(0),
            buffer: (NodeId(0), 0),
            blocks: Vec::new(),
            per_iteration_of: if in_loop {
                vec!["k".into()]
            } else {
                Vec::new()
            },
            shared_along: shared.iter().map(|a| a.to_string()).collect(),
        }
    }

    #[test]
    fn programs_sharing_loop_tiles_are_adjacent_in_launch_order() {
        let grid = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        // Attention: K and V tiles (in the loop over keys) are shared by the query blocks of
        // a head; the query tile (once) by nothing. q varies fastest.
        let loads = [load(true, &["q"]), load(true, &["q"]), load(false, &[])];
        assert_eq!(
            launch_order(grid(&["b", "nh", "q"]), &loads),
            grid(&["q", "b", "nh"])
        );
        // A loop tile outweighs any number of tiles loaded once.
        let loads = [load(false, &["b"]), load(false, &["b"]), load(true, &["n"])];
        assert_eq!(launch_order(grid(&["b", "n"]), &loads), grid(&["n", "b"]));
        // Nothing shared: the names' order.
        assert_eq!(launch_order(grid(&["b", "n"]), &[]), grid(&["b", "n"]));
    }
}
