//! Lazy composition: the best programs of a composition (a function of calls) from its
//! callees' ranked candidates, by a k-best merge of estimate sums, each inlined into one
//! program.

use crate::ir::{Body, ExprKind, Function, Node, NodeId, ReduceOver, Sym};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// The `k` smallest sums choosing one entry of each list (each sorted ascending), as (sum,
/// index per list), smallest first; ties by the index vectors. Lazy: a heap of frontier
/// choices, each popped one's successors (one index advanced) pushed once — O(k·n·log) work
/// for n lists, never the product of their lengths.
pub fn k_best(lists: &[Vec<f64>], k: usize) -> Vec<(f64, Vec<usize>)> {
    if lists.iter().any(|l| l.is_empty()) || k == 0 {
        return Vec::new();
    }
    let sum = |ix: &[usize]| -> f64 { ix.iter().zip(lists).map(|(i, l)| l[*i]).sum() };
    let start = vec![0usize; lists.len()];
    let mut heap = BinaryHeap::new();
    let mut seen = BTreeSet::new();
    heap.push(Reverse((Key(sum(&start)), start.clone())));
    seen.insert(start);
    let mut out = Vec::new();
    while let Some(Reverse((Key(s), ix))) = heap.pop() {
        out.push((s, ix.clone()));
        if out.len() == k {
            break;
        }
        for j in 0..ix.len() {
            if ix[j] + 1 < lists[j].len() {
                let mut next = ix.clone();
                next[j] += 1;
                if seen.insert(next.clone()) {
                    heap.push(Reverse((Key(sum(&next)), next)));
                }
            }
        }
    }
    out
}

/// An f64 ordered totally (estimates are finite).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Key(f64);
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Key {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// The callees of a composition, one per call in body order.
pub fn calls(comp: &Function) -> Vec<String> {
    comp.body
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            ExprKind::Call(f, _) => Some(f.clone()),
            _ => None,
        })
        .collect()
}

/// An axis of call `k`: renamed apart from every other call's (`h` → `h_0`), so that each
/// inlined part keeps its own block sizes.
fn axis(a: Sym, k: usize) -> Sym {
    Sym::new(&format!("{}_{k}", a.as_str()))
}

fn rename_axes(kind: &ExprKind, k: usize) -> ExprKind {
    match kind {
        ExprKind::Partition(d, a, x) => ExprKind::Partition(d.clone(), axis(*a, k), *x),
        ExprKind::Replicate(a, x) => ExprKind::Replicate(axis(*a, k), *x),
        ExprKind::Combination(d, a, x) => ExprKind::Combination(d.clone(), axis(*a, k), *x),
        ExprKind::Collection(a, x) => ExprKind::Collection(axis(*a, k), *x),
        ExprKind::Reduce {
            input,
            over: ReduceOver::Parallel(a),
            reducer,
            keep_dims,
        } => ExprKind::Reduce {
            input: *input,
            over: ReduceOver::Parallel(axis(*a, k)),
            reducer: reducer.clone(),
            keep_dims: *keep_dims,
        },
        other => other.clone(),
    }
}

/// The composition `comp` with call `k` replaced by the body of `chosen[k]` (a candidate of
/// its callee: same parameters and results), named `name`.
pub fn inline(comp: &Function, chosen: &[&Function], name: &str) -> Function {
    let body = &comp.body;
    let mut out = Body::default();
    let mut map: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    // Per call node: the inlined results.
    let mut results_of: BTreeMap<NodeId, Vec<NodeId>> = BTreeMap::new();
    let mut k = 0;
    for id in body.ids() {
        let n = body.node(id);
        match &n.kind {
            ExprKind::Input => {
                let nid = out.push(Node {
                    ty: None,
                    ..n.clone()
                });
                out.params.push(nid);
                map.insert(id, nid);
            }
            ExprKind::Call(_, args) => {
                let Some(g) = chosen.get(k) else {
                    continue;
                };
                let gb = &g.body;
                let mut gmap: BTreeMap<NodeId, NodeId> = BTreeMap::new();
                let mut arg = 0;
                for gid in gb.ids() {
                    let gn = gb.node(gid);
                    if matches!(gn.kind, ExprKind::Input) {
                        if let Some(a) = args.get(arg).and_then(|a| map.get(a)) {
                            gmap.insert(gid, *a);
                        }
                        arg += 1;
                        continue;
                    }
                    let ops: Vec<NodeId> = gn
                        .kind
                        .operands()
                        .iter()
                        .map(|o| gmap.get(o).copied().unwrap_or(NodeId(0)))
                        .collect();
                    let nid = out.push(Node {
                        kind: rename_axes(&gn.kind.with_operands(&ops), k),
                        name: gn.name.as_ref().map(|s| format!("s{k}_{s}")),
                        annot: gn.annot.clone(),
                        span: gn.span,
                        ty: None,
                    });
                    gmap.insert(gid, nid);
                }
                let rs: Vec<NodeId> = gb
                    .results
                    .iter()
                    .map(|r| gmap.get(r).copied().unwrap_or(NodeId(0)))
                    .collect();
                if let [one] = rs.as_slice() {
                    map.insert(id, *one);
                }
                results_of.insert(id, rs);
                k += 1;
            }
            ExprKind::Get(crate::ir::FieldRef::Index(i), c) if results_of.contains_key(c) => {
                if let Some(r) = results_of.get(c).and_then(|rs| rs.get(*i)) {
                    map.insert(id, *r);
                }
            }
            _ => {
                let ops: Vec<NodeId> = n
                    .kind
                    .operands()
                    .iter()
                    .map(|o| map.get(o).copied().unwrap_or(NodeId(0)))
                    .collect();
                let nid = out.push(Node {
                    kind: n.kind.with_operands(&ops),
                    ty: None,
                    ..n.clone()
                });
                map.insert(id, nid);
            }
        }
    }
    out.results = body
        .results
        .iter()
        .map(|r| map.get(r).copied().unwrap_or(NodeId(0)))
        .collect();
    out.results_span = body.results_span;
    Function {
        name: name.to_string(),
        name_span: comp.name_span,
        bindings: comp.bindings.clone(),
        body: out,
        comment: None,
        schedule: None,
    }
}

#[cfg(test)]
mod tests {
    use super::k_best;

    #[test]
    fn k_best_gives_the_smallest_sums_in_order_without_the_product() {
        let lists = vec![vec![1.0, 2.0, 10.0], vec![0.5, 3.0], vec![0.0, 0.25, 7.0]];
        let got = k_best(&lists, 5);
        // Every sum, sorted: the first five.
        let mut all = Vec::new();
        for a in &lists[0] {
            for b in &lists[1] {
                for c in &lists[2] {
                    all.push(a + b + c);
                }
            }
        }
        all.sort_by(f64::total_cmp);
        let sums: Vec<f64> = got.iter().map(|g| g.0).collect();
        assert_eq!(sums, all[..5].to_vec());
        assert_eq!(got[0].1, vec![0, 0, 0]);
        // Distinct choices.
        let mut ix: Vec<_> = got.iter().map(|g| g.1.clone()).collect();
        ix.dedup();
        assert_eq!(ix.len(), 5);
        assert!(k_best(&[vec![], vec![1.0]], 3).is_empty());
    }
}
