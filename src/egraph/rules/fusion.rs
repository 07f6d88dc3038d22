//! Reduction fusion (paper §4.2): reductions over the same domain become one reduction over
//! a tuple state.
//!
//! - Product fusion pairs independent reductions: `⟨reduce X α @a, reduce Y α @b⟩ =
//!   reduce ⟨X, Y⟩ α @a×b`.
//! - Repair fusion folds consumers that depend on a producer's *final* result `s` into the
//!   producer's fold: each consumer accumulates `g(y, s_current)` and repairs what it has
//!   accumulated with `h(c, s, s')` whenever the producer's state moves from `s` to `s'`.
//!   Repairs are not hand-written: candidates come from a small grammar and one is accepted
//!   only when both identities of §4.2 hold on random values in the reference interpreter:
//!   `h(g(y,s), s, s') = g(y, s')` and `h(a + b, s, s') = h(a, s, s') + h(b, s, s')`.
//!
//! Generated reducers are named after a hash of their definition, so the same fusion found
//! twice yields one reducer.

use super::repair::{self, emit_guard, emit_repair, push, Repair, RepairProblem};
use super::*;
use crate::interp::Sizes;
use crate::ir::{
    BinaryOp, Body, BuiltinReducer, ExprKind, Node, NodeId, ReducerDef, ReducerRef, UnaryOp,
};
use crate::verify::typing::infer;
use std::collections::{BTreeSet, HashMap, HashSet};

#[rustfmt::skip]
pub static RULES: &[Rule] = &[
    // name              family            equation
    Rule { name: "product-fusion", family: Family::Fusion, equation: "⟨reduce X parallel=p @a, reduce Y parallel=p @b⟩ = get[0,1](reduce tuple(X, Y) parallel=p @a×b)  (independent)", root: Root::ReduceParallel, find: product_fusion, reach: Reach::EGraph },
    Rule { name: "repair-fusion",  family: Family::Fusion, equation: "⟨s = reduce X parallel=p @P, reduce g(Y, s) parallel=p @add⟩ = get[0,1](reduce tuple(X, Y) parallel=p @h)  (h synthesised and checked)", root: Root::ReduceParallel, find: repair_fusion, reach: Reach::EGraph },
];

// ---- the generated reducers ----

fn param(body: &mut Body, name: &str) -> NodeId {
    let id = body.push(Node {
        kind: ExprKind::Param,
        name: Some(name.to_string()),
        annot: None,
        span: Default::default(),
        ty: None,
    });
    body.params.push(id);
    id
}

/// Names a generated reducer after its definition, so equal fusions share one reducer.
fn finish(mut def: ReducerDef, prefix: &str) -> ReducerDef {
    use std::hash::{Hash, Hasher};
    def.name = String::new();
    let text = crate::ir::print::print_reducer(&def, Default::default());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    def.name = format!("{prefix}_{:08x}", h.finish() as u32);
    def
}

/// `reducer @prod(state = <a0, a1>, item = <x0, x1>) { return tuple(a0 ∘ x0, a1 ∘ x1) }`,
/// built once per combination (product fusion asks for it at every match).
fn product_reducer(parts: &[BuiltinReducer]) -> std::sync::Arc<ReducerDef> {
    use std::sync::{Arc, Mutex, OnceLock};
    type Made = HashMap<Vec<BuiltinReducer>, Arc<ReducerDef>>;
    static MADE: OnceLock<Mutex<Made>> = OnceLock::new();
    let made = MADE.get_or_init(Default::default);
    let cached = made.lock().ok().and_then(|m| m.get(parts).cloned());
    if let Some(def) = cached {
        return def;
    }
    let def = Arc::new(build_product_reducer(parts));
    if let Ok(mut m) = made.lock() {
        m.insert(parts.to_vec(), def.clone());
    }
    def
}

fn build_product_reducer(parts: &[BuiltinReducer]) -> ReducerDef {
    let mut body = Body::default();
    let state: Vec<NodeId> = (0..parts.len())
        .map(|i| param(&mut body, &format!("acc{i}")))
        .collect();
    let items: Vec<NodeId> = (0..parts.len())
        .map(|i| param(&mut body, &format!("x{i}")))
        .collect();
    let next: Vec<NodeId> = parts
        .iter()
        .enumerate()
        .map(|(i, r)| push(&mut body, ExprKind::Binary(r.fold_op(), state[i], items[i])))
        .collect();
    let t = push(&mut body, ExprKind::Tuple(next));
    body.results.push(t);
    finish(
        ReducerDef {
            name: String::new(),
            name_span: Default::default(),
            state: (0..parts.len()).map(|i| format!("acc{i}")).collect(),
            item: (0..parts.len()).map(|i| format!("x{i}")).collect(),
            init: parts.iter().map(|r| r.identity()).collect(),
            body,
        },
        "product",
    )
}

// ---- product fusion ----

fn builtin_parallel(n: &ENode) -> Option<(&Sym, BuiltinReducer)> {
    match &n.op {
        Op::ReduceParallel {
            axis,
            reducer: ReducerRef::Builtin(r),
        } => Some((axis, *r)),
        _ => None,
    }
}

/// Reads the e-graph's index of parallel reductions and which reductions reach which (their
/// independence), both changed by merges anywhere: its reach is the whole e-graph. (Declared
/// `ClassNodes`, incremental search found the two attention branches of differential
/// attention's fused pairs an iteration later than full search; the same e-graph, numbered
/// otherwise.) It matches reductions over parallel axes only, which few e-nodes are.
fn product_fusion(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some((axis, ra)) = builtin_parallel(n) else {
        return;
    };
    let x = n.children[0];
    let Some(tx) = tensor_type(eg, x) else { return };
    // The product reducer's identities are f32 literals, so its states are f32: only
    // reductions that already produce f32 keep their type when fused.
    if tx.dtype != crate::ir::DType::F32 {
        return;
    }
    // Partners on either side of `class`, so that a pair is found when either reduction is
    // new (the runner revisits only e-nodes near a change); the pair is always built in class order.
    let class = eg.find(class);
    // Same domain: same axis and the same tiling of the other axes.
    let mut candidates: Vec<(Id, Id, BuiltinReducer)> = eg
        .analysis
        .parallel_reductions
        .iter()
        .filter(|(c, y, axis2, _)| {
            *c != class
                && axis2 == axis
                && tensor_type(eg, *y).is_some_and(|ty| ty.par == tx.par && ty.dtype == tx.dtype)
        })
        .map(|(c, y, _, rb)| (*c, *y, *rb))
        .collect();
    if candidates.is_empty() {
        return;
    }
    candidates.sort_by_key(|c| c.0);
    let ordered = |other: Id, y: Id, rb: BuiltinReducer| {
        if other < class {
            ((other, y, rb), (class, x, ra))
        } else {
            ((class, x, ra), (other, y, rb))
        }
    };
    // A partner class whose every candidate is already fused with this reduction (each class
    // holding its component) yields only known terms: skip it before the costlier
    // independence test. Fused in either order: class order is egg's id order, which depends
    // on the order e-nodes were added (a dump loaded in another order would otherwise gain
    // the mirrored product).
    let mut open = Vec::new();
    for group in candidates.chunk_by(|p, q| p.0 == q.0) {
        let fused = group.iter().all(|&(other, y, rb)| {
            let (a, b) = ordered(other, y, rb);
            already_fused(eg, *axis, a, b) || already_fused(eg, *axis, b, a)
        });
        if !fused {
            open.extend_from_slice(group);
        }
    }
    if open.is_empty() {
        return;
    }
    // Independent: neither input uses the other's result. One partner node per class.
    let reach = crate::egraph::graph::reduction_reach(eg);
    let mut partners: Vec<(Id, Id, BuiltinReducer)> = Vec::new();
    for (c, y, rb) in open {
        let independent = !reach.reaches(eg, y, class) && !reach.reaches(eg, x, c);
        if independent && partners.last().is_none_or(|p| p.0 != c) {
            partners.push((c, y, rb));
        }
    }
    // Pairs with partners after this class first, then those before (the e-graph's class
    // numbering depends on the order of proposals).
    let (below, above): (Vec<_>, Vec<_>) = partners.into_iter().partition(|p| p.0 < class);
    for (other, y, rb) in above.into_iter().chain(below) {
        let (a, b) = ordered(other, y, rb);
        fuse_pair(eg, *axis, a, b, out);
    }
}

/// Whether classes `a` < `b` already hold the components of their fused reduction.
fn already_fused(
    eg: &EGraph,
    axis: Sym,
    (a, x, ra): (Id, Id, BuiltinReducer),
    (b, y, rb): (Id, Id, BuiltinReducer),
) -> bool {
    let def = product_reducer(&[ra, rb]);
    let lookup = |op: Op, kids: &[Id]| eg.lookup(ENode::new(op, kids));
    let fused = lookup(Op::Tuple, &[x, y]).and_then(|t| {
        let reducer = ReducerRef::User(def.name.as_str().into());
        lookup(Op::ReduceParallel { axis, reducer }, &[t])
    });
    fused.is_some_and(|f| {
        lookup(Op::Get(0), &[f]) == Some(eg.find(a)) && lookup(Op::Get(1), &[f]) == Some(eg.find(b))
    })
}

/// `⟨reduce_ρa x, reduce_ρb y⟩ = reduce_{ρa×ρb} ⟨x, y⟩`, for reductions in classes `a` < `b`.
fn fuse_pair(
    eg: &EGraph,
    axis: Sym,
    (a, x, ra): (Id, Id, BuiltinReducer),
    (b, y, rb): (Id, Id, BuiltinReducer),
    out: &mut Out,
) {
    let def = product_reducer(&[ra, rb]);
    let fused = node(
        Op::ReduceParallel {
            axis,
            reducer: ReducerRef::User(def.name.as_str().into()),
        },
        vec![node(Op::Tuple, vec![cls(x), cls(y)])],
    );
    out.equal(a, node(Op::Get(0), vec![fused.clone()]));
    out.equal(b, node(Op::Get(1), vec![fused]));
    // The definition is copied out only until the e-graph's environment has it.
    if eg.analysis.env.reducer(&def.name).is_none() {
        out.reducers.push(ReducerDef::clone(&def));
    }
}

// ---- repair fusion ----

/// A consumer's contribution `g(Y, s)` as a tree over items, the producer and literals.
#[derive(Clone, Debug)]
enum G {
    Producer,
    Item(Id),
    Literal(u64, TensorType),
    Node(Op, Vec<G>),
}

impl G {
    fn uses_producer(&self) -> bool {
        match self {
            G::Producer => true,
            G::Node(_, k) => k.iter().any(G::uses_producer),
            _ => false,
        }
    }

    /// The tree as text with items numbered by `positions`: equal for equal contributions
    /// wherever their items live.
    fn key(&self, positions: &HashMap<Id, usize>) -> String {
        match self {
            G::Producer => "s".into(),
            G::Item(i) => format!("y{}", positions.get(i).copied().unwrap_or(usize::MAX)),
            G::Literal(bits, t) => format!("{}:{t:?}", f64::from_bits(*bits)),
            G::Node(op, kids) => {
                let kids: Vec<String> = kids.iter().map(|k| k.key(positions)).collect();
                format!("{op:?}({})", kids.join(","))
            }
        }
    }

    fn items(&self, out: &mut Vec<Id>) {
        match self {
            G::Item(i) if !out.contains(i) => out.push(*i),
            G::Node(_, k) => k.iter().for_each(|g| g.items(out)),
            _ => {}
        }
    }
}

fn body_op(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast(_)
            | Op::ReduceAxis {
                reducer: ReducerRef::Builtin(_),
                ..
            }
            | Op::TileMatMul(_)
            | Op::Transpose(_)
    )
}

struct Extract<'a> {
    eg: &'a EGraph,
    axis: &'a str,
    producer: Id,
    producer_rep: Id,
    visiting: HashSet<Id>,
    memo: HashMap<Id, Option<G>>,
}

impl Extract<'_> {
    /// A view of a value that does not need the producer: it becomes an item of the fold.
    fn item_view(&self, c: Id) -> bool {
        self.eg[c].nodes.iter().any(|n| match &n.op {
            Op::Partition(_, a) | Op::Replicate(a) if a == self.axis => {
                let src = self.eg.find(n.children[0]);
                src != self.producer
                    && tensor_type(self.eg, src).is_some_and(|t| t.par.get(self.axis).is_none())
            }
            _ => false,
        })
    }

    fn class(&mut self, c: Id, depth: usize) -> Option<G> {
        let c = self.eg.find(c);
        if c == self.producer_rep {
            return Some(G::Producer);
        }
        let t = tensor_type(self.eg, c)?;
        if t.shape.is_empty() && t.par.is_empty() {
            return self.eg[c].nodes.iter().find_map(|n| match &n.op {
                Op::Constant(bits, ty) => Some(G::Literal(*bits, ty.clone())),
                _ => None,
            });
        }
        // Prefer a term that reaches the producer; otherwise the class is an item if it is a
        // view of a value computed before the fold.
        if let Some(done) = self.memo.get(&c) {
            return done.clone();
        }
        if depth > 24 || !self.visiting.insert(c) {
            return None;
        }
        let mut found = None;
        for n in &self.eg[c].nodes {
            if !body_op(&n.op) {
                continue;
            }
            let kids: Option<Vec<G>> = n
                .children
                .iter()
                .map(|k| self.class(*k, depth + 1))
                .collect();
            if let Some(kids) = kids {
                let g = G::Node(n.op.clone(), kids);
                if g.uses_producer() {
                    found = Some(g);
                    break;
                }
            }
            if depth == 0 && found.is_none() {
                continue;
            }
        }
        self.visiting.remove(&c);
        let result = found.or_else(|| self.item_view(c).then_some(G::Item(c)));
        self.memo.insert(c, result.clone());
        result
    }
}

/// Whether every `exp` in `g` that reads the producer's state reads it against items the
/// state bounds: `exp(y − s)` with `y` the very tile the producer's item `x` is the `@max`
/// of (`x = reduce y @max`), or `x` itself. The repairs are exact in real arithmetic for any
/// `y`, but the fold evaluates `exp(y − s)` against the maximum *so far*: a `y` it does not
/// bound (a whole row replicated over the tiles, whose later tiles exceed the running maximum)
/// overflows to `inf`, and the next rescale makes `inf · 0 = NaN` where the source, shifting
/// by the final maximum, is finite.
fn exponents_bounded(eg: &EGraph, g: &G, x: Id, producer: BuiltinReducer) -> bool {
    let x = eg.find(x);
    let bounded = |c: Id| {
        let c = eg.find(c);
        c == x
            || eg[x].nodes.iter().any(|n| {
                matches!(
                    &n.op,
                    Op::ReduceAxis { reducer: ReducerRef::Builtin(r), .. } if *r == producer
                ) && eg.find(n.children[0]) == c
            })
    };
    fn walk(g: &G, ok: &dyn Fn(Id) -> bool) -> bool {
        match g {
            G::Node(Op::Unary(UnaryOp::Exp), kids) if kids.iter().any(G::uses_producer) => {
                let mut items = Vec::new();
                kids.iter().for_each(|k| k.items(&mut items));
                items.iter().all(|i| ok(*i)) && kids.iter().all(|k| walk(k, ok))
            }
            G::Node(_, kids) => kids.iter().all(|k| walk(k, ok)),
            _ => true,
        }
    }
    walk(g, &bounded)
}

/// Appends `g` to a body: items and the producer bind to the given nodes.
fn emit(body: &mut Body, g: &G, producer: NodeId, items: &HashMap<Id, NodeId>) -> Option<NodeId> {
    Some(match g {
        G::Producer => producer,
        G::Item(i) => *items.get(i)?,
        G::Literal(bits, t) => {
            let id = push(body, ExprKind::Constant(f64::from_bits(*bits)));
            body.node_mut(id).annot = Some(Type::Tensor(t.clone()));
            id
        }
        G::Node(op, kids) => {
            let kids: Option<Vec<NodeId>> = kids
                .iter()
                .map(|k| emit(body, k, producer, items))
                .collect();
            let kind = ENode::new(op.clone(), vec![])
                .to_expr_kind()
                .with_operands(&kids?);
            push(body, kind)
        }
    })
}

/// An f32 tensor type without parallel state, for checking identities on plain tensors.
fn plain(t: &TensorType) -> TensorType {
    TensorType::new(crate::ir::DType::F32, t.shape.clone())
}

/// Finds a repair for consumer contribution `g` of a producer whose empty state is `empty`,
/// checked on the scalar algebra (`repair::verify_repair`). Verdicts are kept for the
/// process: the same contribution meets the same producer at every match of every iteration.
fn synthesise_repair(
    eg: &EGraph,
    axis: &str,
    g: &G,
    items: &[Id],
    producer_ty: &TensorType,
    contrib_ty: &TensorType,
    empty: f64,
) -> Option<Repair> {
    use std::sync::{Mutex, OnceLock};
    static VERDICTS: OnceLock<Mutex<HashMap<String, Option<Repair>>>> = OnceLock::new();
    let env = &eg.analysis.env;
    // Concrete small sizes: every symbol 4, every axis 2.
    let mut syms = BTreeSet::new();
    let mut collect = |t: &TensorType| {
        for d in &t.shape {
            match &d.base {
                crate::ir::DimBase::Sym(s) => {
                    syms.insert(*s);
                }
                crate::ir::DimBase::Extent(a) => {
                    syms.insert(*a);
                }
                crate::ir::DimBase::Lit(_) => {}
            }
            for a in &d.splits {
                syms.insert(*a);
            }
        }
    };
    let item_types: Vec<TensorType> = items
        .iter()
        .map(|i| {
            // An item is one coordinate's tile of the fused axis.
            let mut t = tensor_type(eg, *i)?.clone();
            if let Some(crate::ir::ParKind::Partition(d)) = t.par.get(axis) {
                t.shape[d] = t.shape[d].split_by(axis);
            }
            Some(plain(&t))
        })
        .collect::<Option<_>>()?;
    item_types.iter().for_each(&mut collect);
    collect(producer_ty);
    collect(contrib_ty);
    let sizes = Sizes(
        syms.into_iter()
            .map(|s| {
                let v = if crate::ir::is_axis_name(&s) { 2 } else { 4 };
                (s.to_string(), v)
            })
            .collect(),
    );
    let (producer, contribution) = (plain(producer_ty), plain(contrib_ty));
    let positions: HashMap<Id, usize> = items.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let key = format!(
        "{} | {item_types:?} | {producer:?} | {contribution:?} | {empty}",
        g.key(&positions)
    );
    let verdicts = VERDICTS.get_or_init(Default::default);
    if let Some(v) = verdicts.lock().ok().and_then(|m| m.get(&key).copied()) {
        return v;
    }
    let emit_g = |body: &mut Body, producer: NodeId, nodes: &[NodeId]| {
        let map: HashMap<Id, NodeId> = items.iter().copied().zip(nodes.iter().copied()).collect();
        emit(body, g, producer, &map)
    };
    let problem = RepairProblem {
        env,
        sizes,
        items: item_types,
        producer,
        contribution,
        empty,
        g: &emit_g,
        cast_rounding: cast_rounding(g),
    };
    let verdict = repair::synthesise(&problem);
    if let Ok(mut m) = verdicts.lock() {
        m.insert(key, verdict);
    }
    verdict
}

/// The unit roundoff of the narrowest float type `g` casts to (0 when it casts to none).
fn cast_rounding(g: &G) -> f64 {
    match g {
        G::Node(op, kids) => {
            let own = match op {
                Op::Cast(crate::ir::DType::BF16) => 2f64.powi(-8),
                Op::Cast(crate::ir::DType::F16) => 2f64.powi(-11),
                _ => 0.0,
            };
            kids.iter().map(cast_rounding).fold(own, f64::max)
        }
        _ => 0.0,
    }
}

struct Consumer {
    class: Id,
    g: G,
    repair: Repair,
    ty: TensorType,
}

fn repair_fusion(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Some((axis, rp)) = builtin_parallel(n) else {
        return;
    };
    if !matches!(rp, BuiltinReducer::Max | BuiltinReducer::Min) {
        return;
    }
    let x = n.children[0];
    let Some(producer_ty) = tensor_type(eg, class) else {
        return;
    };
    // A bf16/f16 producer keeps its state in f32 (the reducer's identities are f32
    // literals, and a softmax's sums should not round per tile); the contributions read it
    // cast back, which is exact: a maximum of narrow values is one of them.
    let narrow = |t: &TensorType| match t.dtype {
        crate::ir::DType::BF16 | crate::ir::DType::F16 => Some(t.dtype),
        _ => None,
    };
    let producer_narrow = narrow(producer_ty);
    let Some(rep) = eg.lookup(ENode::new(Op::Replicate(axis.into()), vec![class])) else {
        return;
    };
    let mut consumers: Vec<Consumer> = Vec::new();
    let mut classes: Vec<Id> = eg.classes().map(|c| c.id).collect();
    classes.sort();
    for c in classes {
        if c == eg.find(class) {
            continue;
        }
        for m in &eg[c].nodes {
            let Some((axis2, BuiltinReducer::Add)) = builtin_parallel(m) else {
                continue;
            };
            let input = eg.find(m.children[0]);
            if axis2 != axis {
                continue;
            }
            let mut ex = Extract {
                eg,
                axis,
                producer: eg.find(class),
                producer_rep: eg.find(rep),
                visiting: HashSet::new(),
                memo: HashMap::new(),
            };
            let Some(g) = ex.class(input, 0) else {
                continue;
            };
            if !exponents_bounded(eg, &g, x, rp) {
                continue;
            }
            let mut items = Vec::new();
            g.items(&mut items);
            let Some(cty) = tensor_type(eg, c) else {
                continue;
            };
            if let Some(repair) =
                synthesise_repair(eg, axis, &g, &items, producer_ty, cty, rp.identity())
            {
                consumers.push(Consumer {
                    class: c,
                    g,
                    repair,
                    ty: cty.clone(),
                });
                break;
            }
        }
    }
    if consumers.is_empty() {
        return;
    }
    // Every non-empty subset of up to three consumers, in class order (the rolling
    // attention form fuses the normaliser and the weighted sum).
    consumers.truncate(6);
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for mask in 1u32..(1 << consumers.len()) {
        if mask.count_ones() <= 3 {
            groups.push(
                (0..consumers.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .collect(),
            );
        }
    }
    for group in groups {
        let chosen: Vec<&Consumer> = group.iter().map(|i| &consumers[*i]).collect();
        let mut items: Vec<Id> = Vec::new();
        for c in &chosen {
            c.g.items(&mut items);
        }
        let mut body = Body::default();
        let s = param(&mut body, "s");
        let cs: Vec<NodeId> = (0..chosen.len())
            .map(|i| param(&mut body, &format!("c{i}")))
            .collect();
        let xp = param(&mut body, "x");
        let mut item_nodes = HashMap::new();
        for (i, it) in items.iter().enumerate() {
            item_nodes.insert(*it, param(&mut body, &format!("y{i}")));
        }
        let s1 = push(&mut body, ExprKind::Binary(rp.fold_op(), s, xp));
        let mut next = vec![s1];
        let mut ok = true;
        // The states as the repairs and contributions read them: an empty state (no item
        // but masked ones yet) shifted to a finite value, one guard per value and state.
        let mut guards: HashMap<(u64, bool), NodeId> = HashMap::new();
        let mut guard = |body: &mut Body, shift: f64, new: bool| {
            *guards
                .entry((shift.to_bits(), new))
                .or_insert_with(|| emit_guard(body, if new { s1 } else { s }, rp.identity(), shift))
        };
        for (i, c) in chosen.iter().enumerate() {
            let shift = c.repair.empty_shift();
            let new = if c.g.uses_producer() || c.repair.reads_state() {
                guard(&mut body, shift, true)
            } else {
                s1
            };
            let repaired = if c.repair.reads_state() {
                let old = if c.repair.guards_old() {
                    guard(&mut body, shift, false)
                } else {
                    s
                };
                emit_repair(&mut body, c.repair, cs[i], old, new)
            } else {
                cs[i]
            };
            let read = match producer_narrow {
                Some(d) => {
                    let kind = ENode::new(Op::Cast(d), vec![])
                        .to_expr_kind()
                        .with_operands(&[new]);
                    push(&mut body, kind)
                }
                None => new,
            };
            let Some(contrib) = emit(&mut body, &c.g, read, &item_nodes) else {
                ok = false;
                break;
            };
            next.push(push(
                &mut body,
                ExprKind::Binary(BinaryOp::Add, repaired, contrib),
            ));
        }
        if !ok {
            continue;
        }
        let t = push(&mut body, ExprKind::Tuple(next));
        body.results.push(t);
        let mut init = vec![rp.identity()];
        init.extend(chosen.iter().map(|_| 0.0));
        let def = finish(
            ReducerDef {
                name: String::new(),
                name_span: Default::default(),
                state: std::iter::once("s".to_string())
                    .chain((0..chosen.len()).map(|i| format!("c{i}")))
                    .collect(),
                item: std::iter::once("x".to_string())
                    .chain((0..items.len()).map(|i| format!("y{i}")))
                    .collect(),
                init,
                body,
            },
            "repair",
        );
        // Check the fused reduction's type before proposing it.
        let mut env = eg.analysis.env.fresh_copy();
        env.add_reducer(def.clone());
        let mut field_types: Vec<Type> = vec![eg[x].data.clone().unwrap_or(Type::Tuple(vec![]))];
        field_types.extend(
            items
                .iter()
                .map(|i| eg[*i].data.clone().unwrap_or(Type::Tuple(vec![]))),
        );
        let tuple_ty = Type::Tuple(field_types);
        let op = Op::ReduceParallel {
            axis: axis.into(),
            reducer: ReducerRef::User(def.name.as_str().into()),
        };
        let Ok(Type::Tuple(result)) = infer(
            &ENode::new(op.clone(), vec![]).to_expr_kind(),
            &[&tuple_ty],
            None,
            &env,
        ) else {
            continue;
        };
        // Narrow states are f32 in the fold and cast back after it.
        let wide = |t: &TensorType| {
            let mut t = t.clone();
            if narrow(&t).is_some() {
                t.dtype = crate::ir::DType::F32;
            }
            Type::Tensor(t)
        };
        let expected: Vec<Type> = std::iter::once(wide(producer_ty))
            .chain(chosen.iter().map(|c| wide(&c.ty)))
            .collect();
        if result != expected {
            continue;
        }
        let mut fields = vec![cls(x)];
        fields.extend(items.iter().map(|i| cls(*i)));
        let fused = node(op, vec![node(Op::Tuple, fields)]);
        let narrowed = |t: &TensorType, term: Term| match narrow(t) {
            Some(d) => node(Op::Cast(d), vec![term]),
            None => term,
        };
        out.push(narrowed(producer_ty, node(Op::Get(0), vec![fused.clone()])));
        for (i, c) in chosen.iter().enumerate() {
            out.equal(
                c.class,
                narrowed(&c.ty, node(Op::Get(i + 1), vec![fused.clone()])),
            );
        }
        let repairs: Vec<String> = chosen
            .iter()
            .enumerate()
            .map(|(i, c)| format!("c{i} by {}: {}", c.repair.name(), c.repair.equation()))
            .collect();
        remember(&def.name, format!("repair-fusion, {}", repairs.join("; ")));
        out.reducers.push(def);
    }
}

/// What made each generated reducer of this process, by name.
fn made() -> &'static std::sync::Mutex<HashMap<String, String>> {
    static MADE: std::sync::OnceLock<std::sync::Mutex<HashMap<String, String>>> =
        std::sync::OnceLock::new();
    MADE.get_or_init(Default::default)
}

fn remember(name: &str, what: String) {
    if let Ok(mut m) = made().lock() {
        m.entry(name.to_string()).or_insert(what);
    }
}

/// The repair of each accumulator of a repair-fusion reducer, read back from its body
/// (`c_i * exp(s − …)`, `c_i + …`): for a reducer loaded from a dump, whose making this
/// process did not see. Empty when the body has another shape.
fn read_repairs(def: &ReducerDef) -> Vec<String> {
    let body = &def.body;
    let Some(ExprKind::Tuple(fields)) = body.results.first().map(|r| &body.node(*r).kind) else {
        return Vec::new();
    };
    let param = |id: NodeId| {
        let n = body.node(id);
        matches!(n.kind, ExprKind::Param).then(|| n.name.clone().unwrap_or_default())
    };
    let mut out = Vec::new();
    for (i, f) in fields.iter().enumerate().skip(1) {
        let ExprKind::Binary(BinaryOp::Add, repaired, _) = body.node(*f).kind else {
            return Vec::new();
        };
        let kind = match &body.node(repaired).kind {
            ExprKind::Param => Repair::Keep,
            ExprKind::Binary(BinaryOp::Multiply, _, factor) => match &body.node(*factor).kind {
                ExprKind::Unary(UnaryOp::Exp, d) => match body.node(*d).kind {
                    ExprKind::Binary(BinaryOp::Subtract, a, _)
                        if param(a).as_deref() == Some("s") =>
                    {
                        Repair::ScaleExpOldMinusNew
                    }
                    _ => Repair::ScaleExpNewMinusOld,
                },
                _ => Repair::ScaleOldOverNew,
            },
            ExprKind::Binary(BinaryOp::Add, _, _) => Repair::ShiftNewMinusOld,
            _ => return Vec::new(),
        };
        out.push(format!(
            "c{} by {}: {}",
            i - 1,
            kind.name(),
            kind.equation()
        ));
    }
    out
}

/// What made a generated reducer: the fusion rule, and for repair fusion the repair of each
/// accumulator (known for reducers this process made; a loaded one is named by its prefix).
/// `None` for a reducer the user wrote.
pub fn describe_generated(def: &ReducerDef) -> Option<String> {
    if let Some(what) = made().lock().ok().and_then(|m| m.get(&def.name).cloned()) {
        return Some(what);
    }
    if def.name.starts_with("repair_") {
        let repairs = read_repairs(def);
        Some(if repairs.is_empty() {
            "repair-fusion".into()
        } else {
            format!("repair-fusion, {}", repairs.join("; "))
        })
    } else if def.name.starts_with("product_") {
        Some("product-fusion".into())
    } else {
        None
    }
}
