//! The typed e-graph: egg's e-graph over [`ENode`] with the verifier's type as the e-class
//! analysis, plus conversion from a function, from a dump, and back to a dump.

use super::lang::{ENode, Op};
use crate::diag::Span;
use crate::ir::*;
use crate::verify::typing::{infer, TypeEnv};
use egg::{DidMerge, Id, Language};
use std::collections::HashMap;

/// E-class data is the class's type, computed by the same typing code as `verify`. `None`
/// only while an ill-typed e-node is being rejected.
pub struct TypeAnalysis {
    pub env: TypeEnv,
    /// Merges of classes with different types (a bug in a rule), counted here as a last line
    /// of defence; rule application checks types before union and names the rule.
    pub conflicts: usize,
    /// Search index the runner refreshes before each search: every `reduce … parallel=` e-node
    /// with a built-in reducer, as (class, input class, axis, reducer), in class order.
    pub parallel_reductions: Vec<(Id, Id, crate::ir::Sym, crate::ir::BuiltinReducer)>,
    /// Reset with `parallel_reductions`: which of their classes each class reaches, computed
    /// on first use (`reduction_reach`), as most iterations pair no reductions.
    pub reduction_reach: std::sync::OnceLock<ReductionReach>,
    /// The type of the e-node being added, when the caller has just inferred it.
    pub known_type: Option<Type>,
    /// The function's result classes, as the runner last canonicalised them.
    pub results: Vec<Id>,
    /// Set by the runner once the other rules have saturated: rules that refine what no
    /// other rule tiled (`refine-result`) look only then, when that is known.
    pub late: bool,
}

impl egg::Analysis<ENode> for TypeAnalysis {
    type Data = Option<Type>;

    fn make(egraph: &mut egg::EGraph<ENode, Self>, enode: &ENode, _id: Id) -> Self::Data {
        if let Some(t) = egraph.analysis.known_type.take() {
            return Some(t);
        }
        let types: Option<Vec<Type>> = enode
            .children
            .iter()
            .map(|c| egraph[*c].data.clone())
            .collect();
        let types = types?;
        let refs: Vec<&Type> = types.iter().collect();
        infer(
            &enode.to_expr_kind(),
            &refs,
            enode.leaf_type().as_ref(),
            &egraph.analysis.env,
        )
        .ok()
    }

    fn merge(&mut self, a: &mut Self::Data, b: Self::Data) -> DidMerge {
        match (a.as_ref(), b) {
            (Some(x), Some(y)) if *x == y => DidMerge(false, false),
            (None, Some(y)) => {
                *a = Some(y);
                DidMerge(true, false)
            }
            (Some(_), None) => DidMerge(false, true),
            (None, None) => DidMerge(false, false),
            (Some(_), Some(_)) => {
                self.conflicts += 1;
                DidMerge(false, true)
            }
        }
    }
}

pub type EGraph = egg::EGraph<ENode, TypeAnalysis>;

/// Downward reachability to the runner's reduction classes: product fusion asks "does this
/// input use that reduction?" for pairs of reductions. Each target's users are marked once,
/// on the first question about it, so targets no pair asks about cost nothing.
#[derive(Default)]
pub struct ReductionReach {
    targets: HashMap<Id, usize>,
    /// Number of class slots (largest canonical id + 1).
    slots: usize,
    /// Per target, a bitset over class slots of the classes that use it (itself included).
    users: Vec<std::sync::OnceLock<Vec<u64>>>,
}

/// Which `reduce … parallel=` classes of the runner's index each class reaches; `eg` must not
/// have changed since the index was refreshed.
pub fn reduction_reach(eg: &EGraph) -> &ReductionReach {
    eg.analysis.reduction_reach.get_or_init(|| {
        let targets: Vec<Id> = eg
            .analysis
            .parallel_reductions
            .iter()
            .map(|e| e.0)
            .collect();
        if targets.len() > 1 {
            ReductionReach::new(eg, &targets)
        } else {
            ReductionReach::default()
        }
    })
}

impl ReductionReach {
    /// Reachability to `targets` (canonical class ids) in `eg`, which must be rebuilt.
    pub fn new(eg: &EGraph, targets: &[Id]) -> ReductionReach {
        let mut index = HashMap::new();
        for &t in targets {
            let next = index.len();
            index.entry(t).or_insert(next);
        }
        let slots = eg
            .classes()
            .map(|c| usize::from(c.id) + 1)
            .max()
            .unwrap_or(0);
        let users = (0..index.len()).map(|_| Default::default()).collect();
        ReductionReach {
            targets: index,
            slots,
            users,
        }
    }

    /// Whether some term of `from` uses `target` (`from` itself counts); false for a class
    /// that is not a target.
    pub fn reaches(&self, eg: &EGraph, from: Id, target: Id) -> bool {
        let (from, target) = (usize::from(eg.find(from)), eg.find(target));
        let Some(&i) = self.targets.get(&target) else {
            return false;
        };
        let users = self.users[i].get_or_init(|| {
            // Mark every user of the target, walking parent lists upward.
            let mut bits = vec![0u64; self.slots.div_ceil(64)];
            let mut stack = vec![target];
            while let Some(c) = stack.pop() {
                let Some(word) = bits.get_mut(usize::from(c) / 64) else {
                    continue;
                };
                let bit = 1u64 << (usize::from(c) % 64);
                if *word & bit == 0 {
                    *word |= bit;
                    stack.extend(eg[c].parents().map(|p| eg.find(p)));
                }
            }
            bits
        });
        users
            .get(from / 64)
            .is_some_and(|w| w & (1 << (from % 64)) != 0)
    }
}

/// An e-graph with the function interface it represents.
pub struct TypedEGraph {
    pub name: String,
    pub name_span: Span,
    pub bindings: Vec<Binding>,
    pub egraph: EGraph,
    pub roots: Vec<Id>,
}

fn new_egraph(reducers: &[ReducerDef], bindings: &[Binding]) -> EGraph {
    egg::EGraph::new(TypeAnalysis {
        parallel_reductions: Vec::new(),
        reduction_reach: std::sync::OnceLock::new(),
        known_type: None,
        results: Vec::new(),
        late: false,
        env: TypeEnv::for_bindings(reducers, bindings),
        conflicts: 0,
    })
}

impl TypedEGraph {
    /// Builds the e-graph of a verified function (one e-class per distinct expression).
    pub fn from_function(f: &Function, reducers: &[ReducerDef]) -> Result<TypedEGraph, String> {
        let mut egraph = new_egraph(reducers, &f.bindings);
        let body = &f.body;
        let mut ids: Vec<Id> = Vec::with_capacity(body.nodes.len());
        let env = TypeEnv::new(reducers);
        for id in body.ids() {
            let n = body.node(id);
            let operands = n.kind.operands();
            let types: Vec<&Type> = operands
                .iter()
                .map(|o| {
                    body.ty(*o)
                        .ok_or_else(|| "function is not verified".to_string())
                })
                .collect::<Result<_, _>>()?;
            let kind = crate::verify::typing::resolve_field_name(body, &n.kind, &env)
                .map_err(|e| e.message)?;
            let node = Node {
                kind: kind.unwrap_or_else(|| n.kind.clone()),
                ..n.clone()
            };
            let pos = body.params.iter().position(|p| *p == id).map(|p| p as u32);
            let children = operands.iter().map(|o| ids[o.index()]).collect();
            let enode = ENode::from_node(&node, pos, children, &types)?;
            ids.push(egraph.add(enode));
        }
        rebuild(&mut egraph);
        let roots = body
            .results
            .iter()
            .map(|r| egraph.find(ids[r.index()]))
            .collect();
        Ok(TypedEGraph {
            name: f.name.clone(),
            name_span: f.name_span,
            bindings: f.bindings.clone(),
            egraph,
            roots,
        })
    }

    /// The reducers this e-graph knows that `known` lacks: those saturation made (product
    /// fusion). Its dump names them, so whoever rebuilds it from the dump must be given them.
    pub fn made_reducers<'a>(
        &'a self,
        known: &'a [ReducerDef],
    ) -> impl Iterator<Item = &'a ReducerDef> + 'a {
        let env = &self.egraph.analysis.env;
        env.reducers()
            .iter()
            .filter(|r| known.iter().all(|k| k.name != r.name))
    }

    /// Rebuilds the e-graph a dump describes (the dump must verify).
    pub fn from_dump(g: &EGraphDump, reducers: &[ReducerDef]) -> Result<TypedEGraph, String> {
        let mut egraph = new_egraph(reducers, &g.bindings);
        let class_ty: HashMap<u32, &Type> = g.classes.iter().map(|c| (c.id, &c.ty)).collect();
        let mut made: HashMap<u32, Id> = HashMap::new();
        let mut pending: Vec<(u32, &DumpNode)> = g
            .classes
            .iter()
            .flat_map(|c| c.nodes.iter().map(move |n| (c.id, n)))
            .collect();
        // E-nodes may refer to classes printed later, and cycles are allowed: add an e-node once
        // all its children exist. Every class has an acyclic e-node, so this terminates.
        while !pending.is_empty() {
            let before = pending.len();
            let mut rest = Vec::new();
            for (cid, n) in pending {
                let children: Option<Vec<Id>> =
                    n.children.iter().map(|c| made.get(c).copied()).collect();
                let Some(children) = children else {
                    rest.push((cid, n));
                    continue;
                };
                let types: Vec<&Type> = n
                    .children
                    .iter()
                    .filter_map(|c| class_ty.get(c).copied())
                    .collect();
                let node = Node {
                    kind: n.kind.clone(),
                    name: None,
                    annot: class_ty.get(&cid).map(|t| (*t).clone()),
                    span: n.span,
                    ty: None,
                };
                // Each e-node has its class's type, as the verifier requires of dump text: one
                // that does not type (over a reducer not given, say) would be added untyped,
                // and the e-graph would be another than the dump's, without a word.
                if let Some(&ty) = class_ty.get(&cid) {
                    match infer(&n.kind, &types, Some(ty), &egraph.analysis.env) {
                        Ok(t) if t == *ty => {}
                        Ok(t) => {
                            return Err(format!(
                                "e-class %{cid} of type {ty} has an e-node of type {t}"
                            ))
                        }
                        Err(e) => return Err(format!("e-class %{cid}: {}", e.message)),
                    }
                }
                let enode = ENode::from_node(&node, n.input, children, &types)?;
                let id = egraph.add(enode);
                match made.get(&cid) {
                    Some(&existing) => {
                        egraph.union(existing, id);
                    }
                    None => {
                        made.insert(cid, id);
                    }
                }
            }
            if rest.len() == before {
                return Err("the dump has e-classes with no acyclic e-node".into());
            }
            pending = rest;
        }
        rebuild(&mut egraph);
        let roots = g
            .roots
            .iter()
            .map(|r| {
                made.get(r)
                    .map(|id| egraph.find(*id))
                    .ok_or_else(|| format!("root %{r} is not defined"))
            })
            .collect::<Result<_, _>>()?;
        Ok(TypedEGraph {
            name: g.name.clone(),
            name_span: g.name_span,
            bindings: g.bindings.clone(),
            egraph,
            roots,
        })
    }

    /// The e-graph as a dump. Classes are numbered by first appearance in a depth-first walk
    /// from the roots over sorted e-nodes, and a class's e-nodes are listed by operator and
    /// numbered children, so the text does not depend on the e-graph's internal ids as long as
    /// the walk meets the classes in the same order (the internal ids can still break ties in
    /// the walk: this is not a graph canonisation).
    pub fn to_dump(&self) -> EGraphDump {
        let eg = &self.egraph;
        let mut order: Vec<Id> = Vec::new();
        let mut number: HashMap<Id, u32> = HashMap::new();
        let sorted_nodes = |id: Id| {
            let mut ns: Vec<ENode> = eg[id]
                .nodes
                .iter()
                .map(|n| n.clone().map_children(|c| eg.find(c)))
                .collect();
            ns.sort();
            ns.dedup();
            ns
        };
        // Iterative post-order so that children are numbered before parents where possible.
        // E-graphs have cycles: a class is expanded once, numbered when its walk completes.
        let mut stack: Vec<(Id, bool)> = self
            .roots
            .iter()
            .rev()
            .map(|r| (eg.find(*r), false))
            .collect();
        let mut expanded_once = std::collections::HashSet::new();
        while let Some((id, expanded)) = stack.pop() {
            if number.contains_key(&id) {
                continue;
            }
            if expanded {
                number.insert(id, order.len() as u32);
                order.push(id);
                continue;
            }
            if !expanded_once.insert(id) {
                continue;
            }
            stack.push((id, true));
            for n in sorted_nodes(id).iter().rev() {
                for c in n.children.iter().rev() {
                    if !number.contains_key(c) {
                        stack.push((*c, false));
                    }
                }
            }
        }
        // An input no result reads is still a parameter of every candidate (the candidates
        // take the source's inputs): its class follows, by input position.
        let mut unread: Vec<(u32, Id)> = eg
            .classes()
            .filter(|c| !number.contains_key(&c.id))
            .filter_map(|c| {
                c.nodes.iter().find_map(|n| match n.op {
                    Op::Input(pos, _) => Some((pos, c.id)),
                    _ => None,
                })
            })
            .collect();
        unread.sort();
        for (_, id) in unread {
            number.insert(id, order.len() as u32);
            order.push(id);
        }
        // A class's e-nodes print in the order of their operators and numbered children, not
        // of the e-graph's internal ids, which depend on the order the e-nodes were added in.
        let renumbered = |id: Id| {
            let mut ns: Vec<(Vec<u32>, ENode)> = sorted_nodes(id)
                .into_iter()
                .map(|n| (n.children.iter().map(|c| number[c]).collect(), n))
                .collect();
            ns.sort_by(|(ka, a), (kb, b)| a.op.cmp(&b.op).then_with(|| ka.cmp(kb)));
            ns
        };
        let classes = order
            .iter()
            .map(|id| DumpClass {
                id: number[id],
                ty: eg[*id].data.clone().unwrap_or(Type::Tuple(vec![])),
                span: self.name_span,
                nodes: renumbered(*id)
                    .into_iter()
                    .map(|(children, n)| DumpNode {
                        kind: named_dims(n.to_expr_kind(), &n, eg),
                        children,
                        input: match n.op {
                            Op::Input(pos, _) => Some(pos),
                            _ => None,
                        },
                        span: self.name_span,
                    })
                    .collect(),
            })
            .collect();
        EGraphDump {
            name: self.name.clone(),
            name_span: self.name_span,
            bindings: self.bindings.clone(),
            classes,
            roots: self.roots.iter().map(|r| number[&eg.find(*r)]).collect(),
            roots_span: self.name_span,
        }
    }

    pub fn class_count(&self) -> usize {
        self.egraph.number_of_classes()
    }

    pub fn node_count(&self) -> usize {
        self.egraph.total_number_of_nodes()
    }
}

/// Dimension references print by symbol where that is unambiguous (`partition[K,p]`).
fn named_dims(kind: ExprKind, n: &ENode, eg: &EGraph) -> ExprKind {
    let operand_shape = || -> Option<Vec<Dim>> {
        match eg[*n.children.first()?].data.as_ref()? {
            Type::Tensor(t) => Some(t.shape.clone()),
            Type::Tuple(fs) => match fs.first()? {
                Type::Tensor(t) => Some(t.shape.clone()),
                Type::Tuple(_) => None,
            },
        }
    };
    let name = |shape: Option<Vec<Dim>>, d: &DimRef| -> DimRef {
        match (shape, d) {
            (Some(shape), DimRef::Index(i)) => {
                let text = dim_ref_text(&shape, *i);
                if is_dim_symbol(&text) {
                    DimRef::Name(text)
                } else {
                    d.clone()
                }
            }
            _ => d.clone(),
        }
    };
    match kind {
        ExprKind::Partition(d, a, x) => ExprKind::Partition(name(operand_shape(), &d), a, x),
        ExprKind::Combination(d, a, x) => ExprKind::Combination(name(operand_shape(), &d), a, x),
        ExprKind::Slice(d, s, e, x) => ExprKind::Slice(name(operand_shape(), &d), s, e, x),
        ExprKind::Concat(d, xs) => ExprKind::Concat(name(operand_shape(), &d), xs),
        ExprKind::Iota(d) => {
            let shape = match &n.op {
                Op::Iota(_, t) => Some(t.shape.clone()),
                _ => None,
            };
            ExprKind::Iota(name(shape, &d))
        }
        ExprKind::Reduce {
            input,
            over: ReduceOver::Axis(d),
            reducer,
            keep_dims,
        } => ExprKind::Reduce {
            input,
            over: ReduceOver::Axis(name(operand_shape(), &d)),
            reducer,
            keep_dims,
        },
        other => other,
    }
}

/// `egraph.rebuild()` under a mock clock: egg only uses the clock to log how long a rebuild
/// took, and the real one costs a TSC calibration of up to 200 ms on first use per process.
pub fn rebuild(egraph: &mut EGraph) -> usize {
    let (clock, _mock) = quanta::Clock::mock();
    quanta::with_clock(&clock, || egraph.rebuild())
}
