//! Rebuilding a candidate as a function, and its one-line summary.

use super::canon::{Interner, Walk, WalkFacts};
use super::extract_graph::ExtractGraph;
use super::{Choice, NONE};
use crate::egraph::lang::Op;
use crate::ir::{Body, ExprKind, Function, Node, NodeId, Sym, Type};
use rustc_hash::FxHashMap;

/// Facts about a candidate for its summary line and `--stats=json`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    /// Kernel launches: each connected region of tiled values, plus one per tensor-level
    /// operator left outside any region (its default tiling).
    pub kernels: usize,
    /// Tensor-level intermediates written by one kernel and read by another.
    pub stored: Vec<String>,
    pub axes: Vec<String>,
    /// False when kernels would read global-memory values they write themselves: such a
    /// candidate has no launch order and is not lowerable.
    pub launch_order: bool,
}

impl Summary {
    pub fn line(&self) -> String {
        let stored = if self.stored.is_empty() {
            "none".to_string()
        } else {
            self.stored.join(", ")
        };
        let axes = if self.axes.is_empty() {
            "none".to_string()
        } else {
            self.axes.join(", ")
        };
        format!(
            "{} kernel{}; stored: {stored}; parallel axes: {axes}",
            self.kernels,
            if self.kernels == 1 { "" } else { "s" }
        )
    }
}

/// Rebuilds candidate `choice` as a function named `name` (verified types filled in).
pub fn reconstruct(x: &ExtractGraph, choice: &Choice, name: &str) -> Function {
    let eg = &x.g.egraph;
    let alias = shared_classes(x, choice);
    let mut body = Body::default();
    // Inputs first, in parameter order: every input of the source, reachable or not.
    let mut inputs: Vec<(u32, u32)> = Vec::new();
    for (c, ns) in x.nodes.iter().enumerate() {
        for (n, _) in ns {
            if let Op::Input(pos, _) = n.op {
                inputs.push((pos, c as u32));
            }
        }
    }
    inputs.sort();
    inputs.dedup_by_key(|i| i.0);
    let mut node_of: Vec<Option<NodeId>> = vec![None; x.ids.len()];
    for (_, c) in &inputs {
        let Some((n, _)) = x.nodes[*c as usize]
            .iter()
            .find(|(n, _)| matches!(n.op, Op::Input(..)))
        else {
            continue;
        };
        let id = body.push(Node {
            kind: ExprKind::Input,
            name: None,
            annot: n.leaf_type(),
            span: Default::default(),
            ty: eg[x.ids[*c as usize]].data.clone(),
        });
        body.params.push(id);
        node_of[*c as usize] = Some(id);
    }
    // Post-order from the results.
    let mut stack: Vec<(u32, bool)> = x
        .roots
        .iter()
        .rev()
        .map(|r| (alias[*r as usize], false))
        .collect();
    while let Some((c, done)) = stack.pop() {
        if node_of[c as usize].is_some() {
            continue;
        }
        let Some((n, kids)) = x.op(c, choice) else {
            continue;
        };
        if done {
            let operands: Vec<NodeId> = kids
                .iter()
                .map(|k| node_of[alias[*k as usize] as usize].unwrap_or(NodeId(0)))
                .collect();
            let id = body.push(Node {
                kind: n.to_expr_kind().with_operands(&operands),
                name: None,
                annot: n.leaf_type(),
                span: Default::default(),
                ty: eg[x.ids[c as usize]].data.clone(),
            });
            node_of[c as usize] = Some(id);
        } else {
            stack.push((c, true));
            stack.extend(kids.iter().rev().map(|k| (alias[*k as usize], false)));
        }
    }
    body.results = x
        .roots
        .iter()
        .map(|r| node_of[alias[*r as usize] as usize].unwrap_or(NodeId(0)))
        .collect();
    tile_view_results(&mut body);
    Function {
        name: name.to_string(),
        name_span: x.g.name_span,
        bindings: x.g.bindings.clone(),
        body,
        comment: None,
        schedule: None,
    }
}

/// A result that is a tensor-level reshape or concat of tensor-level values (`return
/// reshape[TxNHxD](y)`, `return concat[1](a, b)`) is copied into the result's buffer by a
/// kernel of its own. Written as it is, that kernel is one program holding the whole tensor,
/// which no schedule holds for any real size; it is returned as
/// `combination[0,a](combination[1,b](partition[1,b](partition[0,a](reshape[…](y)))))`
/// instead, the same value, so the reshape or concat is a view its tiles load and the copy
/// kernel has a grid along the result's first two dimensions (not a concat's own). The
/// e-graph cannot hold this form: the tiles' class would be the result's own, a cycle no
/// program can pick.
///
/// A reshape of a value some kernel writes is no copy at all: the lowering makes it a view
/// (`lower::reshape_views`), the host returning that buffer reshaped. Only a reshape of an
/// input (a result never aliases one) is tiled so. A broadcast result is tiled too, as the
/// broadcast of its operand's tiles: `combination[1,h](broadcast[BxH](partition[0,h](y)))`,
/// with a grid along the dimensions the operand has whole.
///
/// A tensor-level slice or concat that a tensor-level reshape reads (`reshape[TxHD](concat[2](
/// a, b))`, the merged heads of a rotation) is stored by a copy kernel of its own
/// (`lower::views::virtual_views`): its elements are no row-major run of its operands'
/// buffers. That copy is tiled the same way, and the reshape views its buffer.
fn tile_view_results(body: &mut Body) {
    let (_, constant) = crate::lower::loads_and_constants(body);
    // One copy per view, however many reshapes read it.
    let mut copies: FxHashMap<NodeId, Option<NodeId>> = FxHashMap::default();
    for i in 0..body.nodes.len() {
        let ExprKind::Reshape(shape, x) = body.nodes[i].kind.clone() else {
            continue;
        };
        let xi = x.index();
        let joined = match &body.node(x).kind {
            ExprKind::Concat(crate::ir::DimRef::Index(j), _) => Some(*j),
            ExprKind::Slice(..) => None,
            _ => continue,
        };
        if constant[xi]
            || crate::lower::tiled(body.nodes[i].ty.as_ref())
            || crate::lower::tiled(body.ty(x))
        {
            continue;
        }
        let Some(Type::Tensor(xt)) = body.ty(x).cloned() else {
            continue;
        };
        let copy = match copies.get(&x) {
            Some(c) => *c,
            None => {
                let c = tiled_copy(body, x, &xt, joined, None);
                copies.insert(x, c);
                c
            }
        };
        if let Some(copy) = copy {
            body.nodes[i].kind = ExprKind::Reshape(shape, copy);
        }
    }
    // The copies follow the reshapes that now read them: operands first again.
    reorder(body);
    let (_, constant) = crate::lower::loads_and_constants(body);
    let views = crate::lower::reshape_views(body, &constant, &crate::lower::early_plumbing(body));
    for k in 0..body.results.len() {
        let r = body.results[k];
        if views[r.index()].is_some() {
            continue;
        }
        let Some(Type::Tensor(t)) = body.node(r).ty.clone() else {
            continue;
        };
        // The operands, and the dimension a concat joins. (A broadcast: its shape, operand
        // and operand type, and the rank it adds.)
        let (operands, joined, bcast) = match &body.node(r).kind {
            ExprKind::Reshape(_, y) => (vec![*y], None, None),
            ExprKind::Concat(crate::ir::DimRef::Index(j), ys) => (ys.clone(), Some(*j), None),
            ExprKind::Broadcast(shape, y) => {
                let Some(Type::Tensor(yt)) = body.ty(*y) else {
                    continue;
                };
                let off = t.rank().saturating_sub(yt.rank());
                (vec![*y], None, Some((shape.clone(), *y, yt.clone(), off)))
            }
            _ => continue,
        };
        if operands.iter().any(|y| crate::lower::tiled(body.ty(*y))) {
            continue;
        }
        if let Some(whole) = tiled_copy(body, r, &t, joined, bcast) {
            body.results[k] = whole;
        }
    }
    reorder(body);
}

/// A broadcast a tiled copy applies to its operand's tiles: its shape, operand, operand type,
/// and the rank it adds.
type TiledBroadcast = (Vec<crate::ir::Dim>, NodeId, crate::ir::TensorType, usize);

/// `combination[0,a](combination[1,b](partition[1,b](partition[0,a](v))))` for the
/// tensor-level value `v` of type `t`: the same value, copied by a kernel with a grid along
/// the first two dimensions of `t` a tile may split — not literal 1s (a grid of one program
/// tiles nothing), not a concat's `joined` dimension, and for a broadcast (`bcast`, applied
/// to tiles of its operand instead: a tensor-level broadcast of a stored value is no view
/// tiles can load through) only a dimension its operand has whole (one it adds or stretches
/// from 1 cannot be split through it, so the tile holds it whole). `None` where no dimension
/// can be split or `v` is tiled already.
fn tiled_copy(
    body: &mut Body,
    v: NodeId,
    t: &crate::ir::TensorType,
    joined: Option<usize>,
    bcast: Option<TiledBroadcast>,
) -> Option<NodeId> {
    if !t.par.is_empty() {
        return None;
    }
    let splittable = |d: usize| {
        Some(d) != joined
            && bcast
                .as_ref()
                .is_none_or(|(_, _, yt, off)| d >= *off && yt.shape[d - off] == t.shape[d])
    };
    // One grid axis left a 1024×64 head of a merged-heads result per program, more than any
    // schedule holds: two.
    let pick = |splittable: &dyn Fn(usize) -> bool| -> Vec<(usize, String)> {
        (0..t.rank())
            .filter(|d| !t.shape[*d].is_one() && splittable(*d))
            .filter_map(|d| crate::egraph::rules::axis_at(&t.shape, d).map(|a| (d, a)))
            .take(2)
            .collect()
    };
    let mut dims = pick(&splittable);
    // A broadcast of one element (a scalar, a `1x1`) has no dimension to split through: its
    // tiles are `partition(fill[1.0]) * replicate(y)` instead, exactly `y` in every element
    // (`y * 1` is `y` for every value, infinities, NaN and -0 included).
    let one_element = dims.is_empty()
        && bcast
            .as_ref()
            .is_some_and(|(_, _, yt, _)| yt.shape.iter().all(|d| d.is_one()));
    if one_element {
        dims = pick(&|_| true);
    }
    // Axes no kernel of the program has: the copy's block sizes are its own.
    let mut used: std::collections::BTreeSet<Sym> = body
        .nodes
        .iter()
        .filter_map(|n| match &n.ty {
            Some(Type::Tensor(t)) => Some(t.par.axes().cloned().collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect();
    let mut grid = Vec::new();
    for (d, axis) in dims {
        let Some(axis) = (0..64)
            .map(|i| Sym::from(crate::egraph::rules::nth_axis(&axis, i).as_str()))
            .find(|a| !used.contains(a))
        else {
            continue;
        };
        used.insert(axis);
        grid.push((d, axis));
    }
    if grid.is_empty() {
        return None;
    }
    // partition[d1,b](partition[d0,a](v)), then the combinations in reverse.
    let off = bcast.as_ref().map_or(0, |b| b.3);
    let (start, mut tile) = match &bcast {
        _ if one_element => {
            let ones = body.push(Node {
                kind: ExprKind::Fill(1.0),
                name: None,
                annot: Some(Type::Tensor(t.clone())),
                span: Default::default(),
                ty: Some(Type::Tensor(t.clone())),
            });
            (ones, t.clone())
        }
        Some((_, y, yt, _)) => (*y, yt.clone()),
        None => (v, t.clone()),
    };
    let off = if one_element { 0 } else { off };
    let mut push = |kind, t| {
        body.push(Node {
            kind,
            name: None,
            annot: None,
            span: Default::default(),
            ty: Some(Type::Tensor(t)),
        })
    };
    let mut whole = start;
    for (d, axis) in &grid {
        tile.par
            .0
            .insert(*axis, crate::ir::ParKind::Partition(d - off));
        whole = push(
            ExprKind::Partition(crate::ir::DimRef::Index(d - off), *axis, whole),
            tile.clone(),
        );
    }
    // The value's type at each level of the combinations: its grid axes up to it.
    let mut levels = vec![t.clone()];
    for (d, axis) in &grid {
        let mut next = levels.last().cloned().unwrap_or_else(|| t.clone());
        next.par.0.insert(*axis, crate::ir::ParKind::Partition(*d));
        levels.push(next);
    }
    if let Some((shape, y, mut yt, _)) = bcast {
        let ty = levels.last().cloned().unwrap_or_else(|| t.clone());
        whole = if one_element {
            let mut replica = y;
            for (_, axis) in &grid {
                yt.par.0.insert(*axis, crate::ir::ParKind::Replicate);
                replica = push(ExprKind::Replicate(*axis, replica), yt.clone());
            }
            push(
                ExprKind::Binary(crate::ir::BinaryOp::Multiply, whole, replica),
                ty,
            )
        } else {
            push(ExprKind::Broadcast(shape, whole), ty)
        };
    }
    for (i, (d, axis)) in grid.iter().enumerate().rev() {
        whole = push(
            ExprKind::Combination(crate::ir::DimRef::Index(*d), *axis, whole),
            levels[i].clone(),
        );
    }
    Some(whole)
}

/// Puts the nodes in an order where each follows its operands (a rewritten operand may come
/// later than its reader), parameters first in their order, and drops the nodes no result
/// reads (a broadcast result replaced by its tiled form leaves the tensor-level broadcast
/// unread; lowered, it would still be a kernel). Otherwise the order is kept: operands in a
/// depth-first walk from the results, as `reconstruct` builds them.
fn reorder(body: &mut Body) {
    let n = body.nodes.len();
    let mut new_id: Vec<Option<NodeId>> = vec![None; n];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for p in &body.params {
        if new_id[p.index()].is_none() {
            new_id[p.index()] = Some(NodeId(order.len() as u32));
            order.push(p.index());
        }
    }
    // Post-order, operands in order, from each result in turn.
    let mut stack: Vec<(usize, bool)> = body
        .results
        .iter()
        .rev()
        .map(|r| (r.index(), false))
        .collect();
    while let Some((i, done)) = stack.pop() {
        if new_id[i].is_some() {
            continue;
        }
        if done {
            new_id[i] = Some(NodeId(order.len() as u32));
            order.push(i);
        } else {
            stack.push((i, true));
            let ops = body.nodes[i].kind.operands();
            stack.extend(ops.iter().rev().map(|o| (o.index(), false)));
        }
    }
    if order.iter().enumerate().all(|(k, i)| k == *i) && order.len() == n {
        return;
    }
    let mut old: Vec<Option<Node>> = std::mem::take(&mut body.nodes)
        .into_iter()
        .map(Some)
        .collect();
    body.nodes = order
        .iter()
        .filter_map(|&i| {
            let node = old[i].take()?;
            let ops: Vec<NodeId> = node
                .kind
                .operands()
                .iter()
                .map(|o| new_id[o.index()].unwrap_or(*o))
                .collect();
            Some(Node {
                kind: node.kind.with_operands(&ops),
                ..node
            })
        })
        .collect();
    let remap = |id: &NodeId| new_id[id.index()].unwrap_or(*id);
    body.params = body.params.iter().map(remap).collect();
    body.results = body.results.iter().map(remap).collect();
}

/// For each class, the class that stands for it in the program: the lowest-numbered class
/// with the same canonical form. Two classes the e-graph did not merge can hold ≈ values (a
/// view chain written in two orders, say); the program computes such a value once, so that
/// kernels, stores and validity depend only on the candidate's canonical form.
pub(super) fn shared_classes(x: &ExtractGraph, choice: &Choice) -> Vec<u32> {
    let mut facts = WalkFacts::default();
    Walk::roots(x, choice, &mut Interner::default(), &mut facts);
    let mut first: FxHashMap<u32, u32> = FxHashMap::default();
    (0..x.ids.len() as u32)
        .map(|c| match facts.memo[c as usize] {
            NONE => c,
            id => *first.entry(id).or_insert(c),
        })
        .collect()
}

/// Kernel regions, stored intermediates and parallel axes of a reconstructed candidate. Stored
/// intermediates are named (`stored0`, …) so the summary can refer to them.
pub fn summarize(f: &mut Function) -> Summary {
    // The same partition the backend lowers.
    let graph = crate::lower::kernel_graph(f);
    let nodes = &f.body.nodes;
    let stored_ids: Vec<usize> = graph
        .intermediates
        .iter()
        .map(|i| i.index())
        .filter(|i| matches!(nodes[*i].ty, Some(Type::Tensor(_))))
        .collect();
    let stored: Vec<String> = stored_ids
        .iter()
        .enumerate()
        .filter_map(|(k, i)| match &nodes[*i].ty {
            Some(Type::Tensor(t)) => Some(format!("stored{k}: {t}")),
            _ => None,
        })
        .collect();
    let mut axes: Vec<Sym> = nodes
        .iter()
        .filter_map(|node| match node.ty.as_ref() {
            Some(Type::Tensor(t)) => Some(t.par.axes().cloned().collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect();
    axes.sort();
    axes.dedup();
    for (k, i) in stored_ids.into_iter().enumerate() {
        f.body.nodes[i].name = Some(format!("stored{k}"));
    }
    Summary {
        kernels: graph.kernels.len(),
        stored,
        axes: axes.into_iter().map(String::from).collect(),
        launch_order: graph.launch_order,
    }
}
