//! Lowering decides how a verified candidate runs on a GPU (`docs/lower.md`):
//!
//! - this module: the kernel graph (below), and traffic and work for `--stats=json`;
//! - [`plan`]: the [`KernelPlan`] (buffers, axes, folds, loads, stores, schedule space, cost
//!   facts) and the one place a construct is refused;
//! - [`walk`]: the order in which a kernel computes its values, and in which loop;
//! - [`mask`]: fold loops that skip the key tiles their mask removes entirely, and traffic and
//!   work counted over the tiles a plan visits;
//! - [`lowerable`]: what no context lowers, judged node by node (extraction prunes by it).
//!
//! # Kernel graphs from tiled programs
//!
//! A kernel is a connected region of tiled values (non-empty parallel state), entered through
//! loads (`partition`/`replicate` chains over a tensor-level value, re-issued by every kernel
//! that reads them) and left through stores (`combination`/`collection`, or a `reduce …
//! parallel=` that folds the last axis away). Axes folded by `reduce … parallel=` inside a
//! kernel are its loop axes; every other axis indexes output tiles and is a grid axis. A loop
//! axis is a grid axis too when an output stored along it reads the fold's result
//! (`stored_after_fold`): each program folds over every tile, then stores its own. A
//! tensor-level operator outside any region is a kernel of its own (its default tiling).
//! Constant expressions (built from `fill`/`constant`/`iota` only) are computed inline where
//! they are used. A tensor-level `reshape` of a stored value (an input, or a value some kernel
//! stores, all of them contiguous and row-major) is a *view*: no kernel computes it, and its
//! readers load the stored value's buffer with the reshape's shape (`reshape_view`). A
//! reshape that is a result is a view too where a kernel writes the value it views: the host
//! returns that buffer reshaped (the same bytes, no copy); of an input, it is copied by a
//! kernel of its own (a result never aliases an input). Launch order follows data
//! dependencies.

pub mod lowerable;
pub mod mask;
pub mod plan;
pub mod views;
pub mod walk;

pub use plan::{plan, KernelPlan, Refusal, Schedule};

use crate::ir::*;
use std::collections::{BTreeSet, HashMap};

#[derive(Clone, Debug)]
pub struct Kernel {
    /// Compute nodes of the kernel, operands first (loads are emitted where they are used).
    pub nodes: Vec<NodeId>,
    /// Tensor-level values the kernel writes.
    pub outputs: Vec<NodeId>,
    /// Tensor-level values the kernel reads (through loads or whole).
    pub reads: Vec<NodeId>,
    pub grid_axes: Vec<String>,
    pub loop_axes: Vec<String>,
    /// A tensor-level operator outside any tiled region.
    pub default_tiled: bool,
}

#[derive(Clone, Debug, Default)]
pub struct KernelGraph {
    /// In launch order.
    pub kernels: Vec<Kernel>,
    /// Tensor-level intermediates: written by one kernel, read by another.
    pub intermediates: Vec<NodeId>,
    /// Whether each node is a constant expression.
    pub constant: Vec<bool>,
    /// For each load (view chain node), the tensor-level value it reads.
    pub load_base: Vec<Option<NodeId>>,
    /// For each tensor-level `reshape` that is a view, the stored value whose buffer it reads
    /// (through any chain of such reshapes): see [`reshape_views`].
    pub reshape_view: Vec<Option<NodeId>>,
    /// Tuple plumbing at tensor level outside any kernel (`tuple`, and `get` of one): no
    /// kernel computes it; its readers take the fields.
    pub plumbing: Vec<bool>,
    /// Whether the kernels can be launched in some order: no kernel reads a global-memory
    /// value it writes itself, directly or through other kernels.
    pub launch_order: bool,
    /// Tensor-level `slice`s and `concat`s: views that their readers load through (see
    /// [`views`]); no kernel computes one unless it is a result.
    pub virtual_view: Vec<bool>,
}

pub fn tiled(t: Option<&Type>) -> bool {
    match t {
        Some(Type::Tensor(t)) => !t.par.is_empty(),
        Some(Type::Tuple(ts)) => ts.iter().any(|t| tiled(Some(t))),
        None => false,
    }
}

fn is_leaf(k: &ExprKind) -> bool {
    matches!(
        k,
        ExprKind::Input
            | ExprKind::Param
            | ExprKind::Constant(_)
            | ExprKind::Fill(_)
            | ExprKind::Iota(_)
    )
}

/// Loads and constant expressions of a function's body.
pub fn loads_and_constants(body: &Body) -> (Vec<Option<NodeId>>, Vec<bool>) {
    let nodes = &body.nodes;
    let mut load_base: Vec<Option<NodeId>> = vec![None; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        if let ExprKind::Partition(_, _, o) | ExprKind::Replicate(_, o) = node.kind {
            load_base[i] = if tiled(nodes[o.index()].ty.as_ref()) {
                load_base[o.index()]
            } else {
                Some(o)
            };
        }
    }
    let mut constant = vec![false; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        constant[i] = match &node.kind {
            ExprKind::Input => false,
            k if is_leaf(k) => true,
            k => {
                !tiled(node.ty.as_ref())
                    && !k.operands().is_empty()
                    && k.operands().iter().all(|o| constant[o.index()])
            }
        };
    }
    (load_base, constant)
}

/// The tensor-level reshapes that are views of a stored value, with the value whose buffer
/// they read: a `reshape` of a tensor-level operand that is neither a constant expression
/// (computed where it is read, it has no buffer) nor tuple plumbing (a `slice` or `concat` it
/// reads is stored by a kernel of its own, `views::virtual_views`), and, if it is a result,
/// whose viewed value is no input (a result never aliases an input's buffer). A stored
/// tensor is contiguous and row-major, so its buffer read with the reshape's shape and
/// row-major strides is the reshaped tensor: a result that is a view is that buffer,
/// reshaped by the host.
pub fn reshape_views(body: &Body, constant: &[bool], plumbing: &[bool]) -> Vec<Option<NodeId>> {
    let mut view: Vec<Option<NodeId>> = vec![None; body.nodes.len()];
    for (i, node) in body.nodes.iter().enumerate() {
        let ExprKind::Reshape(_, x) = node.kind else {
            continue;
        };
        let base = view[x.index()].unwrap_or(x);
        let viewable = x.index() < i
            && !tiled(node.ty.as_ref())
            && !tiled(body.ty(x))
            && !constant[x.index()]
            && !plumbing[x.index()]
            && (!body.results.contains(&NodeId(i as u32)) || written_whole(&body.node(base).kind));
        if viewable {
            view[i] = Some(base);
        }
    }
    view
}

/// Whether a tensor-level value of this kind, where some kernel stores it, has a buffer of
/// its own that a result may be a view of: not an input (a result never aliases one) and not
/// a tuple's field. (A `slice` or `concat` a reshape reads is stored: `views::virtual_views`.)
fn written_whole(kind: &ExprKind) -> bool {
    !is_leaf(kind) && !matches!(kind, ExprKind::Get(..) | ExprKind::Tuple(_))
}

/// Tuple plumbing at tensor level as far as it is known before the kernels are: a `tuple`
/// outside any tiled region, and a `get` of one.
pub fn early_plumbing(body: &Body) -> Vec<bool> {
    let nodes = &body.nodes;
    let mut p = vec![false; nodes.len()];
    for i in 0..nodes.len() {
        p[i] = !in_region_of(nodes, i)
            && match nodes[i].kind {
                ExprKind::Tuple(_) => true,
                ExprKind::Get(_, t) => p[t.index()],
                _ => false,
            };
    }
    p
}

/// The collection under `replicate[a](collection[a](x))` (every tile reading the whole stack,
/// as an all-reduce across tiles does), else `x` itself.
pub fn stack_of(body: &Body, x: NodeId) -> NodeId {
    if let ExprKind::Replicate(a, inner) = &body.node(x).kind {
        if matches!(&body.node(*inner).kind, ExprKind::Collection(b, _) if b == a) {
            return *inner;
        }
    }
    x
}

/// The axes a stored output is written along: its chain of `combination`s, and the axis of
/// a `collection` (one slice of its stack per tile).
pub fn store_axes(body: &Body, mut o: NodeId) -> Vec<String> {
    let mut axes = Vec::new();
    while let ExprKind::Combination(_, a, x) = &body.node(o).kind {
        axes.push(a.to_string());
        o = *x;
    }
    if let ExprKind::Collection(a, _) = &body.node(o).kind {
        axes.push(a.to_string());
    }
    axes
}

/// Whether output `o`, stored along axis `a`, reads the result of a fold over `a` computed
/// in its kernel (`kernel`): then it is stored once per tile of `a` after that fold's loop,
/// with `a` a grid axis as well (`combination[a](… replicate[a](reduce … parallel=a) …)`), not
/// tile by tile inside the loop.
pub fn stored_after_fold(body: &Body, o: NodeId, a: &str, kernel: &BTreeSet<NodeId>) -> bool {
    if !store_axes(body, o).iter().any(|x| x == a) {
        return false;
    }
    let mut seen = BTreeSet::new();
    let mut stack = vec![o];
    while let Some(n) = stack.pop() {
        if !seen.insert(n) {
            continue;
        }
        let folds_a = match &body.node(n).kind {
            ExprKind::Reduce {
                over: ReduceOver::Parallel(p),
                ..
            } => p.as_str() == a,
            _ => collection_fold_axis(body, n).is_some_and(|p| p.as_str() == a),
        };
        if folds_a && kernel.contains(&n) {
            return true;
        }
        stack.extend(
            body.node(n)
                .kind
                .operands()
                .into_iter()
                .filter(|m| kernel.contains(m)),
        );
    }
    false
}

/// The axis of `reduce (collection[a](x)) axis=0` inside a region (or of
/// `reduce (replicate[a](collection[a](x))) axis=0`): a fold over `a` written as a collection
/// of per-tile values reduced along the stack, which a kernel computes as a loop over `a`
/// instead of storing the stack.
pub fn collection_fold_axis(body: &Body, id: NodeId) -> Option<&crate::ir::Sym> {
    let ExprKind::Reduce {
        input,
        over: ReduceOver::Axis(d),
        ..
    } = &body.node(id).kind
    else {
        return None;
    };
    let ExprKind::Collection(a, _) = &body.node(stack_of(body, *input)).kind else {
        return None;
    };
    // A stacked tuple (a user reducer's items): every field is stacked along dimension 0.
    let t = match body.ty(stack_of(body, *input))? {
        Type::Tensor(t) => t,
        Type::Tuple(ts) => ts.first()?.as_tensor()?,
    };
    let stacked = crate::ir::resolve_dim(&t.shape, d).ok() == Some(0);
    (stacked && !t.par.is_empty()).then_some(a)
}

/// Partitions a verified candidate into kernels, in launch order when there is one.
pub fn kernel_graph(f: &Function) -> KernelGraph {
    let body = &f.body;
    let nodes = &body.nodes;
    let n = nodes.len();
    let (load_base, constant) = loads_and_constants(body);
    let virtual_view = views::virtual_views(body, &constant);
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    // Constant expressions are computed inline where they are read; one that is a result is
    // read by no kernel, so it is a kernel of its own (else the host would return nothing).
    let result: Vec<bool> = (0..n)
        .map(|i| body.results.contains(&NodeId(i as u32)))
        .collect();
    let reshape_view = reshape_views(body, &constant, &early_plumbing(body));
    let skip = |i: usize| {
        (!(constant[i] && result[i])
            && (is_leaf(&nodes[i].kind)
                || constant[i]
                || load_base[i].is_some()
                || reshape_view[i].is_some()))
            || (virtual_view[i] && !result[i])
    };
    let in_region = |i: usize| in_region_of(nodes, i);
    let mut region = vec![false; n];
    for i in 0..n {
        if skip(i) {
            continue;
        }
        region[i] = in_region(i);
        if region[i] {
            for o in nodes[i].kind.operands() {
                let o = o.index();
                if load_base[o].is_none() && tiled(nodes[o].ty.as_ref()) {
                    let (a, b) = (find(&mut parent, i), find(&mut parent, o));
                    parent[a] = b;
                }
            }
        }
    }
    // A tensor-level `get` of a computed tuple belongs to the tuple's kernel; a tensor-level
    // `tuple` (and a `get` of one) is plumbing that launches nothing.
    let mut kernel_of: Vec<Option<usize>> = vec![None; n];
    let mut plumbing = vec![false; n];
    let mut roots: Vec<usize> = Vec::new();
    let mut kernel_of_root: HashMap<usize, usize> = HashMap::new();
    for i in 0..n {
        if skip(i) {
            continue;
        }
        let r = if region[i] {
            find(&mut parent, i)
        } else {
            match nodes[i].kind {
                ExprKind::Tuple(_) => {
                    plumbing[i] = true;
                    continue;
                }
                ExprKind::Get(_, t) => match kernel_of[t.index()] {
                    Some(k) => {
                        kernel_of[i] = Some(k);
                        continue;
                    }
                    None => {
                        plumbing[i] = true;
                        continue;
                    }
                },
                _ => i,
            }
        };
        let k = *kernel_of_root.entry(r).or_insert_with(|| {
            roots.push(r);
            roots.len() - 1
        });
        kernel_of[i] = Some(k);
    }
    let mut kernels: Vec<Kernel> = roots
        .iter()
        .map(|r| Kernel {
            nodes: Vec::new(),
            outputs: Vec::new(),
            reads: Vec::new(),
            grid_axes: Vec::new(),
            loop_axes: Vec::new(),
            default_tiled: !region[*r],
        })
        .collect();
    // Readers of each value: kernels (through loads and plumbing) and `None` for a result.
    // A `get` reading its own kernel's tuple is not a read of global memory.
    let mut used_by: Vec<BTreeSet<Option<usize>>> = vec![BTreeSet::new(); n];
    for r in &body.results {
        used_by[r.index()].insert(None);
    }
    for i in (0..n).rev() {
        for o in nodes[i].kind.operands() {
            let o = load_base[o.index()].map_or(o.index(), |b| b.index());
            // A reshape view's readers read the value it views.
            if plumbing[i] || reshape_view[i].is_some() {
                let readers = used_by[i].clone();
                used_by[o].extend(readers);
            } else if virtual_view[i] {
                // Kernels that read a view read its operands; a view that is a result is
                // written by a kernel of its own, which reads them too.
                let readers: Vec<Option<usize>> =
                    used_by[i].iter().filter(|r| r.is_some()).copied().collect();
                used_by[o].extend(readers);
                if let Some(k) = kernel_of[i] {
                    used_by[o].insert(Some(k));
                }
            } else if kernel_of[i].is_some()
                && !(matches!(nodes[i].kind, ExprKind::Get(..)) && kernel_of[i] == kernel_of[o])
            {
                used_by[o].insert(kernel_of[i]);
            }
        }
        if virtual_view[i] {
            used_by[i].retain(|r| r.is_none());
        }
    }
    let mut edges: Vec<(usize, usize)> = Vec::new();
    let mut intermediates = Vec::new();
    let mut self_read = false;
    for i in 0..n {
        let Some(k) = kernel_of[i] else { continue };
        kernels[k].nodes.push(NodeId(i as u32));
        if !tiled(nodes[i].ty.as_ref()) && !used_by[i].is_empty() {
            kernels[k].outputs.push(NodeId(i as u32));
            for u in used_by[i].iter().flatten() {
                if *u == k {
                    self_read = true;
                    continue;
                }
                edges.push((k, *u));
                if !kernels[*u].reads.contains(&NodeId(i as u32)) {
                    kernels[*u].reads.push(NodeId(i as u32));
                }
            }
            if used_by[i].iter().any(|u| u.is_some_and(|u| u != k)) {
                intermediates.push(NodeId(i as u32));
            }
        }
        // Axes.
        let mut axes: Vec<crate::ir::Sym> = Vec::new();
        let note = |t: &Type, axes: &mut Vec<crate::ir::Sym>| {
            let mut stack = vec![t];
            while let Some(t) = stack.pop() {
                match t {
                    Type::Tensor(t) => {
                        for a in t.par.axes() {
                            if !axes.contains(a) {
                                axes.push(*a);
                            }
                        }
                    }
                    Type::Tuple(ts) => stack.extend(ts),
                }
            }
        };
        if let Some(t) = nodes[i].ty.as_ref() {
            note(t, &mut axes);
        }
        for o in nodes[i].kind.operands() {
            if let Some(t) = nodes[o.index()].ty.as_ref() {
                note(t, &mut axes);
            }
        }
        let folded = match &nodes[i].kind {
            ExprKind::Reduce {
                over: ReduceOver::Parallel(a),
                ..
            } => Some(a),
            _ => collection_fold_axis(body, NodeId(i as u32)),
        };
        if let Some(a) = folded {
            if !kernels[k]
                .loop_axes
                .iter()
                .any(|x| x.as_str() == a.as_str())
            {
                kernels[k].loop_axes.push(a.to_string());
            }
        }
        for a in axes {
            if !kernels[k]
                .grid_axes
                .iter()
                .any(|x| x.as_str() == a.as_str())
            {
                kernels[k].grid_axes.push(a.to_string());
            }
        }
    }
    for k in &mut kernels {
        let loops = k.loop_axes.clone();
        // A loop axis indexes output tiles too when an output stored along it reads the
        // fold's result: that store comes after the loop, once per tile of the grid.
        let in_kernel: BTreeSet<NodeId> = k.nodes.iter().copied().collect();
        let also_grid: Vec<String> = loops
            .iter()
            .filter(|a| {
                k.outputs
                    .iter()
                    .any(|o| stored_after_fold(body, *o, a, &in_kernel))
            })
            .cloned()
            .collect();
        k.grid_axes
            .retain(|a| !loops.contains(a) || also_grid.contains(a));
        k.grid_axes.sort();
    }
    // Launch order: a topological order of the read edges, lowest kernel first.
    let count = kernels.len();
    let mut indeg = vec![0usize; count];
    edges.sort();
    edges.dedup();
    for (_, b) in &edges {
        indeg[*b] += 1;
    }
    let mut order = Vec::new();
    let mut ready: BTreeSet<usize> = (0..count).filter(|k| indeg[*k] == 0).collect();
    while let Some(k) = ready.pop_first() {
        order.push(k);
        // The edges are sorted: those leaving k are one run.
        let from = edges.partition_point(|e| e.0 < k);
        for (_, b) in edges[from..].iter().take_while(|e| e.0 == k) {
            indeg[*b] -= 1;
            if indeg[*b] == 0 {
                ready.insert(*b);
            }
        }
    }
    let launch_order = !self_read && order.len() == count;
    // Without a launch order, kernels stay in first-node order.
    let mut ordered = vec![false; count];
    for k in &order {
        ordered[*k] = true;
    }
    let missing: Vec<usize> = (0..count).filter(|k| !ordered[*k]).collect();
    order.extend(missing);
    let mut by_index: HashMap<usize, Kernel> = kernels.into_iter().enumerate().collect();
    let kernels = order
        .into_iter()
        .filter_map(|k| by_index.remove(&k))
        .collect();
    KernelGraph {
        kernels,
        intermediates,
        constant,
        load_base,
        reshape_view,
        plumbing,
        launch_order,
        virtual_view,
    }
}

/// Whether node `i` lies in a tiled region: tiled itself, or reading a tiled operand.
fn in_region_of(nodes: &[Node], i: usize) -> bool {
    tiled(nodes[i].ty.as_ref())
        || nodes[i]
            .kind
            .operands()
            .iter()
            .any(|o| tiled(nodes[o.index()].ty.as_ref()))
}

impl KernelGraph {
    /// The node whose buffer holds tensor-level value `x`: the value a reshape view reads, else
    /// `x` itself.
    pub fn storage(&self, x: NodeId) -> NodeId {
        self.reshape_view
            .get(x.index())
            .copied()
            .flatten()
            .unwrap_or(x)
    }
}

/// Traffic and work of a lowered candidate, for `--stats=json` and ranking.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Cost {
    pub kernels: usize,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub flops: u64,
}

/// Saturating: sizes come from the program's `where` clause, which may be any u64.
fn elements(t: &TensorType, bindings: &[Binding]) -> u64 {
    t.shape
        .iter()
        .map(|d| {
            d.eval(&|s| bindings.iter().find(|b| b.name == s).map(|b| b.value))
                .unwrap_or(1)
        })
        .fold(1u64, u64::saturating_mul)
}

/// Bytes each kernel reads and writes in global memory (every read value once per kernel)
/// and floating-point work (2·M·N·K per matrix product, one per element otherwise), at the
/// function's `where` sizes.
pub fn cost(f: &Function, g: &KernelGraph) -> Cost {
    let mut c = Cost {
        kernels: g.kernels.len(),
        ..Cost::default()
    };
    for k in &g.kernels {
        let kc = kernel_cost(f, g, k);
        c.bytes_read = c.bytes_read.saturating_add(kc.bytes_read);
        c.bytes_written = c.bytes_written.saturating_add(kc.bytes_written);
        c.flops = c.flops.saturating_add(kc.flops);
    }
    c
}

/// [`cost`] of one kernel.
pub fn kernel_cost(f: &Function, g: &KernelGraph, k: &Kernel) -> Cost {
    let body = &f.body;
    let bytes = |id: &NodeId| -> u64 {
        let mut total = 0u64;
        let mut stack: Vec<&Type> = body.ty(*id).into_iter().collect();
        while let Some(t) = stack.pop() {
            match t {
                Type::Tensor(t) => {
                    total = total.saturating_add(
                        elements(t, &f.bindings).saturating_mul(t.dtype.size_bytes()),
                    );
                }
                Type::Tuple(ts) => stack.extend(ts),
            }
        }
        total
    };
    let mut c = Cost {
        kernels: 1,
        ..Cost::default()
    };
    // One block, so that the lines read as they did inside the loop over kernels.
    {
        let mut reads: BTreeSet<NodeId> = k.reads.iter().copied().collect();
        for id in &k.nodes {
            for o in body.node(*id).kind.operands() {
                if let Some(b) = g.load_base[o.index()] {
                    // A view of a constant expression is computed where it is used.
                    if !g.constant[b.index()] {
                        reads.insert(g.storage(b));
                    }
                } else if matches!(
                    body.node(g.storage(o)).kind,
                    ExprKind::Input | ExprKind::Param
                ) {
                    // A tensor-level operator reads an input whole (or through a reshape
                    // view), with no view between.
                    reads.insert(g.storage(o));
                }
            }
        }
        let sum =
            |ids: &mut dyn Iterator<Item = &NodeId>| ids.map(bytes).fold(0u64, u64::saturating_add);
        c.bytes_read = c.bytes_read.saturating_add(sum(&mut reads.iter()));
        c.bytes_written = c.bytes_written.saturating_add(sum(&mut k.outputs.iter()));
        for id in &k.nodes {
            let node = body.node(*id);
            let Some(Type::Tensor(out)) = node.ty.as_ref() else {
                continue;
            };
            let n = elements(out, &f.bindings);
            let work = match &node.kind {
                ExprKind::TileMatMul { a, .. } | ExprKind::MatMul { a, .. } => {
                    let k_len = match body.ty(*a) {
                        Some(Type::Tensor(t)) => t
                            .shape
                            .last()
                            .and_then(|d| {
                                d.eval(&|s| {
                                    f.bindings.iter().find(|b| b.name == s).map(|b| b.value)
                                })
                                .ok()
                            })
                            .unwrap_or(1),
                        _ => 1,
                    };
                    n.saturating_mul(k_len).saturating_mul(2)
                }
                ExprKind::Unary(..) | ExprKind::Binary(..) | ExprKind::Select(..) => n,
                ExprKind::Reduce { input, .. } => match body.ty(*input) {
                    Some(Type::Tensor(t)) => elements(t, &f.bindings),
                    _ => n,
                },
                _ => 0,
            };
            c.flops = c.flops.saturating_add(work);
        }
    }
    c
}
