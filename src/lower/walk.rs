//! The order in which a kernel computes its values, and where: a text-free walk from the
//! kernel's stores down to its loads.
//!
//! A kernel is written demand-first: each store asks for its value, a value for its operands,
//! a fold over a loop axis opens the loop and asks for its items inside it. A value lives in
//! the innermost open loop whose axis it varies along (`level`), so a value replicated along a
//! loop's axis is computed once, before the loop. Folds over the same axis that neither read
//! nor feed one another and live in the same loops share one loop. Values a loop's body reads
//! but that do not vary along its axis are computed before the loop opens (they may open
//! loops of their own). Outputs stored along a loop axis are stored inside that loop, tile by
//! tile, as it closes.
//!
//! The walk records this as [`Step`]s, in order, and refuses what cannot be written this way
//! (a fold asked for inside its own loop, a value whose computation reads itself, an output
//! stored along a loop axis that no fold opens, …). The Triton writer follows the same order;
//! `tests/kernel_plan.rs` checks that the steps it writes are these.

use super::plan::{BufferKey, Fold, FoldKind, Refusal};
use super::{collection_fold_axis, stack_of, store_axes, stored_after_fold, tiled, KernelGraph};
use crate::ir::*;
use crate::verify::ModuleInfo;
use std::collections::{BTreeSet, HashMap, HashSet};

/// One step of a kernel's computation. `level` is the loop a step is written in: an index
/// into the loops open at that point, outermost first, or `None` before every loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A value is computed (or loaded).
    Value { node: NodeId, level: Option<usize> },
    /// A fold's state is initialised with its reducer's identity.
    FoldInit { fold: NodeId, level: Option<usize> },
    /// A loop over the tiles of a parallel axis opens.
    OpenLoop { axis: String },
    /// A fold's state takes the next item.
    FoldUpdate { fold: NodeId },
    /// The loop over `axis` closes; it is written at `level`.
    CloseLoop { axis: String, level: Option<usize> },
    /// A loop over the elements of a block, or over the entries of a stored stack of tiles
    /// (a fold whose reducer is no product of built-ins), opens.
    OpenElementLoop,
    /// That loop closes; it is written at `level`.
    CloseElementLoop { level: Option<usize> },
    /// An output is stored.
    Store {
        output: NodeId,
        level: Option<usize>,
    },
}

/// What a walk decides about one kernel.
#[derive(Clone, Debug, Default)]
pub struct Walked {
    pub steps: Vec<Step>,
    /// Stored tensors the kernel reads, in the order it first reads them.
    pub reads: Vec<BufferKey>,
    /// The folds that loop (over tiles, elements or stack entries), as the walk met them.
    pub folds: Vec<Fold>,
    /// Every tile read from global memory, in read order.
    pub loads: Vec<WalkedLoad>,
}

/// A tile read from global memory.
#[derive(Clone, Debug)]
pub struct WalkedLoad {
    /// The value that reads it: a view, a tensor-level value read whole, or a fold over the
    /// entries of a stored stack.
    pub node: NodeId,
    pub buffer: BufferKey,
    /// The axes of the loops it is read in, outermost first (`None` until its value's loop is
    /// known).
    pub loops: Option<Vec<String>>,
    /// One entry of a stored stack per iteration of the loop over the stack's axis.
    pub stack_entry: bool,
}

struct Loop {
    /// Empty for an element loop (no value lives in it by `level_of`).
    axis: String,
    /// The axis a loop over a stored stack's entries counts along.
    entries_of: Option<String>,
    memo: HashSet<NodeId>,
}

impl Loop {
    /// The axis whose tiles or entries it iterates over, if any.
    fn over(&self) -> Option<&str> {
        if self.axis.is_empty() {
            self.entries_of.as_deref()
        } else {
            Some(&self.axis)
        }
    }
}

pub(super) struct Walk<'a> {
    pub f: &'a Function,
    pub info: &'a ModuleInfo,
    pub g: &'a KernelGraph,
    pub kernel: &'a super::Kernel,
    /// Axes the kernel combines inside itself.
    pub whole: &'a BTreeSet<String>,
    /// Stored tensors written by this kernel or an earlier one (and the inputs).
    pub buffers: &'a BTreeSet<BufferKey>,
    in_kernel: BTreeSet<NodeId>,
    inner: Vec<Loop>,
    memo: HashSet<NodeId>,
    computing: BTreeSet<NodeId>,
    folds_done: BTreeSet<NodeId>,
    stored: BTreeSet<NodeId>,
    collection_folds: HashSet<NodeId>,
    tile_axes_used: BTreeSet<String>,
    /// The rank of the block a value is written as, where it differs from its type's: a view
    /// of a scalar constant is the scalar, not a block of the view's shape.
    block_rank: HashMap<NodeId, usize>,
    out: Walked,
}

type WResult<T = ()> = Result<T, Refusal>;

fn refuse<T>(node: NodeId, reason: impl Into<String>) -> WResult<T> {
    Err(Refusal {
        node,
        reason: reason.into(),
    })
}

impl<'a> Walk<'a> {
    pub fn new(
        f: &'a Function,
        info: &'a ModuleInfo,
        g: &'a KernelGraph,
        kernel: &'a super::Kernel,
        whole: &'a BTreeSet<String>,
        buffers: &'a BTreeSet<BufferKey>,
    ) -> Walk<'a> {
        Walk {
            f,
            info,
            g,
            kernel,
            whole,
            buffers,
            in_kernel: kernel.nodes.iter().copied().collect(),
            inner: Vec::new(),
            memo: HashSet::new(),
            computing: BTreeSet::new(),
            folds_done: BTreeSet::new(),
            stored: BTreeSet::new(),
            collection_folds: HashSet::new(),
            tile_axes_used: BTreeSet::new(),
            block_rank: HashMap::new(),
            out: Walked::default(),
        }
    }

    /// Walks the kernel from its stores: plain stores first, in output order; stores along a
    /// loop axis as that loop closes.
    pub fn run(mut self) -> WResult<Walked> {
        let body = &self.f.body;
        let (along_loop, plain): (Vec<NodeId>, Vec<NodeId>) =
            self.kernel.outputs.iter().partition(|o| {
                store_axes(body, **o)
                    .iter()
                    .any(|a| self.kernel.loop_axes.contains(a) && !self.after_fold(**o, a))
            });
        for o in plain {
            self.store(o)?;
        }
        if let Some(o) = along_loop.into_iter().find(|o| !self.stored.contains(o)) {
            return refuse(o, "a store along a loop axis that no fold opens");
        }
        // A stored stack of tiles read back where its tiles' axis is neither on the grid nor
        // looped over: where each tile's elements lie is not known here.
        let unplaced = self
            .tile_axes_used
            .iter()
            .find(|a| !self.kernel.grid_axes.contains(a) && !self.kernel.loop_axes.contains(a));
        if let (Some(a), Some(n)) = (unplaced, self.kernel.nodes.first()) {
            return refuse(
                *n,
                format!("a tile dimension over axis `{a}` read by a kernel that neither runs nor loops over `{a}`"),
            );
        }
        Ok(self.out)
    }

    fn after_fold(&self, o: NodeId, a: &str) -> bool {
        stored_after_fold(&self.f.body, o, a, &self.in_kernel)
    }

    fn level_of(&self, id: NodeId) -> Option<usize> {
        let t = self.f.body.ty(id);
        (0..self.inner.len())
            .rev()
            .find(|i| varies_along(t, &self.inner[*i].axis))
    }

    fn memo_at(&mut self, level: Option<usize>) -> &mut HashSet<NodeId> {
        match level {
            Some(i) if i < self.inner.len() => &mut self.inner[i].memo,
            _ => &mut self.memo,
        }
    }

    /// Records the axes that split the blocks of a value of type `t`.
    fn blocks_of(&mut self, t: &TensorType) {
        for a in tile_axes(t, self.whole) {
            self.tile_axes_used.insert(a);
        }
    }

    fn read(&mut self, key: BufferKey, at: NodeId) -> WResult {
        if !self.buffers.contains(&key) {
            return refuse(key.0, "a kernel reads a value no earlier kernel stores");
        }
        if !self.out.reads.contains(&key) {
            self.out.reads.push(key);
        }
        self.out.loads.push(WalkedLoad {
            node: at,
            buffer: key,
            loops: None,
            stack_entry: false,
        });
        Ok(())
    }

    /// The axes of the loops open up to `level`.
    fn loops_to(&self, level: Option<usize>) -> Vec<String> {
        let open = level.map_or(0, |l| l + 1).min(self.inner.len());
        self.inner[..open]
            .iter()
            .filter_map(|l| l.over().map(str::to_string))
            .collect()
    }

    fn value(&mut self, id: NodeId) -> WResult {
        let level = self.level_of(id);
        if self.memo_at(level).contains(&id) {
            return Ok(());
        }
        if !self.computing.insert(id) {
            return refuse(
                id,
                "a value its own computation reads (a fold whose operands outside its loop read the fold)",
            );
        }
        let r = self.compute(id);
        self.computing.remove(&id);
        r?;
        // Computing may open and close loops, never the ones this value lives in.
        let level = self.level_of(id);
        // Its loads are issued where it lives.
        let loops = self.loops_to(level);
        for l in self
            .out
            .loads
            .iter_mut()
            .filter(|l| l.node == id && l.loops.is_none())
        {
            l.loops = Some(loops.clone());
        }
        self.memo_at(level).insert(id);
        self.out.steps.push(Step::Value { node: id, level });
        Ok(())
    }

    fn compute(&mut self, id: NodeId) -> WResult {
        let body = &self.f.body;
        let node = body.node(id);
        if let Some(base) = self.g.load_base[id.index()] {
            let Some(Type::Tensor(t)) = node.ty.as_ref() else {
                return refuse(id, "a view of a tuple");
            };
            self.blocks_of(t);
            if self.g.constant[base.index()] {
                let r = self.constant_rank(base, t.shape.len());
                self.block_rank.insert(id, r);
                return self.constant_view(base, t.shape.len(), whole_view(t), id);
            }
            return self.load(base, t.shape.len(), id);
        }
        if super::views::is_view_op(&node.kind) && !tiled(node.ty.as_ref()) {
            // A view that is a result (of constants, too), in the kernel that writes it:
            // loaded through.
            let Some(Type::Tensor(t)) = node.ty.as_ref() else {
                return refuse(id, "a view of a tuple");
            };
            self.blocks_of(t);
            return self.load_through(id, t.shape.len(), id);
        }
        let tensor_level_read = !self.in_kernel.contains(&id)
            && !tiled(node.ty.as_ref())
            && !self.g.constant[id.index()]
            && !self.g.plumbing[id.index()];
        if tensor_level_read {
            let (types, is_tuple) = field_types(node.ty.as_ref())
                .or_else(|m| refuse(id, format!("a stored value: {m}")))?;
            if !is_tuple {
                self.blocks_of(&types[0]);
                return self.load(id, types[0].shape.len(), id);
            }
            for (i, t) in types.iter().enumerate() {
                self.blocks_of(t);
                self.load_field((id, i), t, t.shape.len(), id)?;
            }
            return Ok(());
        }
        if let ExprKind::Partition(_, a, x) | ExprKind::Combination(_, a, x) = &node.kind {
            if self.whole.contains(a.as_str()) {
                let Some(Type::Tensor(t)) = node.ty.as_ref() else {
                    return refuse(id, "a view of a tuple");
                };
                self.blocks_of(t);
                self.value(*x)?;
                return self.tile(id, *x);
            }
        }
        if let ExprKind::Replicate(_, x) = &node.kind {
            return self.value(*x);
        }
        if let Some((x, t)) = reshape_copy(body, id) {
            // A reshape that is a result (a copy): its operand's buffer, in its shape.
            self.blocks_of(t);
            return self.load_field((self.g.storage(x), 0), t, t.shape.len(), id);
        }
        if let ExprKind::Reduce {
            over: ReduceOver::Parallel(a),
            ..
        } = &node.kind
        {
            if self.inner.iter().any(|l| &l.axis == a) {
                return refuse(id, "a fold over an axis whose loop is open");
            }
            if !self.kernel.loop_axes.contains(&a.to_string()) {
                return refuse(id, "a fold over an axis that is not a loop axis");
            }
            return self.fold_group(id, a.to_string());
        }
        if let Some(a) = collection_fold_axis(body, id) {
            return self.collection_fold(id, a.to_string());
        }
        if let ExprKind::Reduce {
            over: ReduceOver::Axis(_),
            reducer: ReducerRef::User(r),
            ..
        } = &node.kind
        {
            if self
                .info
                .reducer(r)
                .is_some_and(|d| d.as_product().is_none())
            {
                return self.sequential_fold(id);
            }
        }
        for o in node.kind.operands() {
            self.value(o)?;
        }
        self.op(id)
    }

    /// A tuple where a tile is needed is refused (`x` read as one block).
    fn tile(&self, at: NodeId, x: NodeId) -> WResult {
        match self.f.body.ty(x) {
            Some(Type::Tuple(_)) => refuse(at, "a tuple where a tile is needed"),
            _ => Ok(()),
        }
    }

    /// The rank of the block a view of rank `view` of constant expression `c` is written as:
    /// a scalar literal is the scalar, whatever the view; fills and iotas take the view's
    /// shape; operators broadcast their operands (each viewed on its own rank).
    fn constant_rank(&self, c: NodeId, view: usize) -> usize {
        let body = &self.f.body;
        let node = body.node(c);
        match &node.kind {
            ExprKind::Constant(_) => 0,
            ExprKind::Unary(..)
            | ExprKind::Binary(..)
            | ExprKind::Select(..)
            | ExprKind::Cast(..) => node
                .kind
                .operands()
                .into_iter()
                .map(|o| match body.ty(o) {
                    Some(Type::Tensor(t)) => self.constant_rank(o, t.shape.len()),
                    _ => 0,
                })
                .max()
                .unwrap_or(0),
            // A transposed scalar is the scalar; a broadcast is written at the view's rank.
            ExprKind::Transpose(_, x) => self.constant_rank(*x, view),
            _ => view,
        }
    }

    /// A view of rank `rank` of constant expression `c`, computed on the view's block:
    /// leaves on its offsets, elementwise operators on their operands' views (trailing
    /// dimensions for lower ranks), a transpose on the permuted block, a broadcast on the
    /// operand's dimensions (a size-1 one a block of 1), a built-in reduction on the operand's
    /// view with the reduced dimension whole. Any other constant (a user reducer's fold, say)
    /// only where the view is `whole` (no dimension split): then its block is the constant's,
    /// computed whole in the kernel.
    fn constant_view(&mut self, c: NodeId, rank: usize, whole: bool, at: NodeId) -> WResult {
        let body = &self.f.body;
        let node = body.node(c);
        let operand_rank = |o: NodeId| match body.ty(o) {
            Some(Type::Tensor(t)) => Ok(t.shape.len()),
            _ => refuse(at, "a view of a tuple constant"),
        };
        match &node.kind {
            ExprKind::Constant(_) | ExprKind::Fill(_) | ExprKind::Iota(_) => Ok(()),
            ExprKind::Unary(..)
            | ExprKind::Binary(..)
            | ExprKind::Select(..)
            | ExprKind::Cast(..) => {
                for o in node.kind.operands() {
                    let r = operand_rank(o)?;
                    if r > rank {
                        return refuse(at, "a constant operand of higher rank than its view");
                    }
                    self.constant_view(o, r, whole, at)?;
                }
                Ok(())
            }
            ExprKind::Transpose(_, x) => self.constant_view(*x, rank, whole, at),
            ExprKind::Reduce {
                input,
                over: ReduceOver::Axis(d),
                reducer: ReducerRef::Builtin(_),
                ..
            } => {
                // Computed on the view's block with the reduced dimension whole (it is not in
                // the view, or is 1 there: never split), then reduced.
                let Some(Type::Tensor(t)) = body.ty(*input) else {
                    return refuse(at, "a view of a tuple constant");
                };
                if dim_index(d, t).is_none() || self.constant_rank(*input, t.shape.len()) == 0 {
                    return refuse(at, "a reduction of a scalar constant, viewed");
                }
                self.constant_view(*input, t.shape.len(), whole, at)
            }
            ExprKind::Broadcast(_, x) => {
                let r = operand_rank(*x)?;
                if r > rank {
                    return refuse(at, "a broadcast to a lower rank");
                }
                self.constant_view(*x, r, whole, at)
            }
            _ if whole => self.value(c),
            _ => refuse(
                at,
                "a split view of a constant expression other than elementwise operators, transposes, broadcasts and built-in reductions",
            ),
        }
    }

    /// What an operator on values computed in the kernel cannot be written as.
    fn op(&mut self, id: NodeId) -> WResult {
        let body = &self.f.body;
        let node = body.node(id);
        let ty = node.ty.as_ref().or(node.annot.as_ref());
        // The block ranks of its operands that differ from their types'.
        let block_rank: HashMap<NodeId, usize> = node
            .kind
            .operands()
            .into_iter()
            .filter_map(|o| self.block_rank.get(&o).map(|r| (o, *r)))
            .collect();
        let rank = |x: NodeId| match body.ty(x) {
            Some(Type::Tensor(t)) => Some(block_rank.get(&x).copied().unwrap_or(t.shape.len())),
            _ => None,
        };
        // Pointwise operators and products keep their operands' (broadcast) block rank.
        let derived = match &node.kind {
            ExprKind::Unary(_, x) | ExprKind::Cast(_, x) | ExprKind::Transpose(_, x) => rank(*x),
            ExprKind::Binary(_, x, y) => rank(*x).max(rank(*y)),
            ExprKind::Select(c, x, y) => rank(*c).max(rank(*x)).max(rank(*y)),
            ExprKind::TileMatMul { a, b, .. } | ExprKind::MatMul { a, b, .. } => {
                rank(*a).max(rank(*b))
            }
            _ => None,
        };
        let own = match ty {
            Some(Type::Tensor(t)) => Some(t.shape.len()),
            _ => None,
        };
        if let (Some(d), Some(o)) = (derived, own) {
            if d != o {
                self.block_rank.insert(id, d);
            }
        }

        match &node.kind {
            ExprKind::Constant(_) => {
                if let Some(Type::Tensor(t)) = ty {
                    if !t.shape.is_empty() {
                        self.blocks_of(&t.clone());
                    }
                }
            }
            ExprKind::Fill(_) | ExprKind::Iota(_) | ExprKind::Broadcast(..) => {
                let Some(Type::Tensor(t)) = ty else {
                    return refuse(id, "an untyped constant or broadcast");
                };
                let t = t.clone();
                self.blocks_of(&t);
                if let ExprKind::Broadcast(_, x) = &node.kind {
                    self.tile(id, *x)?;
                    if rank(*x).is_some_and(|r| r > t.shape.len()) {
                        return refuse(id, "a broadcast to a lower rank");
                    }
                }
            }
            ExprKind::Tuple(_) => {}
            ExprKind::Get(field, x) => {
                let named_fold_field = match (field, &body.node(*x).kind) {
                    (
                        FieldRef::Name(n),
                        ExprKind::Reduce {
                            reducer: ReducerRef::User(r),
                            ..
                        },
                    ) => self
                        .info
                        .reducer(r)
                        .is_some_and(|d| d.state.iter().any(|s| s == n)),
                    (FieldRef::Name(_), _) => false,
                    (FieldRef::Index(_), _) => true,
                };
                if !named_fold_field {
                    return refuse(id, "a named field outside a reducer");
                }
                if !matches!(body.ty(*x), Some(Type::Tuple(_))) {
                    return refuse(id, "get on a tile");
                }
            }
            ExprKind::Unary(_, x) | ExprKind::Cast(_, x) | ExprKind::Transpose(_, x) => {
                self.tile(id, *x)?
            }
            ExprKind::Binary(_, x, y) => {
                self.tile(id, *x)?;
                self.tile(id, *y)?;
            }
            ExprKind::Select(c, x, y) => {
                self.tile(id, *c)?;
                self.tile(id, *x)?;
                self.tile(id, *y)?;
            }
            ExprKind::TileMatMul { a, b, .. } | ExprKind::MatMul { a, b, .. } => {
                self.tile(id, *a)?;
                self.tile(id, *b)?;
                // Ranks may differ (batched activations times a weight): batch dimensions
                // broadcast. A block of rank below 2 (a view of a scalar constant) has no
                // rows and columns to multiply.
                match (rank(*a), rank(*b)) {
                    (Some(r), Some(s)) if r >= 2 && s >= 2 => {}
                    _ => return refuse(id, "a matrix product of a scalar block"),
                }
            }
            ExprKind::Reduce { input, reducer, .. } => {
                let parts = match reducer {
                    ReducerRef::Builtin(_) => 1,
                    ReducerRef::User(n) => match self.info.reducer(n).and_then(ReducerDef::as_product) {
                        Some(p) => p.len(),
                        None => return refuse(id, "a reducer body folding a tile dimension with another user reducer is not lowered yet"),
                    },
                };
                let fields = match body.ty(*input) {
                    Some(Type::Tuple(ts)) => ts.len(),
                    _ => 1,
                };
                if fields != parts {
                    return refuse(id, "a reducer whose arity differs from its operand's");
                }
                let ExprKind::Reduce {
                    over: ReduceOver::Axis(d),
                    ..
                } = &node.kind
                else {
                    return refuse(id, "a malformed fold");
                };
                let (types, _) = field_types(body.ty(*input)).or_else(|m| refuse(id, m))?;
                let scalar_block = rank(*input) == Some(0);
                if scalar_block || types.iter().any(|t| dim_index(d, t).is_none()) {
                    return refuse(id, "a reduction over an unknown dimension");
                }
            }
            ExprKind::Reshape(_, x) => {
                // A reshape of a tile (whose blocks `lowerable` found unpadded): `tl.reshape`.
                self.tile(id, *x)?;
                if let Some(Type::Tensor(t)) = ty {
                    self.blocks_of(&t.clone());
                }
            }
            ExprKind::Partition(..) | ExprKind::Replicate(..) => {
                return refuse(id, "a view of a value computed in the kernel")
            }
            ExprKind::Combination(..) | ExprKind::Collection(..) => {
                return refuse(id, "a store read inside its own kernel")
            }
            ExprKind::Slice(..) | ExprKind::Concat(..) => {
                return refuse(
                    id,
                    format!(
                        "a `{}` of tiles: blocks are not cut or joined in a kernel (a view of tensor-level values is: loads read through it)",
                        node.kind.op_name()
                    ),
                )
            }
            other => return refuse(id, format!("`{}` is not lowered yet", other.op_name())),
        }
        Ok(())
    }

    /// A slice or concat of tensor-level values, read through: each operand at the same rank
    /// (`views`).
    fn load_through(&mut self, view: NodeId, rank: usize, at: NodeId) -> WResult {
        let body = &self.f.body;
        let kind = &body.node(view).kind;
        if super::views::view_dim(body, kind).is_none() {
            return refuse(at, "a view of an unknown dimension");
        }
        for o in kind.operands() {
            self.load(o, rank, at)?;
        }
        Ok(())
    }

    /// A tile of rank `rank` of the tensor-level value `base` (a constant expression is
    /// computed on the tile instead).
    fn load(&mut self, base: NodeId, rank: usize, at: NodeId) -> WResult {
        let body = &self.f.body;
        let bnode = body.node(base);
        if super::views::loads_through(body, &self.g.virtual_view, &self.g.constant, base) {
            return self.load_through(base, rank, at);
        }
        if self.g.constant[base.index()] {
            return refuse(at, "a load of a constant expression");
        }
        let Some(Type::Tensor(bt)) = bnode.ty.as_ref() else {
            return refuse(at, "a load of a tuple");
        };
        // A reshape view is read from the buffer of the value it views, in its own shape.
        self.load_field((self.g.storage(base), 0), bt, rank, at)
    }

    fn load_field(&mut self, key: BufferKey, bt: &TensorType, rank: usize, at: NodeId) -> WResult {
        if bt.shape.len() != rank {
            return refuse(at, "a load whose tile rank differs from the tensor's");
        }
        self.read(key, at)
    }

    /// The folds over loop axis `a` that share `id`'s loop, computed in it.
    fn fold_group(&mut self, id: NodeId, a: String) -> WResult {
        let body = &self.f.body;
        let pending: Vec<NodeId> = self
            .kernel
            .nodes
            .iter()
            .copied()
            .filter(|n| {
                !self.folds_done.contains(n)
                    && matches!(&body.node(*n).kind,
                        ExprKind::Reduce { over: ReduceOver::Parallel(b), .. } if *b == a)
            })
            .collect();
        let deps = |n: NodeId| fold_deps(body, n, &pending);
        let id_deps = deps(id);
        let level = self.level_of(id);
        let loops_of = |n: NodeId| -> Vec<bool> {
            self.kernel
                .loop_axes
                .iter()
                .filter(|l| **l != a)
                .map(|l| varies_along(body.ty(n), l))
                .collect()
        };
        let id_loops = loops_of(id);
        let mut group = vec![id];
        for m in &pending {
            if *m != id
                && deps(*m).is_empty()
                && !id_deps.contains(m)
                && self.level_of(*m) == level
                && loops_of(*m) == id_loops
            {
                group.push(*m);
            }
        }
        for m in &group {
            if let ExprKind::Reduce { input, .. } = &body.node(*m).kind {
                self.outside_operands(*input, &a)?;
            }
        }
        for m in &group {
            if let ExprKind::Reduce { reducer, .. } = &body.node(*m).kind {
                self.fold_init(level, *m, reducer)?;
                self.out.folds.push(Fold {
                    node: *m,
                    kind: FoldKind::Loop,
                    axis: Some(a.clone()),
                });
            }
        }
        self.open_loop(&a);
        for m in &group {
            let ExprKind::Reduce { input, reducer, .. } = &body.node(*m).kind else {
                continue;
            };
            self.value(*input)?;
            match reducer {
                ReducerRef::Builtin(_) => self.tile(*m, *input)?,
                ReducerRef::User(n) => self.user_reducer(*m, n)?,
            }
            self.out.steps.push(Step::FoldUpdate { fold: *m });
        }
        self.close_loop(level, &a)?;
        for m in &group {
            self.folds_done.insert(*m);
            if *m != id {
                self.memo_at(level).insert(*m);
            }
        }
        Ok(())
    }

    fn user_reducer(&self, id: NodeId, name: &str) -> WResult {
        if self.info.reducer(name).is_none() {
            return refuse(id, format!("unknown reducer @{name}"));
        }
        Ok(())
    }

    fn fold_init(&mut self, level: Option<usize>, id: NodeId, reducer: &ReducerRef) -> WResult {
        let types: Vec<TensorType> = match self.f.body.ty(id) {
            Some(Type::Tensor(t)) => vec![t.clone()],
            Some(Type::Tuple(ts)) => ts.iter().filter_map(|t| t.as_tensor().cloned()).collect(),
            None => return refuse(id, "an untyped fold"),
        };
        if let ReducerRef::User(n) = reducer {
            self.user_reducer(id, n)?;
        }
        for t in &types {
            self.blocks_of(t);
        }
        self.out.steps.push(Step::FoldInit { fold: id, level });
        Ok(())
    }

    fn open_loop(&mut self, a: &str) {
        self.inner.push(Loop {
            axis: a.to_string(),
            entries_of: None,
            memo: HashSet::new(),
        });
        self.out.steps.push(Step::OpenLoop {
            axis: a.to_string(),
        });
    }

    /// Closes the innermost loop (over `a`): outputs stored along `a` are stored in it first.
    fn close_loop(&mut self, level: Option<usize>, a: &str) -> WResult {
        let body = &self.f.body;
        let along: Vec<NodeId> = self
            .kernel
            .outputs
            .iter()
            .copied()
            .filter(|o| {
                !self.stored.contains(o)
                    && store_axes(body, *o).iter().any(|x| x == a)
                    && !self.after_fold(*o, a)
            })
            .collect();
        for o in along {
            self.store(o)?;
        }
        self.inner.pop();
        self.out.steps.push(Step::CloseLoop {
            axis: a.to_string(),
            level,
        });
        Ok(())
    }

    /// `reduce (collection[a](x)) axis=0`: a loop over `a` folding each tile's `x`, outside
    /// every loop over `a` (its result does not vary along `a`).
    fn collection_fold(&mut self, id: NodeId, a: String) -> WResult {
        if self.collection_folds.contains(&id) {
            return Ok(());
        }
        let body = &self.f.body;
        let ExprKind::Reduce {
            input,
            reducer,
            keep_dims,
            ..
        } = &body.node(id).kind
        else {
            return refuse(id, "a malformed collection fold");
        };
        let ExprKind::Collection(_, x) = body.node(stack_of(body, *input)).kind else {
            return refuse(id, "a malformed collection fold");
        };
        if *keep_dims && matches!(reducer, ReducerRef::User(_)) {
            return refuse(id, "keep_dims on a user-reducer collection fold");
        }
        let t = body.ty(id);
        let level = (0..self.inner.len())
            .rev()
            .find(|i| self.inner[*i].axis != a && varies_along(t, &self.inner[*i].axis));
        let enclosing = level.map_or(0, |l| l + 1);
        if self.inner[..enclosing].iter().any(|l| l.axis == a) {
            return refuse(id, "a fold over an axis whose loop is open");
        }
        self.outside_operands(x, &a)?;
        self.fold_init(level, id, reducer)?;
        self.out.folds.push(Fold {
            node: id,
            kind: FoldKind::Collection,
            axis: Some(a.clone()),
        });
        self.open_loop(&a);
        self.value(x)?;
        match reducer {
            ReducerRef::Builtin(_) => self.tile(id, x)?,
            ReducerRef::User(n) => self.user_reducer(id, n)?,
        }
        self.out.steps.push(Step::FoldUpdate { fold: id });
        self.close_loop(level, &a)?;
        self.collection_folds.insert(id);
        Ok(())
    }

    /// A fold with a user reducer that is no product of built-ins, one element at a time.
    fn sequential_fold(&mut self, id: NodeId) -> WResult {
        let body = &self.f.body;
        let ExprKind::Reduce {
            input,
            over: ReduceOver::Axis(d),
            reducer,
            keep_dims,
        } = body.node(id).kind.clone()
        else {
            return refuse(id, "a malformed fold");
        };
        if keep_dims {
            return refuse(id, "keep_dims on a user reducer over a tile dimension");
        }
        let ReducerRef::User(name) = &reducer else {
            return refuse(id, "a built-in reducer folded element by element");
        };
        self.user_reducer(id, name)?;
        if let Some(a) =
            stored_stack_axis(self.f, self.kernel, self.whole, &self.in_kernel, input, &d)
        {
            return self.stack_fold(id, input, a, &reducer);
        }
        self.value(input)?;
        let fields: Vec<TensorType> = match body.ty(input) {
            Some(Type::Tensor(t)) => vec![t.clone()],
            Some(Type::Tuple(ts)) => ts.iter().filter_map(|t| t.as_tensor().cloned()).collect(),
            None => return refuse(id, "an untyped fold"),
        };
        // Every item field runs along the folded dimension with the same block.
        let mut along: Option<String> = None;
        for t in &fields {
            let lens = block_lens(t, self.whole);
            let Some(len) = dim_index(&d, t).and_then(|i| lens.get(i)) else {
                return refuse(id, "a fold over an unknown dimension");
            };
            match &along {
                Some(a) if a != len => {
                    return refuse(id, "item fields with different blocks along the fold")
                }
                Some(_) => {}
                None => along = Some(len.clone()),
            }
        }
        if along.is_none() {
            return refuse(id, "a fold of no items");
        }
        let level = self.level_of(id);
        self.fold_init(level, id, &reducer)?;
        self.out.folds.push(Fold {
            node: id,
            kind: FoldKind::Sequential,
            axis: None,
        });
        self.open_element_loop();
        self.out.steps.push(Step::FoldUpdate { fold: id });
        self.close_element_loop(level);
        Ok(())
    }

    /// A user-reducer fold over the stack dimension of a stored `collection[a](…)`: a loop
    /// over `a` loading each entry with its tile's offsets.
    fn stack_fold(
        &mut self,
        id: NodeId,
        stack: NodeId,
        a: String,
        reducer: &ReducerRef,
    ) -> WResult {
        let (types, is_tuple) = field_types(self.f.body.ty(stack)).or_else(|m| refuse(id, m))?;
        let level = self.level_of(id);
        self.fold_init(level, id, reducer)?;
        self.out.folds.push(Fold {
            node: id,
            kind: FoldKind::Stack,
            axis: Some(a.clone()),
        });
        // Offsets along `a` are defined inside this loop only.
        let a_read_before = self.tile_axes_used.contains(&a);
        self.open_element_loop();
        if let Some(l) = self.inner.last_mut() {
            l.entries_of = Some(a.clone());
        }
        let first_load = self.out.loads.len();
        for (i, t) in types.iter().enumerate() {
            self.blocks_of(t);
            if t.shape.is_empty() {
                return refuse(id, "a stack of rank 0");
            }
            if is_tuple {
                self.load_field((stack, i), t, t.shape.len(), id)?;
            } else {
                self.load(stack, t.shape.len(), id)?;
            }
        }
        let loops = self.loops_to(self.inner.len().checked_sub(1));
        for l in &mut self.out.loads[first_load..] {
            l.loops = Some(loops.clone());
            l.stack_entry = true;
        }
        self.out.steps.push(Step::FoldUpdate { fold: id });
        if !a_read_before {
            self.tile_axes_used.remove(&a);
        }
        self.close_element_loop(level);
        Ok(())
    }

    fn open_element_loop(&mut self) {
        self.inner.push(Loop {
            axis: String::new(),
            entries_of: None,
            memo: HashSet::new(),
        });
        self.out.steps.push(Step::OpenElementLoop);
    }

    fn close_element_loop(&mut self, level: Option<usize>) {
        self.inner.pop();
        self.out.steps.push(Step::CloseElementLoop { level });
    }

    /// Computes, outside the loop over `a`, every value below `n` that does not vary along
    /// `a` (nor along a loop not open yet), in node order.
    fn outside_operands(&mut self, n: NodeId, a: &str) -> WResult {
        let body = &self.f.body;
        let mut seen = BTreeSet::new();
        let mut stack = vec![n];
        let mut outside = Vec::new();
        while let Some(c) = stack.pop() {
            if !seen.insert(c) {
                continue;
            }
            let unopened =
                self.kernel.loop_axes.iter().any(|l| {
                    varies_along(body.ty(c), l) && !self.inner.iter().any(|o| &o.axis == l)
                });
            let folds_a = collection_fold_axis(body, c).is_some_and(|x| x == a);
            if (varies_along(body.ty(c), a) || unopened) && !folds_a {
                if self.g.load_base[c.index()].is_none() {
                    stack.extend(body.node(c).kind.operands());
                }
            } else {
                outside.push(c);
            }
        }
        outside.sort();
        for c in outside {
            self.value(c)?;
        }
        Ok(())
    }

    fn store(&mut self, o: NodeId) -> WResult {
        self.stored.insert(o);
        let body = &self.f.body;
        let axes = store_axes(body, o);
        let level = (0..self.inner.len())
            .rev()
            .find(|i| axes.contains(&self.inner[*i].axis));
        let (fields, is_tuple) =
            field_types(body.ty(o)).or_else(|m| refuse(o, format!("a stored value: {m}")))?;
        let (cur, leading) = stored_tile(body, o);
        self.value(cur)?;
        let value_fields: Vec<usize> = match body.ty(cur) {
            Some(Type::Tuple(ts)) if is_tuple => ts
                .iter()
                .map(|t| t.as_tensor().map_or(0, |t| t.shape.len()))
                .collect(),
            Some(Type::Tensor(t)) if !is_tuple => vec![t.shape.len()],
            _ => return refuse(o, "a stored value whose shape differs from its type"),
        };
        if value_fields.len() != fields.len() {
            return refuse(o, "a stored tuple with a different number of fields");
        }
        for (i, (rank, t)) in value_fields.iter().zip(&fields).enumerate() {
            let want = t.shape.len() - usize::from(leading.is_some());
            if *rank > want {
                return refuse(o, "a stored tile whose rank differs from the tensor's");
            }
            if !self.buffers.contains(&(o, i)) {
                return refuse(o, "a kernel reads a value no earlier kernel stores");
            }
        }
        self.out.steps.push(Step::Store { output: o, level });
        Ok(())
    }
}

/// The value a store writes, under its `combination`s, and the axis of a `collection` whose
/// stack it fills (one entry per tile).
pub fn stored_tile(body: &Body, o: NodeId) -> (NodeId, Option<Sym>) {
    let mut cur = o;
    let mut leading = None;
    loop {
        match &body.node(cur).kind {
            ExprKind::Combination(_, _, x) => cur = *x,
            ExprKind::Collection(a, x) if leading.is_none() && cur == o => {
                leading = Some(*a);
                cur = *x;
            }
            _ => break,
        }
    }
    (cur, leading)
}

/// Whether a view of type `t` splits no dimension: its block is the viewed value's whole.
pub fn whole_view(t: &TensorType) -> bool {
    t.shape.iter().all(|d| d.splits.is_empty())
        && t.par
            .0
            .values()
            .all(|k| !matches!(k, ParKind::Partition(_)))
}

/// A tensor-level reshape of a tensor-level value computed by a kernel of its own (a result;
/// the others are views, `reshape_views`): its operand and its type. The kernel copies the
/// operand's buffer, read in the reshape's shape, to its own.
pub fn reshape_copy(body: &Body, id: NodeId) -> Option<(NodeId, &TensorType)> {
    let node = body.node(id);
    let ExprKind::Reshape(_, x) = node.kind else {
        return None;
    };
    match node.ty.as_ref() {
        Some(Type::Tensor(t)) if t.par.is_empty() && !tiled(body.ty(x)) => Some((x, t)),
        _ => None,
    }
}

/// The tensor types of a value's fields (one for a tensor) and whether it is a tuple.
pub fn field_types(ty: Option<&Type>) -> Result<(Vec<TensorType>, bool), &'static str> {
    match ty {
        Some(Type::Tensor(t)) => Ok((vec![t.clone()], false)),
        Some(Type::Tuple(ts)) => ts
            .iter()
            .map(|t| t.as_tensor().cloned().ok_or("a tuple of tuples"))
            .collect::<Result<_, _>>()
            .map(|fs| (fs, true)),
        None => Err("an untyped value"),
    }
}

/// How each dimension of a tile of type `t` is blocked: split by a parallel axis that the
/// kernel does not combine inside itself, one element long, or whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Block {
    Split(String),
    One,
    Whole(DimBase),
}

pub fn blocks(t: &TensorType, whole: &BTreeSet<String>) -> Vec<Block> {
    t.shape
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let split = t
                .par
                .0
                .iter()
                .find(|(_, k)| **k == ParKind::Partition(i))
                .map(|(a, _)| a.to_string())
                .or_else(|| d.splits.last().map(|a| a.to_string()))
                .filter(|a| !whole.contains(a));
            match (split, &d.base) {
                (Some(a), _) => Block::Split(a),
                (None, DimBase::Lit(1)) => Block::One,
                (None, b) => Block::Whole(b.clone()),
            }
        })
        .collect()
}

fn tile_axes(t: &TensorType, whole: &BTreeSet<String>) -> Vec<String> {
    blocks(t, whole)
        .into_iter()
        .filter_map(|b| match b {
            Block::Split(a) => Some(a),
            _ => None,
        })
        .collect()
}

/// A comparable name for each block length (equal names, equal lengths).
fn block_lens(t: &TensorType, whole: &BTreeSet<String>) -> Vec<String> {
    blocks(t, whole)
        .into_iter()
        .map(|b| match b {
            Block::Split(a) => format!("BLOCK_{a}"),
            Block::One => "1".into(),
            Block::Whole(DimBase::Lit(n)) => n.max(16).next_power_of_two().to_string(),
            Block::Whole(DimBase::Sym(s)) => format!("P_{s}"),
            Block::Whole(DimBase::Extent(a)) => format!("P_EXT_{a}"),
        })
        .collect()
}

/// The position of dimension `d` among a tile's blocks, as the writer resolves it: by index,
/// or the first dimension of that symbol.
pub fn dim_index(d: &DimRef, t: &TensorType) -> Option<usize> {
    match d {
        DimRef::Index(i) => (*i < t.shape.len()).then_some(*i),
        DimRef::Name(n) => t
            .shape
            .iter()
            .position(|x| matches!(&x.base, DimBase::Sym(s) if s.as_str() == n.as_str())),
    }
}

/// The axis `a` of `stack = collection[a](…)` when a fold over its dimension `d` reads a
/// stack another kernel stored whose tiles keep a dimension split by `a`, and this kernel has
/// no coordinate along `a` of its own.
pub fn stored_stack_axis(
    f: &Function,
    kernel: &super::Kernel,
    whole: &BTreeSet<String>,
    in_kernel: &BTreeSet<NodeId>,
    stack: NodeId,
    d: &DimRef,
) -> Option<String> {
    let body = &f.body;
    let ExprKind::Collection(a, _) = &body.node(stack).kind else {
        return None;
    };
    let a = a.to_string();
    let types: Vec<&TensorType> = match body.ty(stack)? {
        Type::Tensor(t) => vec![t],
        Type::Tuple(ts) => ts.iter().filter_map(|t| t.as_tensor()).collect(),
    };
    let first = types.first()?;
    let stacked = resolve_dim(&first.shape, d).ok() == Some(0);
    let split_by_a = types.iter().any(|t| {
        t.shape
            .iter()
            .any(|x| x.splits.iter().any(|s| s.as_str() == a))
    });
    let own = kernel.grid_axes.contains(&a) || kernel.loop_axes.contains(&a) || whole.contains(&a);
    (stacked && split_by_a && !own && !in_kernel.contains(&stack)).then_some(a)
}

/// Whether a value of type `t` differs between coordinates of axis `a`: partitioned or
/// partial along it. A value replicated along `a` is the same at every coordinate, so a
/// kernel computes (and loads) it once, outside a loop over `a`.
pub fn varies_along(t: Option<&Type>, a: &str) -> bool {
    match t {
        Some(Type::Tensor(t)) => t.par.0.get(a).is_some_and(|k| *k != ParKind::Replicate),
        Some(Type::Tuple(ts)) => ts.iter().any(|t| varies_along(Some(t), a)),
        None => false,
    }
}

/// The folds among `pending` that `n`'s operands depend on, transitively.
pub fn fold_deps(body: &Body, n: NodeId, pending: &[NodeId]) -> Vec<NodeId> {
    let mut seen = vec![false; body.nodes.len()];
    let mut stack: Vec<NodeId> = body.node(n).kind.operands();
    let mut out = Vec::new();
    while let Some(c) = stack.pop() {
        if std::mem::replace(&mut seen[c.index()], true) {
            continue;
        }
        if pending.contains(&c) {
            out.push(c);
        }
        stack.extend(body.node(c).kind.operands());
    }
    out
}
