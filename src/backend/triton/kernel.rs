//! A kernel's body: its signature, grid coordinates, values, loads and stores, written in
//! the plan's order.

use super::folds::FoldRun;
use super::names::{base_text, compute_tl, dtype_tl, ident, lit, namer, p2_name};
use super::Ctx;
use crate::ir::print::Namer;
use crate::ir::*;
use crate::lower::plan::{BufferKey, FoldKind, PlannedKernel};
use crate::lower::walk::{
    blocks, dim_index, field_types, reshape_copy, stored_tile, varies_along, whole_view, Block,
    Step,
};
use crate::lower::{tiled, Kernel};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;

/// One block dimension.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct BlockDim {
    /// Length expression (a constexpr name or a literal).
    pub(super) len: String,
    /// 1-D offsets into the tensor dimension.
    pub(super) offs: String,
    /// 1-D in-bounds mask, when the block can overhang.
    pub(super) mask: Option<String>,
    /// The dimension's name, to resolve `axis=NAME` in reducer bodies.
    pub(super) name: Option<String>,
}

#[derive(Clone, Debug)]
pub(super) enum Val {
    Tile { expr: String, dims: Vec<BlockDim> },
    Tuple(Vec<Val>),
}

impl Val {
    pub(super) fn tile(&self) -> Result<(&str, &[BlockDim]), String> {
        match self {
            Val::Tile { expr, dims } => Ok((expr, dims)),
            Val::Tuple(_) => Err("a tuple where a tile is needed".into()),
        }
    }
}

pub(super) fn index_for(rank: usize, d: usize) -> String {
    if rank <= 1 {
        return String::new();
    }
    let parts: Vec<&str> = (0..rank)
        .map(|j| if j == d { ":" } else { "None" })
        .collect();
    format!("[{}]", parts.join(", "))
}

pub(super) fn broadcast(vals: &[&[BlockDim]]) -> Vec<BlockDim> {
    let rank = vals.iter().map(|d| d.len()).max().unwrap_or(0);
    (0..rank)
        .map(|i| {
            let mut best: Option<BlockDim> = None;
            for dims in vals {
                let off = rank - dims.len();
                if i >= off {
                    let d = &dims[i - off];
                    if best.as_ref().is_none_or(|b| b.len == "1") {
                        best = Some(d.clone());
                    }
                }
            }
            best.unwrap_or(BlockDim {
                len: "1".into(),
                offs: "tl.arange(0, 1)".into(),
                mask: None,
                name: None,
            })
        })
        .collect()
}

pub(super) fn mask_all(dims: &[BlockDim]) -> Option<String> {
    let rank = dims.len();
    let parts: Vec<String> = dims
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            d.mask
                .as_ref()
                .map(|m| format!("{m}{}", index_for(rank, i)))
        })
        .collect();
    if parts.is_empty() {
        None
    } else {
        Some(parts.join(" & "))
    }
}

pub(super) struct Loop {
    pub(super) axis: String,
    pub(super) lines: Vec<String>,
    pub(super) memo: HashMap<NodeId, Val>,
}

pub(super) struct KernelEmitter<'c, 'a> {
    pub(super) ctx: &'c Ctx<'a>,
    pub(super) kernel: &'c Kernel,
    pub(super) names: Namer,
    pub(super) outer: Vec<String>,
    /// Open fold loops, outermost first: each collects its body and memoizes the values that
    /// vary along its axis.
    pub(super) inner: Vec<Loop>,
    pub(super) memo: HashMap<NodeId, Val>,
    pub(super) ptr: BTreeMap<BufferKey, String>,
    pub(super) buffer: &'c HashMap<BufferKey, String>,
    pub(super) in_kernel: BTreeSet<NodeId>,
    /// Outputs already stored (a store along a loop axis is written inside that loop).
    pub(super) stored: BTreeSet<NodeId>,
    /// Collection folds done, by node: their result is computed before any loop over their
    /// axis, so it is valid inside loops whose memo does not have it.
    pub(super) collection_folds: HashMap<NodeId, Val>,
    /// Axes the kernel combines inside itself: one block spans their whole dimension.
    pub(super) whole: BTreeSet<String>,
    /// Operand dtypes of the matrix product being emitted (unknown in reducer bodies: f32).
    pub(super) dot_dtypes: Option<(DType, DType)>,
    /// Axes whose tile offsets (`o_<axis>`) a block of this kernel used: each must be one
    /// the kernel defines (a grid or loop axis), else the code reads an undefined name.
    pub(super) tile_axes_used: std::cell::RefCell<BTreeSet<String>>,
    /// How the plan folds each fold that loops.
    pub(super) fold_kind: HashMap<NodeId, FoldKind>,
    /// Folds initialised and not finished, with their state.
    pub(super) folds: HashMap<NodeId, FoldRun>,
    /// Folds initialised since the last loop opened: the next loop is theirs.
    pub(super) recent_inits: Vec<NodeId>,
    /// The folds of each open loop, outermost first.
    pub(super) loop_groups: Vec<Vec<NodeId>>,
    /// Results of finished folds, until their `Value` step.
    pub(super) fold_results: HashMap<NodeId, Val>,
    /// While a skipping loop's body is written for fully kept tiles: its masked selects, each
    /// written as the operand it keeps, and the values only their conditions read (not
    /// written).
    pub(super) unmasked: HashMap<NodeId, NodeId>,
    pub(super) mask_only: BTreeSet<NodeId>,
}

/// A kernel's text, its launch arguments and its grid.
pub(super) type KernelText = (String, Vec<String>, String);

pub(super) fn emit_kernel(
    ctx: &Ctx,
    pk: &PlannedKernel,
    kname: &str,
    buffer: &HashMap<BufferKey, String>,
) -> Result<KernelText, (NodeId, String)> {
    let k = &pk.kernel;
    let mut e = KernelEmitter {
        ctx,
        kernel: k,
        names: namer(),
        outer: Vec::new(),
        inner: Vec::new(),
        memo: HashMap::new(),
        ptr: BTreeMap::new(),
        buffer,
        in_kernel: k.nodes.iter().copied().collect(),
        stored: BTreeSet::new(),
        collection_folds: HashMap::new(),
        whole: pk.whole_axes.clone(),
        dot_dtypes: None,
        tile_axes_used: Default::default(),
        // Block folds are operators (`tl.sum` and kin); the others loop.
        fold_kind: pk
            .folds
            .iter()
            .filter(|f| f.kind != FoldKind::Block)
            .map(|f| (f.node, f.kind))
            .collect(),
        folds: HashMap::new(),
        recent_inits: Vec::new(),
        loop_groups: Vec::new(),
        fold_results: HashMap::new(),
        unmasked: HashMap::new(),
        mask_only: BTreeSet::new(),
    };
    for b in &ctx.f.bindings {
        e.names.reserve(&b.name);
        e.names.reserve(&format!("P_{}", b.name));
    }
    // Every axis's names, not only the grid's and loops': a fold over a stored stack of tiles
    // loops over its axis too (`stack_fold`).
    for a in &ctx.axes {
        for p in ["BLOCK_", "EXT_", "P_EXT_", "c_", "g_", "o_", "m_"] {
            e.names.reserve(&format!("{p}{a}"));
        }
    }
    // Grid coordinates from one flattened program id.
    e.outer.push("pid = tl.program_id(0)".into());
    e.names.reserve("pid");
    let grid_axes: Vec<&String> = pk.grid_axes.iter().collect();
    for a in &grid_axes {
        // An axis the kernel also folds over keeps its grid coordinate apart from the loop's.
        let coord = e.grid_coordinate(a);
        e.outer.push(format!("{coord} = pid % EXT_{a}"));
        e.outer.push(format!("pid = pid // EXT_{a}"));
        e.axis_offsets_from(a, &coord, None);
    }
    // The body, in the plan's order.
    e.steps(pk, 0, pk.steps.len())?;
    if let Some(o) = k.outputs.iter().find(|o| !e.stored.contains(o)) {
        return Err((*o, "an output the plan does not store".into()));
    }
    // A stored stack of tiles read back where its tiles' axis is neither on the grid nor
    // looped over (a tensor-level fold of `collection[k](…)` tiles): where each tile's
    // elements lie is not known here.
    let unplaced = e
        .tile_axes_used
        .borrow()
        .iter()
        .find(|a| !k.grid_axes.contains(a) && !k.loop_axes.contains(a))
        .cloned();
    if let (Some(a), Some(n)) = (unplaced, k.nodes.first()) {
        return Err((
            *n,
            format!("a tile dimension over axis `{a}` read by a kernel that neither runs nor loops over `{a}`"),
        ));
    }
    // Signature.
    let mut sig = Vec::new();
    let mut args = Vec::new();
    for (key, p) in &e.ptr {
        sig.push(p.clone());
        args.push(buffer.get(key).cloned().unwrap_or_else(|| "None".into()));
    }
    for b in &ctx.f.bindings {
        sig.push(b.name.clone());
        args.push(b.name.clone());
    }
    let axes: Vec<&String> = ctx.axes.iter().collect();
    for a in &axes {
        sig.push(format!("EXT_{a}"));
        args.push(format!("EXT_{a}"));
    }
    for b in &ctx.f.bindings {
        sig.push(format!("P_{}: tl.constexpr", b.name));
        args.push(format!("P_{0}=P_{0}", b.name));
    }
    for a in &axes {
        sig.push(format!("P_EXT_{a}: tl.constexpr"));
        args.push(format!("P_EXT_{a}=P_EXT_{a}"));
        if ctx.axis_dim.contains_key(*a) {
            sig.push(format!("BLOCK_{a}: tl.constexpr"));
            args.push(format!("BLOCK_{a}=sched[\"BLOCK_{a}\"]"));
        } else {
            sig.push(format!("BLOCK_{a}: tl.constexpr"));
            args.push(format!("BLOCK_{a}=1"));
        }
    }
    let mut src = String::new();
    let what = if k.default_tiled {
        "default tiling of a tensor-level operator"
    } else {
        "tiled region"
    };
    let whole = if e.whole.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = e.whole.iter().map(String::as_str).collect();
        format!("; whole axes: [{}]", names.join(", "))
    };
    let grid_names: Vec<&str> = grid_axes.iter().map(|a| a.as_str()).collect();
    let _ = writeln!(
        src,
        "@triton.jit\ndef {kname}({}):\n    # {what}; grid axes: [{}]; loop axes: [{}]{whole}",
        sig.join(", "),
        grid_names.join(", "),
        k.loop_axes.join(", ")
    );
    for l in &e.outer {
        let _ = writeln!(src, "    {l}");
    }
    src.push('\n');
    let grid = if grid_axes.is_empty() {
        "1".to_string()
    } else {
        grid_axes
            .iter()
            .map(|a| format!("EXT_{a}"))
            .collect::<Vec<_>>()
            .join(" * ")
    };
    Ok((src, args, grid))
}

impl KernelEmitter<'_, '_> {
    /// A line in the innermost open loop (`inner`) or before every loop.
    pub(super) fn line(&mut self, inner: bool, l: String) {
        let level = if inner {
            self.inner.len().checked_sub(1)
        } else {
            None
        };
        self.line_at(level, l);
    }

    pub(super) fn line_at(&mut self, level: Option<usize>, l: String) {
        match level.and_then(|i| self.inner.get_mut(i)) {
            Some(lp) => lp.lines.push(l),
            None => self.outer.push(l),
        }
    }

    /// The loop a value lives in: the innermost open loop whose axis it varies along (`None`:
    /// before every loop). A value replicated along a loop's axis is computed before it.
    pub(super) fn level_of(&self, id: NodeId) -> Option<usize> {
        let t = self.ctx.f.body.ty(id);
        (0..self.inner.len())
            .rev()
            .find(|i| varies_along(t, &self.inner[*i].axis))
    }

    pub(super) fn memo_at(&mut self, level: Option<usize>) -> &mut HashMap<NodeId, Val> {
        match level {
            Some(i) if i < self.inner.len() => &mut self.inner[i].memo,
            _ => &mut self.memo,
        }
    }

    pub(super) fn tmp(&mut self, base: &str) -> String {
        self.names.fresh(base)
    }

    /// Defines `o_<axis>`/`m_<axis>` for the coordinate `c_<axis>`.
    pub(super) fn axis_offsets(&mut self, a: &str, inner: bool) {
        let level = if inner {
            self.inner.len().checked_sub(1)
        } else {
            None
        };
        self.axis_offsets_from(a, &format!("c_{a}"), level);
    }

    /// Defines `o_<axis>`/`m_<axis>` for coordinate `coord`, at `level`.
    pub(super) fn axis_offsets_from(&mut self, a: &str, coord: &str, level: Option<usize>) {
        match self.ctx.axis_dim.get(a) {
            Some(d) => {
                let size = base_text(d);
                self.line_at(
                    level,
                    format!("o_{a} = {coord} * BLOCK_{a} + tl.arange(0, BLOCK_{a})"),
                );
                self.line_at(level, format!("m_{a} = o_{a} < {size}"));
            }
            None => {
                self.line_at(level, format!("o_{a} = tl.arange(0, 1)"));
                self.line_at(level, format!("m_{a} = o_{a} < 1"));
            }
        }
    }

    /// The grid coordinate of axis `a`: `c_<axis>`, or `g_<axis>` when the kernel also folds
    /// over `a` in a loop, whose coordinate is `c_<axis>`.
    pub(super) fn grid_coordinate(&self, a: &str) -> String {
        if self.kernel.loop_axes.iter().any(|l| l == a) {
            format!("g_{a}")
        } else {
            format!("c_{a}")
        }
    }

    pub(super) fn dims_of(&self, t: &TensorType) -> Vec<BlockDim> {
        blocks(t, &self.whole)
            .into_iter()
            .zip(&t.shape)
            .map(|(block, d)| {
                let name = match &d.base {
                    DimBase::Sym(s) => Some(s.to_string()),
                    _ => None,
                };
                match block {
                    Block::Split(a) => {
                        self.tile_axes_used.borrow_mut().insert(a.clone());
                        BlockDim {
                            len: format!("BLOCK_{a}"),
                            offs: format!("o_{a}"),
                            mask: Some(format!("m_{a}")),
                            name,
                        }
                    }
                    Block::One => BlockDim {
                        len: "1".into(),
                        offs: "tl.arange(0, 1)".into(),
                        mask: None,
                        name,
                    },
                    Block::Whole(b) => {
                        let p = p2_name(&b);
                        BlockDim {
                            len: p.clone(),
                            offs: format!("tl.arange(0, {p})"),
                            mask: Some(format!("(tl.arange(0, {p}) < {})", base_text(&b))),
                            name,
                        }
                    }
                }
            })
            .collect()
    }

    pub(super) fn ptr_of(&mut self, key: BufferKey) -> Result<String, (NodeId, String)> {
        if let Some(p) = self.ptr.get(&key) {
            return Ok(p.clone());
        }
        let node = key.0;
        let Some(host) = self.buffer.get(&key) else {
            return Err((
                node,
                "a kernel reads a value no earlier kernel stores".into(),
            ));
        };
        let p = self.names.fresh(&format!("{}_ptr", ident(host)));
        self.ptr.insert(key, p.clone());
        Ok(p)
    }

    /// Row-major strides of a tensor-level shape, as expressions.
    pub(super) fn strides(shape: &[Dim]) -> Vec<String> {
        let mut s = vec!["1".to_string(); shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            s[i] = format!("{} * {}", s[i + 1], base_text(&shape[i + 1].base));
        }
        s
    }

    pub(super) fn address(
        &mut self,
        base: BufferKey,
        shape: &[Dim],
        dims: &[BlockDim],
        leading: Option<String>,
    ) -> Result<String, (NodeId, String)> {
        let p = self.ptr_of(base)?;
        let strides = Self::strides(shape);
        let rank = dims.len();
        let mut terms = vec![p];
        let skip = usize::from(leading.is_some());
        if let Some(l) = leading {
            terms.push(format!("({l}) * ({})", strides[0]));
        }
        for (i, d) in dims.iter().enumerate() {
            let s = strides.get(i + skip).cloned().unwrap_or_else(|| "1".into());
            terms.push(format!("({}){} * ({s})", d.offs, index_for(rank, i)));
        }
        Ok(terms.join(" + "))
    }

    /// Writes one step of the plan.
    pub(super) fn step(&mut self, s: &Step) -> Result<(), (NodeId, String)> {
        match s {
            Step::Value { node, level } => self.value_step(*node, *level),
            Step::FoldInit { fold, level } => self.fold_init(*fold, *level),
            Step::OpenLoop { axis } => {
                self.open_loop(axis);
                Ok(())
            }
            Step::FoldUpdate { fold } => self.fold_update(*fold),
            Step::CloseLoop { axis, level } => self.close_loop(axis, *level),
            Step::OpenElementLoop => self.open_element_loop(),
            Step::CloseElementLoop { level } => self.close_element_loop(*level),
            Step::Store { output, level } => self.store(*output, *level),
        }
    }

    /// A value the plan computed earlier, where it lives now.
    pub(super) fn lookup(&mut self, id: NodeId) -> Result<Val, (NodeId, String)> {
        let level = self.level_of(id);
        self.memo_at(level).get(&id).cloned().ok_or((
            id,
            "a value the plan does not compute before its use".into(),
        ))
    }

    /// A `Value` step: the value computed, named when it is not a name already, at `level`.
    fn value_step(&mut self, id: NodeId, level: Option<usize>) -> Result<(), (NodeId, String)> {
        if self.mask_only.contains(&id) {
            return Ok(());
        }
        let v = match self.unmasked.get(&id) {
            Some(kept) => self.kept(id, *kept)?,
            None => self.compute(id)?,
        };
        let v = match v {
            Val::Tile { expr, dims } if !is_simple(&expr) => {
                let name = self.f_name(id);
                self.line_at(level, format!("{name} = {expr}"));
                Val::Tile { expr: name, dims }
            }
            other => other,
        };
        self.memo_at(level).insert(id, v);
        Ok(())
    }

    pub(super) fn f_name(&mut self, id: NodeId) -> String {
        let base = self.ctx.f.body.nodes[id.index()]
            .name
            .clone()
            .unwrap_or_else(|| "t".into());
        self.tmp(&ident(&base))
    }

    pub(super) fn compute(&mut self, id: NodeId) -> Result<Val, (NodeId, String)> {
        let body = &self.ctx.f.body;
        let node = &body.nodes[id.index()];
        let err = |m: &str| (id, m.to_string());
        // Loads: views of a tensor-level value.
        if let Some(base) = self.ctx.g.load_base[id.index()] {
            let Some(Type::Tensor(t)) = node.ty.as_ref() else {
                return Err(err("a view of a tuple"));
            };
            let dims = self.dims_of(t);
            if self.ctx.g.constant[base.index()] {
                // A view of a constant expression: the constant on the tile.
                return self.constant_view(base, dims, whole_view(t), id);
            }
            return self.load(base, dims, id);
        }
        // A view that is a result (of constants, too), in the kernel that writes it: loaded
        // through.
        if crate::lower::views::is_view_op(&node.kind) && !tiled(node.ty.as_ref()) {
            let Some(Type::Tensor(t)) = node.ty.as_ref() else {
                return Err(err("a view of a tuple"));
            };
            let dims = self.dims_of(t);
            return self.load_view(id, dims, id);
        }
        // Tensor-level values other kernels compute (or inputs) are read from memory;
        // constant expressions and tuple plumbing are computed here.
        let tensor_level_read = !self.in_kernel.contains(&id)
            && !tiled(node.ty.as_ref())
            && !self.ctx.g.constant[id.index()]
            && !self.ctx.g.plumbing[id.index()];
        if tensor_level_read {
            // A stored value read whole; a stored tuple field by field.
            let (types, is_tuple) =
                field_types(node.ty.as_ref()).map_err(|m| err(&format!("a stored value: {m}")))?;
            if !is_tuple {
                let dims = self.dims_of(&types[0]);
                return self.load(id, dims, id);
            }
            let mut fields = Vec::new();
            for (i, t) in types.iter().enumerate() {
                let dims = self.dims_of(t);
                fields.push(self.load_field((id, i), t, dims, id)?);
            }
            return Ok(Val::Tuple(fields));
        }
        let ops: Vec<NodeId> = node.kind.operands();
        // Over a whole axis, a view or a combination of a block computed here is the block.
        if let ExprKind::Partition(_, a, x) | ExprKind::Combination(_, a, x) = &node.kind {
            if self.whole.contains(a.as_str()) {
                let Some(Type::Tensor(t)) = node.ty.as_ref() else {
                    return Err(err("a view of a tuple"));
                };
                let dims = self.dims_of(t);
                let v = self.lookup(*x)?;
                let (expr, _) = v.tile().map_err(|m| (id, m))?;
                return Ok(Val::Tile {
                    expr: expr.to_string(),
                    dims,
                });
            }
        }
        // A replicated tile computed in the kernel is the same block at every coordinate.
        if let ExprKind::Replicate(_, x) = &node.kind {
            return self.lookup(*x);
        }
        // A reshape that is a result copies its operand's buffer, read in its shape.
        if let Some((x, t)) = reshape_copy(body, id) {
            let dims = self.dims_of(t);
            let key = (self.ctx.g.storage(x), 0);
            return self.load_field(key, &t.clone(), dims, id);
        }
        // A fold that loops: its loop is closed, its state is the value.
        if self.fold_kind.contains_key(&id) {
            return self
                .fold_value(id)?
                .ok_or((id, "a fold the plan does not finish before its use".into()));
        }
        let mut vals = Vec::new();
        for o in &ops {
            vals.push(self.lookup(*o)?);
        }
        let ty = node.ty.clone();
        let annot = node.annot.clone();
        let mut kind = node.kind.clone();
        // `get[name]` of a fold: the field's position in the reducer's state.
        if let ExprKind::Get(FieldRef::Name(n), x) = &kind {
            if let ExprKind::Reduce {
                reducer: ReducerRef::User(r),
                ..
            } = &body.nodes[x.index()].kind
            {
                if let Some(i) = self
                    .ctx
                    .info
                    .reducer(r)
                    .and_then(|d| d.state.iter().position(|s| s == n))
                {
                    kind = ExprKind::Get(FieldRef::Index(i), *x);
                }
            }
        }
        self.dot_dtypes = match &kind {
            ExprKind::TileMatMul { a, b, .. } | ExprKind::MatMul { a, b, .. } => {
                match (body.ty(*a), body.ty(*b)) {
                    (Some(Type::Tensor(x)), Some(Type::Tensor(y))) => Some((x.dtype, y.dtype)),
                    _ => None,
                }
            }
            _ => None,
        };
        self.op(&kind, vals, ty.as_ref().or(annot.as_ref()), &dim_position)
            .map_err(|m| (id, m))
    }

    /// A view of a constant expression on the view's block `dims` (`lower::walk`'s
    /// `constant_view` plans it): leaves on the block's offsets, elementwise operators on their
    /// operands' views (trailing dimensions for lower ranks), a transpose on the permuted
    /// block, a broadcast on the operand's dimensions (a size-1 one a block of 1), any other
    /// constant, where the view is `whole`, computed whole before (its block is the view's).
    pub(super) fn constant_view(
        &mut self,
        base: NodeId,
        dims: Vec<BlockDim>,
        whole: bool,
        at: NodeId,
    ) -> Result<Val, (NodeId, String)> {
        let body = &self.ctx.f.body;
        let node = &body.nodes[base.index()];
        let dtype = match node.ty.as_ref() {
            Some(Type::Tensor(t)) => t.dtype,
            _ => DType::F32,
        };
        let operand_type = |o: NodeId| match body.ty(o) {
            Some(Type::Tensor(t)) => Ok(t.clone()),
            _ => Err((at, "a view of a tuple constant".to_string())),
        };
        let one = || BlockDim {
            len: "1".into(),
            offs: "tl.arange(0, 1)".into(),
            mask: None,
            name: None,
        };
        let lens = |dims: &[BlockDim]| -> String {
            dims.iter()
                .map(|d| d.len.clone())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match &node.kind {
            ExprKind::Constant(v) => Ok(Val::Tile {
                expr: lit(*v, dtype),
                dims: vec![],
            }),
            ExprKind::Fill(v) => Ok(Val::Tile {
                expr: format!(
                    "tl.full([{}], {}, {})",
                    lens(&dims),
                    lit(*v, dtype),
                    compute_tl(dtype)
                ),
                dims,
            }),
            ExprKind::Iota(d) => {
                let i = match d {
                    DimRef::Index(i) => *i,
                    DimRef::Name(n) => dims
                        .iter()
                        .position(|b| b.name.as_deref() == Some(n))
                        .unwrap_or(0),
                };
                let rank = dims.len();
                // Offsets are int32: an i32 iota keeps them (exact), a float one converts.
                Ok(Val::Tile {
                    expr: format!(
                        "({}){}.to({})",
                        dims.get(i).map(|d| d.offs.clone()).unwrap_or_default(),
                        index_for(rank, i),
                        compute_tl(dtype)
                    ),
                    dims,
                })
            }
            ExprKind::Unary(..)
            | ExprKind::Binary(..)
            | ExprKind::Select(..)
            | ExprKind::Cast(..) => {
                let mut vals = Vec::new();
                for o in node.kind.operands() {
                    let rank = operand_type(o)?.shape.len();
                    let Some(start) = dims.len().checked_sub(rank) else {
                        return Err((at, "a constant operand of higher rank than its view".into()));
                    };
                    vals.push(self.constant_view(o, dims[start..].to_vec(), whole, at)?);
                }
                let (kind, ty) = (node.kind.clone(), node.ty.clone());
                self.op(&kind, vals, ty.as_ref(), &dim_position)
                    .map_err(|m| (at, m))
            }
            ExprKind::Transpose(perm, x) => {
                // Operand dimension perm[i] is the view's dimension i.
                let mut operand: Vec<BlockDim> = vec![one(); dims.len()];
                for (i, p) in perm.iter().enumerate() {
                    match (operand.get_mut(*p), dims.get(i)) {
                        (Some(slot), Some(d)) => *slot = d.clone(),
                        _ => return Err((at, "bad permutation".into())),
                    }
                }
                let v = self.constant_view(*x, operand, whole, at)?;
                match v.tile() {
                    Ok((_, [])) => Ok(v), // a scalar
                    _ => {
                        let (kind, ty) = (node.kind.clone(), node.ty.clone());
                        self.op(&kind, vec![v], ty.as_ref(), &dim_position)
                            .map_err(|m| (at, m))
                    }
                }
            }
            ExprKind::Broadcast(_, x) => {
                let xt = operand_type(*x)?;
                let Some(extra) = dims.len().checked_sub(xt.shape.len()) else {
                    return Err((at, "a broadcast to a lower rank".into()));
                };
                // Right-aligned; a size-1 dimension stretched is a block of 1.
                let operand: Vec<BlockDim> = xt
                    .shape
                    .iter()
                    .zip(&dims[extra..])
                    .map(|(d, b)| match d.base {
                        DimBase::Lit(1) if b.len != "1" => one(),
                        _ => b.clone(),
                    })
                    .collect();
                let v = self.constant_view(*x, operand, whole, at)?;
                let (x, xd) = v.tile().map_err(|m| (at, m))?;
                let expr = if xd.is_empty() {
                    format!("(tl.zeros([{}], {}) + ({x}))", lens(&dims), compute_tl(dtype))
                } else {
                    let kept = vec![":"; xd.len()].join(", ");
                    format!(
                        "tl.broadcast_to(({x})[{}{kept}], [{}])",
                        "None, ".repeat(extra),
                        lens(&dims)
                    )
                };
                Ok(Val::Tile { expr, dims })
            }
            ExprKind::Reduce {
                input,
                over: ReduceOver::Axis(d),
                reducer: ReducerRef::Builtin(_),
                keep_dims,
            } => {
                // The operand on the view's block with the reduced dimension whole, reduced.
                let xt = operand_type(*input)?;
                let i = dim_index(d, &xt).ok_or((at, "a reduction over an unknown dimension".to_string()))?;
                let whole_dims = self.dims_of(&xt);
                let mut operand = dims.clone();
                match (keep_dims, whole_dims.get(i)) {
                    (true, Some(w)) if i < operand.len() => operand[i] = w.clone(),
                    (false, Some(w)) if i <= operand.len() => operand.insert(i, w.clone()),
                    _ => return Err((at, "a reduction over an unknown dimension".into())),
                }
                let v = self.constant_view(*input, operand, whole, at)?;
                let (kind, ty) = (node.kind.clone(), node.ty.clone());
                self.op(&kind, vec![v], ty.as_ref(), &dim_position)
                    .map(|v| match v {
                        // The view's own blocks (its kept dimension of 1 included).
                        Val::Tile { expr, .. } => Val::Tile { expr, dims },
                        other => other,
                    })
                    .map_err(|m| (at, m))
            }
            // Computed whole in the kernel before (`walk`): the view's block is its block.
            _ if whole => self.lookup(base),
            _ => Err((
                at,
                "a split view of a constant expression other than elementwise operators, transposes, broadcasts and built-in reductions".into(),
            )),
        }
    }

    pub(super) fn load(
        &mut self,
        base: NodeId,
        dims: Vec<BlockDim>,
        at: NodeId,
    ) -> Result<Val, (NodeId, String)> {
        let body = &self.ctx.f.body;
        let bnode = &body.nodes[base.index()];
        let g = &self.ctx.g;
        if crate::lower::views::loads_through(body, &g.virtual_view, &g.constant, base) {
            return self.load_view(base, dims, at);
        }
        if self.ctx.g.constant[base.index()] {
            return Err((at, "a load of a constant expression".into()));
        }
        let Some(Type::Tensor(bt)) = bnode.ty.as_ref() else {
            return Err((at, "a load of a tuple".into()));
        };
        // A reshape view is read from the buffer of the value it views, in its own shape.
        let key = (self.ctx.g.storage(base), 0);
        self.load_field(key, &bt.clone(), dims, at)
    }

    /// Loads a tile of the stored tensor `key` of type `bt`.
    pub(super) fn load_field(
        &mut self,
        key: BufferKey,
        bt: &TensorType,
        dims: Vec<BlockDim>,
        at: NodeId,
    ) -> Result<Val, (NodeId, String)> {
        if bt.shape.len() != dims.len() {
            return Err((
                at,
                "a load whose tile rank differs from the tensor's".into(),
            ));
        }
        let addr = self.address(key, &bt.shape, &dims, None)?;
        let mut mask = mask_all(&dims);
        let rank = dims.len();
        // Triton's software pipeliner handles loads in loops of rank 2 only (rank 4 aborts the
        // sm_90 compiler in the async copy, rank 3 when the tile does not feed a dot): a tile
        // of higher rank is loaded with its leading dimensions merged, then reshaped back.
        let merged = (rank > 2).then(|| {
            let lens: Vec<&str> = dims.iter().map(|d| d.len.as_str()).collect();
            let flat = format!("({}, {})", lens[..rank - 1].join(" * "), lens[rank - 1]);
            (flat, format!("({})", lens.join(", ")), lens.join(", "))
        });
        let addr = match &merged {
            Some((flat, _, full)) => {
                mask = mask.map(|m| format!("tl.reshape(tl.broadcast_to({m}, [{full}]), {flat})"));
                format!("tl.reshape({addr}, {flat})")
            }
            None => addr,
        };
        let load = match mask {
            Some(m) => format!("tl.load({addr}, mask={m}, other=0.0)"),
            None => format!("tl.load({addr})"),
        };
        let to = compute_tl(bt.dtype);
        let expr = match &merged {
            Some((_, shape, _)) => format!("tl.reshape({load}, {shape}).to({to})"),
            None => format!("{load}.to({to})"),
        };
        Ok(Val::Tile { expr, dims })
    }

    /// Stores an output of the kernel: a tensor, or each field of a tuple to its own buffer.
    /// A `Store` step at `level`.
    pub(super) fn store(
        &mut self,
        o: NodeId,
        level: Option<usize>,
    ) -> Result<(), (NodeId, String)> {
        self.stored.insert(o);
        let body = &self.ctx.f.body;
        let node = &body.nodes[o.index()];
        let (fields, is_tuple) =
            field_types(node.ty.as_ref()).map_err(|m| (o, format!("a stored value: {m}")))?;
        let (cur, leading) = stored_tile(body, o);
        let v = self.lookup(cur)?;
        let vals = match v {
            Val::Tuple(vs) if is_tuple => vs,
            Val::Tile { .. } if !is_tuple => vec![v],
            _ => return Err((o, "a stored value whose shape differs from its type".into())),
        };
        if vals.len() != fields.len() {
            return Err((o, "a stored tuple with a different number of fields".into()));
        }
        for (i, (v, t)) in vals.iter().zip(&fields).enumerate() {
            let (expr, dims) = v.tile().map_err(|e| (o, e))?;
            let (expr, dims) = (expr.to_string(), dims.to_vec());
            let want = t.shape.len() - usize::from(leading.is_some());
            let mut dims = dims;
            while dims.len() < want {
                dims.insert(
                    0,
                    BlockDim {
                        len: "1".into(),
                        offs: "tl.arange(0, 1)".into(),
                        mask: None,
                        name: None,
                    },
                );
            }
            if dims.len() != want {
                return Err((
                    o,
                    "a stored tile whose rank differs from the tensor's".into(),
                ));
            }
            let lens: Vec<String> = dims.iter().map(|d| d.len.clone()).collect();
            let addr = self.address(
                (o, i),
                &t.shape,
                &dims,
                leading.as_ref().map(|a| format!("c_{a}")),
            )?;
            // Triton has no 0-d blocks: a scalar is stored as the scalar.
            let value = if lens.is_empty() {
                format!("({expr}).to({})", dtype_tl(t.dtype))
            } else {
                format!(
                    "tl.broadcast_to({expr}, [{}]).to({})",
                    lens.join(", "),
                    dtype_tl(t.dtype)
                )
            };
            match mask_all(&dims) {
                Some(m) => self.line_at(level, format!("tl.store({addr}, {value}, mask={m})")),
                None => self.line_at(level, format!("tl.store({addr}, {value})")),
            }
        }
        Ok(())
    }
}

/// The position of a dimension among a tile's blocks (names are the program's dimension names).
pub(super) fn dim_position(d: &DimRef, dims: &[BlockDim]) -> Option<usize> {
    match d {
        DimRef::Index(i) => Some(*i),
        DimRef::Name(n) => dims.iter().position(|b| b.name.as_deref() == Some(n)),
    }
}

pub(super) fn is_simple(e: &str) -> bool {
    e.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        || e.starts_with("float(")
}
