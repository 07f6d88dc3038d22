//! Subgraph partitioning (paper §5.2) and the composition of subgraph candidates.
//!
//! A large function is searched as connected, convex subgraphs: each becomes a function of its
//! own (`f.p0`, `f.p1`, …) whose parameters and results are the values crossing its boundary,
//! and `f` becomes their composition — inputs, `call @f.pK(…)`, `get[i]` of a call with several
//! results, and the returns. A subgraph is *convex* when no dependency path leaves it and comes
//! back, so the calls have an order; the composition then computes what `f` computed, which
//! `check` confirms by running the calls in the interpreter.
//!
//! How subgraphs are cut ([`partition`]): the function's compute nodes in body order (a
//! topological order) are cut into runs of at most `size` nodes. A run of a topological order is
//! convex (a path between two of its nodes passes only through nodes between them), and so is
//! each connected component of it (a node on a path between two nodes of a component is
//! connected to both), so the runs' components are the subgraphs. Cut points are chosen by
//! dynamic programming to move the fewest bytes across boundaries: each value crossing is
//! written once and read once per subgraph that reads it, each input read once per subgraph
//! that reads it. Cuts through tuple-typed values are not allowed. Several granularities
//! (`size`, ¾ and ½ of it) are tried and ranked by those bytes, then by the largest
//! subgraph's work (fewer, larger subgraphs first on a tie). Leaves (constants, fills,
//! iotas) and what computes from them alone are copied into each subgraph that reads them.
//!
//! Subgraphs equal up to value names (same operations, types and order) are one function,
//! called once per use: saturated and extracted once.
//!
//! [`compose`]: candidates of the subgraphs combine through the calls. Each subgraph has its
//! best candidates ranked by the model; the best composed programs come from a k-best merge
//! of the sums of their estimates (the model's time is a sum over kernels, and axes are renamed
//! per call so that each part keeps its own schedule), never from the Cartesian product. A
//! composed program inlines each call's chosen candidate: a value crossing a boundary is one
//! kernel's store and another's load.

pub mod compose;

use crate::ir::{Binding, Body, DimBase, ExprKind, Function, Node, NodeId, Type};
use std::collections::BTreeMap;

/// Bytes of a tensor type at the function's sizes (0 for tuples and tiles).
pub fn type_bytes(t: Option<&Type>, bindings: &[Binding]) -> f64 {
    let Some(Type::Tensor(t)) = t else {
        return 0.0;
    };
    if !t.par.is_empty() {
        return 0.0;
    }
    let mut n = t.dtype.size_bytes() as f64;
    for d in &t.shape {
        match dim_size(&d.base, bindings) {
            Some(v) => n *= v,
            None => return 0.0,
        }
    }
    n
}

/// Elements along a dimension (a size not bound counts 1); `None` for a collection's extent.
pub fn dim_size(d: &DimBase, bindings: &[Binding]) -> Option<f64> {
    match d {
        DimBase::Lit(v) => Some(*v as f64),
        DimBase::Sym(s) => Some(
            bindings
                .iter()
                .find(|b| b.name == s.as_str())
                .map_or(1.0, |b| b.value as f64),
        ),
        DimBase::Extent(_) => None,
    }
}

/// Whether a node is a leaf.
fn is_leaf(kind: &ExprKind) -> bool {
    matches!(
        kind,
        ExprKind::Constant(_) | ExprKind::Fill(_) | ExprKind::Iota(_)
    )
}

/// Per node, whether it is copied into each subgraph that reads it instead of crossing a
/// boundary: what is known without inputs (leaves, and what computes from them alone, like
/// `reduce ones axis=H`), and pointwise operators and views of inputs and such values (a
/// `cast(x)`). Whole-graph search folds these into their readers; as a value of their own
/// they would be a kernel that only copies data (or none with a legal block: a lone cast of
/// a whole 16×4096 tensor).
fn constants(body: &Body) -> Vec<bool> {
    // `known`: computed from leaves alone; `c`: copied (known, or cheap over inputs and
    // copied values).
    let mut known = vec![false; body.nodes.len()];
    let mut c = vec![false; body.nodes.len()];
    for id in body.ids() {
        let k = &body.node(id).kind;
        let ops = k.operands();
        let cheap = matches!(
            k,
            ExprKind::Unary(..)
                | ExprKind::Binary(..)
                | ExprKind::Select(..)
                | ExprKind::Cast(..)
                | ExprKind::Transpose(..)
                | ExprKind::Reshape(..)
                | ExprKind::Broadcast(..)
        );
        let source = |o: &NodeId| c[o.index()] || matches!(body.node(*o).kind, ExprKind::Input);
        known[id.index()] = is_leaf(k)
            || (!matches!(k, ExprKind::Input | ExprKind::Call(..))
                && !ops.is_empty()
                && ops.iter().all(|o| known[o.index()]));
        c[id.index()] = known[id.index()] || (cheap && ops.iter().all(source));
    }
    c
}

/// The inputs and computed values `id` reads through copied nodes (`constants`), itself if
/// it is one.
fn sources(body: &Body, constant: &[bool], id: NodeId, out: &mut Vec<NodeId>) {
    if !constant[id.index()] {
        if !out.contains(&id) {
            out.push(id);
        }
        return;
    }
    for o in body.node(id).kind.operands() {
        sources(body, constant, o, out);
    }
}

/// Copies node `id` (copied, `constants`) and what it reads into `sb` (once each, through
/// `map`, which holds the inputs it reads).
fn copy_constant(body: &Body, id: NodeId, sb: &mut Body, map: &mut BTreeMap<NodeId, NodeId>) {
    if map.contains_key(&id) {
        return;
    }
    let n = body.node(id);
    for o in n.kind.operands() {
        copy_constant(body, o, sb, map);
    }
    let ops: Vec<NodeId> = n.kind.operands().iter().map(|o| map[o]).collect();
    let nid = sb.push(Node {
        kind: n.kind.with_operands(&ops),
        ty: None,
        ..n.clone()
    });
    map.insert(id, nid);
}

/// A function with calls (a composition of subgraphs).
pub fn has_calls(f: &Function) -> bool {
    f.body
        .nodes
        .iter()
        .any(|n| matches!(n.kind, ExprKind::Call(..)))
}

/// The matrix products of a function: what decides whether `saturate` partitions it (each
/// multiplies the tilings the search combines).
pub fn products(f: &Function) -> usize {
    f.body
        .nodes
        .iter()
        .filter(|n| {
            matches!(
                n.kind,
                ExprKind::MatMul { .. } | ExprKind::TileMatMul { .. }
            )
        })
        .count()
}

/// The compute nodes of a function: what a subgraph size counts.
pub fn compute_nodes(f: &Function) -> usize {
    let c = constants(&f.body);
    f.body
        .ids()
        .filter(|id| !c[id.index()] && !matches!(f.body.node(*id).kind, ExprKind::Input))
        .count()
}

/// One way to cut a function: its subgraphs (node ids of the source, in body order) and what
/// ranks it.
#[derive(Clone, Debug)]
pub struct Partition {
    /// The `size` it was cut for.
    pub size: usize,
    pub subgraphs: Vec<Vec<NodeId>>,
    /// Bytes read and written at the subgraphs' boundaries (inputs and results included).
    pub boundary_bytes: f64,
    /// Compute nodes of the largest subgraph.
    pub largest: usize,
}

/// The partitions tried for `f` at granularities `size`, ¾·size and ½·size, best first.
pub fn partitions(f: &Function, size: usize) -> Vec<Partition> {
    let mut sizes = vec![size.max(1), (size * 3 / 4).max(1), (size / 2).max(1)];
    sizes.dedup();
    let mut out: Vec<Partition> = sizes.into_iter().filter_map(|s| partition(f, s)).collect();
    out.sort_by(|a, b| {
        a.boundary_bytes
            .total_cmp(&b.boundary_bytes)
            .then(a.subgraphs.len().cmp(&b.subgraphs.len()))
            .then(a.largest.cmp(&b.largest))
            .then(b.size.cmp(&a.size))
    });
    out
}

/// The cut of `f` into runs of at most `size` compute nodes moving the fewest bytes across
/// boundaries, split into connected components; `None` when no cut is allowed (a tuple crosses
/// every possible boundary).
pub fn partition(f: &Function, size: usize) -> Option<Partition> {
    let body = &f.body;
    let constant = constants(body);
    let compute: Vec<NodeId> = body
        .ids()
        .filter(|id| !constant[id.index()] && !matches!(body.node(*id).kind, ExprKind::Input))
        .collect();
    let n = compute.len();
    if n == 0 {
        return None;
    }
    let pos: BTreeMap<NodeId, usize> = compute.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    // Users of each node (by position among compute nodes; results as position n).
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); body.nodes.len()];
    for (i, id) in compute.iter().enumerate() {
        for o in body.node(*id).kind.operands() {
            users[o.index()].push(i);
        }
    }
    for r in &body.results {
        users[r.index()].push(n);
    }
    let bytes = |id: NodeId| type_bytes(body.ty(id), &f.bindings);
    let is_tuple = |id: NodeId| matches!(body.ty(id), Some(Type::Tuple(_)));
    // A cut before position j is allowed when no tuple made before j is used at or after j.
    let cut_ok: Vec<bool> = (0..=n)
        .map(|j| {
            j == 0
                || j == n
                || !compute[..j]
                    .iter()
                    .any(|id| is_tuple(*id) && users[id.index()].iter().any(|u| *u >= j))
        })
        .collect();
    // The boundary bytes of the run [i, j).
    let cost = |i: usize, j: usize| -> f64 {
        let mut read: Vec<NodeId> = Vec::new();
        let mut total = 0.0;
        let mut src = Vec::new();
        for id in &compute[i..j] {
            src.clear();
            for o in body.node(*id).kind.operands() {
                sources(body, &constant, o, &mut src);
            }
            for &o in &src {
                let outside = match pos.get(&o) {
                    Some(p) => *p < i,
                    None => matches!(body.node(o).kind, ExprKind::Input),
                };
                if outside && !read.contains(&o) {
                    read.push(o);
                    total += bytes(o);
                }
            }
            if users[id.index()].iter().any(|u| *u >= j) {
                total += bytes(*id);
            }
        }
        total
    };
    let mut best = vec![f64::INFINITY; n + 1];
    let mut from = vec![0usize; n + 1];
    best[0] = 0.0;
    for j in 1..=n {
        if !cut_ok[j] {
            continue;
        }
        for i in j.saturating_sub(size)..j {
            if !cut_ok[i] || !best[i].is_finite() {
                continue;
            }
            let c = best[i] + cost(i, j);
            if c < best[j] {
                best[j] = c;
                from[j] = i;
            }
        }
    }
    if !best[n].is_finite() {
        return None;
    }
    let mut runs = Vec::new();
    let mut j = n;
    while j > 0 {
        runs.push((from[j], j));
        j = from[j];
    }
    runs.reverse();
    // Connected components of each run (edges between its compute nodes).
    let mut subgraphs = Vec::new();
    for (i, j) in runs {
        let mut comp: Vec<usize> = (0..j - i).collect();
        fn root(comp: &mut [usize], mut a: usize) -> usize {
            while comp[a] != a {
                comp[a] = comp[comp[a]];
                a = comp[a];
            }
            a
        }
        for (k, id) in compute[i..j].iter().enumerate() {
            for o in body.node(*id).kind.operands() {
                if let Some(p) = pos.get(&o).filter(|p| (i..j).contains(*p)) {
                    let (a, b) = (root(&mut comp, k), root(&mut comp, p - i));
                    comp[a.max(b)] = a.min(b);
                }
            }
        }
        let mut groups: BTreeMap<usize, Vec<NodeId>> = BTreeMap::new();
        for (k, id) in compute[i..j].iter().enumerate() {
            let r = root(&mut comp, k);
            groups.entry(r).or_default().push(*id);
        }
        subgraphs.extend(groups.into_values());
    }
    let largest = subgraphs.iter().map(|s| s.len()).max().unwrap_or(0);
    Some(Partition {
        size,
        subgraphs,
        boundary_bytes: best[n],
        largest,
    })
}

/// Whether each subgraph is convex: no path from one of its nodes through a node outside it
/// back into it. (Checked by the pass on every partition it outputs; tests use it on
/// hand-made cuts.)
pub fn is_convex(f: &Function, sub: &[NodeId]) -> bool {
    let body = &f.body;
    let inside = |id: NodeId| sub.contains(&id);
    // Nodes outside reachable (downstream) from the subgraph.
    let mut below = vec![false; body.nodes.len()];
    for id in body.ids() {
        let ops = body.node(id).kind.operands();
        if !inside(id) && ops.iter().any(|o| inside(*o) || below[o.index()]) {
            below[id.index()] = true;
        }
    }
    !sub.iter().any(|id| {
        body.node(*id)
            .kind
            .operands()
            .iter()
            .any(|o| below[o.index()])
    })
}

/// The module functions of a partition: the subgraphs' functions (one per distinct
/// subgraph) and the composition of `f` that calls them, in that order.
pub fn split(f: &Function, p: &Partition) -> Vec<Function> {
    let body = &f.body;
    let constant = constants(body);
    let mut owner: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (k, s) in p.subgraphs.iter().enumerate() {
        for id in s {
            owner.insert(*id, k);
        }
    }
    let mut used_outside: Vec<bool> = vec![false; body.nodes.len()];
    for id in body.ids() {
        for o in body.node(id).kind.operands() {
            if owner.get(&o) != owner.get(&id) && owner.contains_key(&o) {
                used_outside[o.index()] = true;
            }
        }
    }
    for r in &body.results {
        used_outside[r.index()] = true;
    }
    let value_name = |id: NodeId| {
        body.node(id)
            .name
            .clone()
            .unwrap_or_else(|| format!("v{}", id.index()))
    };
    let mut subs: Vec<Function> = Vec::new();
    // Per subgraph: its function's name, its parameters and results (source ids).
    let mut calls: Vec<(String, Vec<NodeId>, Vec<NodeId>)> = Vec::new();
    let mut keys: Vec<(String, String)> = Vec::new();
    for s in &p.subgraphs {
        let mut sb = Body::default();
        let mut map: BTreeMap<NodeId, NodeId> = BTreeMap::new();
        let mut params: Vec<NodeId> = Vec::new();
        let mut results: Vec<NodeId> = Vec::new();
        // Parameters first (the values read from outside, in order of first use), then the
        // leaves each node reads and the nodes.
        let mut src = Vec::new();
        for id in s {
            for o in body.node(*id).kind.operands() {
                sources(body, &constant, o, &mut src);
            }
        }
        for o in src {
            {
                let on = body.node(o);
                if map.contains_key(&o) || s.contains(&o) {
                    continue;
                }
                params.push(o);
                let nid = sb.push(Node {
                    kind: ExprKind::Input,
                    name: Some(value_name(o)),
                    annot: on.ty.clone(),
                    span: on.span,
                    ty: None,
                });
                sb.params.push(nid);
                map.insert(o, nid);
            }
        }
        for id in s {
            let n = body.node(*id);
            for o in n.kind.operands() {
                if constant[o.index()] {
                    copy_constant(body, o, &mut sb, &mut map);
                }
            }
            let ops: Vec<NodeId> = n.kind.operands().iter().map(|o| map[o]).collect();
            let nid = sb.push(Node {
                kind: n.kind.with_operands(&ops),
                name: n
                    .name
                    .clone()
                    .or_else(|| used_outside[id.index()].then(|| value_name(*id))),
                annot: n.annot.clone(),
                span: n.span,
                ty: None,
            });
            map.insert(*id, nid);
            if used_outside[id.index()] {
                results.push(*id);
                sb.results.push(nid);
            }
        }
        // Leaves copied in are named after their source values; a leaf used twice keeps one
        // copy (`map`).
        let key = structure_key(&sb);
        let name = match keys.iter().find(|(k, _)| *k == key) {
            Some((_, name)) => name.clone(),
            None => {
                let name = format!("{}.p{}", f.name, subs.len());
                keys.push((key, name.clone()));
                subs.push(Function {
                    name: name.clone(),
                    name_span: f.name_span,
                    bindings: f.bindings.clone(),
                    body: sb,
                    comment: None,
                    schedule: None,
                });
                name
            }
        };
        calls.push((name, params, results));
    }
    // The composition: the inputs, then the calls in order.
    let mut cb = Body::default();
    let mut map: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    for p in &body.params {
        let n = body.node(*p);
        let nid = cb.push(Node {
            ty: None,
            ..n.clone()
        });
        cb.params.push(nid);
        map.insert(*p, nid);
    }
    for (k, (name, params, results)) in calls.iter().enumerate() {
        let args: Vec<NodeId> = params.iter().map(|p| map[p]).collect();
        let call = cb.push(Node {
            kind: ExprKind::Call(name.clone(), args),
            name: Some(format!("s{k}")),
            annot: None,
            span: f.name_span,
            ty: None,
        });
        if let [one] = results.as_slice() {
            map.insert(*one, call);
        } else {
            for (i, r) in results.iter().enumerate() {
                let g = cb.push(Node {
                    kind: ExprKind::Get(crate::ir::FieldRef::Index(i), call),
                    name: None,
                    annot: None,
                    span: f.name_span,
                    ty: None,
                });
                map.insert(*r, g);
            }
        }
    }
    // A result the source computes from leaves alone is copied as it is.
    for r in &body.results {
        if !map.contains_key(r) {
            copy_constant(body, *r, &mut cb, &mut map);
        }
    }
    cb.results = body.results.iter().map(|r| map[r]).collect();
    cb.results_span = body.results_span;
    subs.push(Function {
        name: f.name.clone(),
        name_span: f.name_span,
        bindings: f.bindings.clone(),
        body: cb,
        comment: f.comment.clone(),
        schedule: None,
    });
    subs
}

/// A body's structure without value names: equal keys are the same function up to names.
fn structure_key(b: &Body) -> String {
    let mut key = String::new();
    for n in &b.nodes {
        key.push_str(&format!("{:?}|{:?};", n.kind, n.annot));
    }
    key.push_str(&format!("{:?}{:?}", b.params, b.results));
    key
}
