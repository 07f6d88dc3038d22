//! Candidate extraction (paper §5.1, Algorithm 1).
//!
//! A *candidate* picks one e-node for every e-class reachable from the results and forms a
//! finite acyclic program. It must be lowerable: tensor-level `matmul` is never picked (its
//! tiled implementations are), and every other operator either lies in a tiled region or has
//! a default tiling. A *partial program* has picked e-nodes for some classes; the reachable
//! classes without a pick are its holes.
//!
//! Candidates are grouped by an equivalence ≈: programs that differ only in the operand
//! order of commutative pointwise operators, or in the order in which a value's parallel
//! views (`partition`/`replicate`) or a result's `combination`s are written, are one class.
//! Matmul structure, reduction organisation and intermediate storage stay distinct. Each
//! partial program has a canonical form — holes named by their e-class, commutative operands
//! sorted, view chains as sorted sets — interned exactly (no hashing shortcuts), so two
//! partial programs are ≈ₚ when their canonical forms are equal.
//!
//! Three modes, as in the paper's ablation: `None` outputs every complete candidate; `After`
//! constructs every candidate and keeps one per class; `Early` (Algorithm 1) prunes a partial
//! program before expanding it when an equal canonical form was seen.

use super::graph::TypedEGraph;
use super::lang::{ENode, Op};
use crate::ir::{BinaryOp, Body, ExprKind, Function, Node, NodeId, Type};
use egg::Id;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Compaction {
    None,
    After,
    Early,
}

impl Compaction {
    pub fn parse(s: &str) -> Option<Compaction> {
        match s {
            "none" => Some(Compaction::None),
            "after" => Some(Compaction::After),
            "early" => Some(Compaction::Early),
            _ => None,
        }
    }
}

/// Why extraction stopped.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum ExtractStop {
    /// Every partial program was expanded or pruned.
    Exhausted,
    CandidateLimit(usize),
    TimeLimit(f64),
}

impl std::fmt::Display for ExtractStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExtractStop::Exhausted => f.write_str("exhausted"),
            ExtractStop::CandidateLimit(n) => write!(f, "candidate limit ({n}) reached"),
            ExtractStop::TimeLimit(s) => write!(f, "time limit ({s} s) reached"),
        }
    }
}

/// One picked e-node index per class (dense class index); `NONE` marks a hole or an
/// unreachable class.
pub type Choice = Vec<u32>;
const NONE: u32 = u32::MAX;

#[derive(Clone, Debug)]
pub struct Candidate {
    pub choice: Choice,
}

#[derive(Clone, Debug)]
pub struct ExtractReport {
    pub stop: ExtractStop,
    /// Partial programs taken from the worklist and expanded (not pruned).
    pub expanded: usize,
    /// Complete candidates constructed.
    pub complete: usize,
    /// Complete programs rejected for having no kernel launch order.
    pub rejected: usize,
    /// Distinct candidates (classes of ≈) among the complete ones.
    pub distinct: usize,
    pub seconds: f64,
    /// The output, in discovery order.
    pub candidates: Vec<Candidate>,
}

/// The e-graph as extraction sees it: dense class indices, and per class only the e-nodes
/// that can appear in a lowerable program.
pub struct ExtractGraph<'a> {
    pub g: &'a TypedEGraph,
    /// Canonical e-class id per dense index, in id order.
    pub ids: Vec<Id>,
    /// Valid e-nodes per class: (e-node, children as dense indices).
    pub nodes: Vec<Vec<(ENode, Vec<u32>)>>,
    pub roots: Vec<u32>,
    /// Valid single-operand e-nodes by (operator, operand class) → their class, to find the
    /// canonically ordered variant of a view chain.
    unary_index: HashMap<(Op, u32), u32>,
}

impl<'a> ExtractGraph<'a> {
    /// Keeps the e-nodes of a lowerable program: no tensor-level `matmul`, and only e-nodes
    /// all of whose children have some finite acyclic lowerable term. Fails when a result has
    /// none.
    pub fn new(g: &'a TypedEGraph) -> Result<ExtractGraph<'a>, String> {
        let eg = &g.egraph;
        let mut ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
        ids.sort();
        let index: HashMap<Id, u32> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (*id, i as u32))
            .collect();
        let mut nodes: Vec<Vec<(ENode, Vec<u32>)>> = ids
            .iter()
            .map(|id| {
                let mut v: Vec<(ENode, Vec<u32>)> = eg[*id]
                    .nodes
                    .iter()
                    .filter(|n| !matches!(n.op, Op::MatMul { .. }))
                    .map(|n| {
                        let kids = n.children.iter().map(|k| index[&eg.find(*k)]).collect();
                        (n.clone(), kids)
                    })
                    .collect();
                v.sort_by(|a, b| a.0.cmp(&b.0));
                v
            })
            .collect();
        // A tensor-level value that has a tiled implementation (a `combination` of tiles) is
        // computed by it: as with matmul, the default-tiled tensor-level operator is skipped.
        // Values without one keep their default tiling.
        for (c, ns) in nodes.iter_mut().enumerate() {
            let untiled = !tiled(eg[ids[c]].data.as_ref());
            if untiled && ns.iter().any(|(n, _)| matches!(n.op, Op::Combination(..))) {
                ns.retain(|(n, _)| !is_compute(&n.op));
            }
        }
        // Classes with a finite term: least fixed point from the leaves.
        let mut finite = vec![false; ids.len()];
        loop {
            let mut changed = false;
            for (c, ns) in nodes.iter().enumerate() {
                if !finite[c]
                    && ns
                        .iter()
                        .any(|(_, k)| k.iter().all(|k| finite[*k as usize]))
                {
                    finite[c] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        for ns in &mut nodes {
            ns.retain(|(_, k)| k.iter().all(|k| finite[*k as usize]));
        }
        // Exploration order (it decides which candidates come first when a limit stops the
        // search, never which exist): cheapest tree cost first, counting a tensor-level
        // operator (its own kernel) and a store as expensive.
        let cost = |n: &ENode, c: usize| -> f64 {
            let untiled = !tiled(eg[ids[c]].data.as_ref());
            match &n.op {
                Op::Combination(..) | Op::Collection(_) => 20.0,
                op if untiled && is_compute(op) => 100.0,
                _ => 1.0,
            }
        };
        let mut best = vec![f64::INFINITY; ids.len()];
        loop {
            let mut changed = false;
            for (c, ns) in nodes.iter().enumerate() {
                for (n, kids) in ns {
                    let total = cost(n, c) + kids.iter().map(|k| best[*k as usize]).sum::<f64>();
                    if total < best[c] {
                        best[c] = total;
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        for (c, ns) in nodes.iter_mut().enumerate() {
            let total = |(n, kids): &(ENode, Vec<u32>)| {
                cost(n, c) + kids.iter().map(|k| best[*k as usize]).sum::<f64>()
            };
            ns.sort_by(|a, b| total(a).total_cmp(&total(b)).then_with(|| a.0.cmp(&b.0)));
        }
        let roots: Vec<u32> = g.roots.iter().map(|r| index[&eg.find(*r)]).collect();
        if let Some(r) = roots.iter().find(|r| !finite[**r as usize]) {
            return Err(format!(
                "result e-class %{} has no lowerable program (every term uses a tensor-level matmul or a cycle)",
                ids[*r as usize]
            ));
        }
        let mut unary_index = HashMap::new();
        for (c, ns) in nodes.iter().enumerate() {
            for (n, kids) in ns {
                if let [k] = kids.as_slice() {
                    unary_index.insert((n.op.clone(), *k), c as u32);
                }
            }
        }
        Ok(ExtractGraph {
            g,
            ids,
            nodes,
            roots,
            unary_index,
        })
    }

    fn op(&self, c: u32, choice: &Choice) -> Option<&(ENode, Vec<u32>)> {
        let n = choice[c as usize];
        (n != NONE).then(|| &self.nodes[c as usize][n as usize])
    }
}

/// A canonical term: holes by class, commutative operands sorted, view chains as sets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Hole(u32),
    Node(Op, Vec<u32>),
    /// A value under a chain of `partition`/`replicate` views, in canonical order.
    Views(u32, Vec<Op>),
    /// A value under a chain of `combination`s, in canonical order.
    Combinations(u32, Vec<Op>),
}

fn commutative(op: &Op) -> bool {
    matches!(
        op,
        Op::Binary(
            BinaryOp::Add
                | BinaryOp::Multiply
                | BinaryOp::Maximum
                | BinaryOp::Minimum
                | BinaryOp::Equal
                | BinaryOp::NotEqual
                | BinaryOp::And
                | BinaryOp::Or
        )
    )
}

/// Operators that compute (as opposed to leaves, views, stores and tuple plumbing).
fn is_compute(op: &Op) -> bool {
    !matches!(
        op,
        Op::Input(..)
            | Op::Constant(..)
            | Op::Fill(..)
            | Op::Iota(..)
            | Op::Partition(..)
            | Op::Replicate(_)
            | Op::Combination(..)
            | Op::Collection(_)
            | Op::Tuple
            | Op::Get(_)
    )
}

fn is_view(op: &Op) -> bool {
    matches!(op, Op::Partition(..) | Op::Replicate(_))
}

/// Canonical order of a chain of views: replicates (by axis) before partitions; partitions by
/// dimension, keeping the written order of partitions of the same dimension (nested tilings
/// of one dimension do not commute).
fn view_rank(op: &Op) -> (u8, usize, String) {
    match op {
        Op::Replicate(a) => (0, 0, a.clone()),
        Op::Partition(d, _) => (1, *d, String::new()),
        Op::Combination(d, _) => (2, *d, String::new()),
        _ => (3, 0, String::new()),
    }
}

/// Exact interning of canonical terms: equal ids ⇔ equal canonical forms.
#[derive(Default)]
struct Interner {
    map: HashMap<Key, u32>,
    keys: Vec<Key>,
}

impl Interner {
    fn intern(&mut self, k: Key) -> u32 {
        if let Some(id) = self.map.get(&k) {
            return *id;
        }
        let id = self.keys.len() as u32;
        self.keys.push(k.clone());
        self.map.insert(k, id);
        id
    }

    fn key(&self, id: u32) -> Option<&Key> {
        self.keys.get(id as usize)
    }
}

/// Walks a partial program from its results: its canonical form, and its first hole in
/// depth-first order (the class Algorithm 1 resolves next).
struct Walk<'g, 'a> {
    x: &'g ExtractGraph<'a>,
    choice: &'g Choice,
    memo: Vec<u32>,
    first_hole: Option<u32>,
}

impl Walk<'_, '_> {
    fn canon(&mut self, c: u32, interner: &mut Interner) -> u32 {
        if self.memo[c as usize] != NONE {
            return self.memo[c as usize];
        }
        let key = match self.x.op(c, self.choice) {
            None => {
                if self.first_hole.is_none() {
                    self.first_hole = Some(c);
                }
                Key::Hole(c)
            }
            Some((n, kids)) if is_view(&n.op) || matches!(n.op, Op::Combination(..)) => {
                let combos = matches!(n.op, Op::Combination(..));
                let same_kind = |op: &Op| {
                    if combos {
                        matches!(op, Op::Combination(..))
                    } else {
                        is_view(op)
                    }
                };
                let mut chain = vec![n.op.clone()];
                let mut cur = kids[0];
                while let Some((m, k)) = self
                    .x
                    .op(cur, self.choice)
                    .filter(|(m, _)| same_kind(&m.op))
                {
                    chain.push(m.op.clone());
                    cur = k[0];
                }
                let mut base = self.canon(cur, interner);
                // Written innermost first, then a stable sort: same-dimension order is kept.
                chain.reverse();
                // A lifted operator can leave a chain of the same kind right below: merge.
                match interner.key(base) {
                    Some(Key::Combinations(b, inner)) if combos => {
                        let mut all = inner.clone();
                        all.extend(chain);
                        chain = all;
                        base = *b;
                    }
                    Some(Key::Views(b, inner)) if !combos => {
                        let mut all = inner.clone();
                        all.extend(chain);
                        chain = all;
                        base = *b;
                    }
                    _ => {}
                }
                chain.sort_by_key(view_rank);
                if combos {
                    Key::Combinations(base, chain)
                } else {
                    Key::Views(base, chain)
                }
            }
            Some((n, kids)) => {
                let mut ks: Vec<u32> = kids.iter().map(|k| self.canon(*k, interner)).collect();
                if commutative(&n.op) {
                    ks.sort();
                }
                // A unary pointwise operator on partly combined tiles (the result is still
                // tiled, so in the same kernel) is the operator on the tiles, combined: lift
                // it inside the combinations.
                let still_tiled = class_tiled(self.x, c);
                let lifted = match (&n.op, ks.as_slice()) {
                    (Op::Unary(_) | Op::Cast(_), [k]) if still_tiled => match interner.key(*k) {
                        Some(Key::Combinations(base, chain)) => Some((*base, chain.clone())),
                        _ => None,
                    },
                    _ => None,
                };
                match lifted {
                    Some((base, chain)) => {
                        let inner = interner.intern(Key::Node(n.op.clone(), vec![base]));
                        Key::Combinations(inner, chain)
                    }
                    None => Key::Node(n.op.clone(), ks),
                }
            }
        };
        let id = interner.intern(key);
        self.memo[c as usize] = id;
        id
    }
}

/// The canonical form of candidate `choice` as text (holes as `□N`), comparable across runs:
/// two candidates are ≈ exactly when their canonical texts are equal.
pub fn canonical_text(x: &ExtractGraph, choice: &Choice) -> String {
    let mut interner = Interner::default();
    let mut walk = Walk {
        x,
        choice,
        memo: vec![NONE; x.ids.len()],
        first_hole: None,
    };
    let roots: Vec<u32> = x
        .roots
        .iter()
        .map(|r| walk.canon(*r, &mut interner))
        .collect();
    fn render(i: &Interner, id: u32, out: &mut String) {
        let kids = |ks: &[u32], out: &mut String| {
            out.push('(');
            for (n, k) in ks.iter().enumerate() {
                if n > 0 {
                    out.push_str(", ");
                }
                render(i, *k, out);
            }
            out.push(')');
        };
        match i.key(id) {
            Some(Key::Hole(c)) => out.push_str(&format!("□{c}")),
            Some(Key::Node(op, ks)) => {
                out.push_str(&format!("{op:?}"));
                kids(ks, out);
            }
            Some(Key::Views(b, ops)) | Some(Key::Combinations(b, ops)) => {
                out.push_str(&format!("{ops:?}"));
                kids(&[*b], out);
            }
            None => out.push('?'),
        }
    }
    let mut out = String::new();
    for r in roots {
        render(&interner, r, &mut out);
        out.push('\n');
    }
    out
}

/// True when `from`, following picked e-nodes, reaches `target`.
fn reaches(
    x: &ExtractGraph,
    choice: &Choice,
    from: &[u32],
    target: u32,
    seen: &mut [bool],
) -> bool {
    let mut stack: Vec<u32> = from.to_vec();
    seen.iter_mut().for_each(|s| *s = false);
    while let Some(c) = stack.pop() {
        if c == target {
            return true;
        }
        if std::mem::replace(&mut seen[c as usize], true) {
            continue;
        }
        if let Some((_, kids)) = x.op(c, choice) {
            stack.extend(kids);
        }
    }
    false
}

fn class_tiled(x: &ExtractGraph, c: u32) -> bool {
    tiled(x.g.egraph[x.ids[c as usize]].data.as_ref())
}

/// Whether `c` is a load: a tensor-level value, or views of one. `None` while a hole decides.
fn loadable(x: &ExtractGraph, choice: &Choice, mut c: u32) -> Option<bool> {
    loop {
        if !class_tiled(x, c) {
            return Some(true);
        }
        let (n, kids) = x.op(c, choice)?;
        if !is_view(&n.op) {
            return Some(false);
        }
        c = kids[0];
    }
}

/// Lowerability of views: a `partition` slices what it reads from global memory (a kernel
/// region is entered through loads), so its operand must be a tensor-level value or views of
/// one — never a tile computed inside a kernel, which no program could slice by its grid
/// coordinate. (`replicate` of a computed tile is a loop-invariant value and stays allowed.)
fn loads_only(x: &ExtractGraph, choice: &Choice) -> bool {
    choice.iter().enumerate().all(|(c, &n)| {
        if n == NONE {
            return true;
        }
        let (node, kids) = &x.nodes[c][n as usize];
        !matches!(node.op, Op::Partition(..)) || loadable(x, choice, kids[0]) != Some(false)
    })
}

/// Pairs (outer, inner) of single-operand operators that commute within one kernel, with
/// the canonical order: views and combinations sorted by `view_rank` (inner rank ≤ outer),
/// and a unary operator inside a combination rather than outside it (on tiled values).
fn out_of_order(x: &ExtractGraph, outer_class: u32, outer: &Op, inner: &Op) -> bool {
    let both_views = is_view(outer) && is_view(inner);
    let both_combos = matches!(outer, Op::Combination(..)) && matches!(inner, Op::Combination(..));
    if both_views || both_combos {
        return view_rank(inner) > view_rank(outer);
    }
    matches!(outer, Op::Unary(_) | Op::Cast(_))
        && matches!(inner, Op::Combination(..))
        && class_tiled(x, outer_class)
}

/// Whether the outer/inner pair (`outer` in class `p` over class `h` holding `inner` over
/// `k`) has its swapped order `inner(outer(k))` in class `p` too.
fn swapped_exists(x: &ExtractGraph, p: u32, outer: &Op, inner: &Op, k: u32) -> bool {
    x.unary_index
        .get(&(outer.clone(), k))
        .and_then(|mid| x.unary_index.get(&(inner.clone(), *mid)))
        == Some(&p)
}

/// Early-compaction pruning of the choice just made at `h`: reject it when it writes a pair of
/// commuting operators out of canonical order and the canonically ordered pair is also in the
/// e-graph (so every candidate class keeps its canonical representative).
fn canonical_order(x: &ExtractGraph, choice: &Choice, h: u32) -> bool {
    let Some((n, kids)) = x.op(h, choice) else {
        return true;
    };
    // `n` as the outer operator.
    if let [k] = kids.as_slice() {
        if let Some((m, mk)) = x.op(*k, choice) {
            if let [mk] = mk.as_slice() {
                if out_of_order(x, h, &n.op, &m.op) && swapped_exists(x, h, &n.op, &m.op, *mk) {
                    return false;
                }
            }
        }
    }
    // `n` as the inner operator of an already chosen outer one.
    if let [k] = kids.as_slice() {
        for (p, &pn) in choice.iter().enumerate() {
            if pn == NONE {
                continue;
            }
            let (o, ok) = &x.nodes[p][pn as usize];
            if ok.as_slice() == [h]
                && out_of_order(x, p as u32, &o.op, &n.op)
                && swapped_exists(x, p as u32, &o.op, &n.op, *k)
            {
                return false;
            }
        }
    }
    true
}

/// Builder-style limits, as for saturation.
pub struct Extractor {
    pub compaction: Compaction,
    pub max_candidates: usize,
    pub time_limit: Duration,
}

impl Default for Extractor {
    fn default() -> Self {
        Extractor {
            compaction: Compaction::Early,
            max_candidates: 1000,
            time_limit: Duration::from_secs(60),
        }
    }
}

impl Extractor {
    pub fn with_compaction(mut self, c: Compaction) -> Self {
        self.compaction = c;
        self
    }

    pub fn with_max_candidates(mut self, n: usize) -> Self {
        self.max_candidates = n;
        self
    }

    pub fn with_time_limit(mut self, d: Duration) -> Self {
        self.time_limit = d;
        self
    }

    /// Algorithm 1 (or its ablations): a depth-first worklist of partial programs.
    pub fn run(&self, x: &ExtractGraph) -> ExtractReport {
        let start = Instant::now();
        let classes = x.ids.len();
        let mut interner = Interner::default();
        let mut seen: HashSet<(Vec<u32>, Vec<u64>)> = HashSet::new();
        let mut distinct: HashSet<Vec<u32>> = HashSet::new();
        let mut worklist: Vec<Choice> = vec![vec![NONE; classes]];
        let mut scratch = vec![false; classes];
        let (mut expanded, mut complete, mut rejected) = (0usize, 0usize, 0usize);
        let mut candidates = Vec::new();
        let mut stop = ExtractStop::Exhausted;
        let mut taken = 0usize;
        while let Some(s) = worklist.pop() {
            taken += 1;
            if (taken == 1 || taken % 256 == 0) && start.elapsed() > self.time_limit {
                stop = ExtractStop::TimeLimit(self.time_limit.as_secs_f64());
                break;
            }
            let mut walk = Walk {
                x,
                choice: &s,
                memo: vec![NONE; classes],
                first_hole: None,
            };
            let form: Vec<u32> = x
                .roots
                .iter()
                .map(|r| walk.canon(*r, &mut interner))
                .collect();
            let hole = walk.first_hole;
            // ≈ₚ: equal canonical forms over the same resolved classes. (The same form over
            // different classes — a view chain written in another order passes through other
            // intermediate classes — could still be completed differently, so it is not
            // pruned here; its complete candidates meet in `distinct`.)
            if self.compaction == Compaction::Early {
                let mut resolved = vec![0u64; classes.div_ceil(64)];
                for (c, n) in s.iter().enumerate() {
                    if *n != NONE {
                        resolved[c / 64] |= 1 << (c % 64);
                    }
                }
                if !seen.insert((form.clone(), resolved)) {
                    continue;
                }
            }
            let Some(h) = hole else {
                if !summarize(&mut reconstruct(x, &s, "")).launch_order {
                    rejected += 1;
                    continue;
                }
                complete += 1;
                let new = distinct.insert(form);
                if new || self.compaction == Compaction::None {
                    candidates.push(Candidate { choice: s });
                    if candidates.len() >= self.max_candidates {
                        stop = ExtractStop::CandidateLimit(self.max_candidates);
                        break;
                    }
                }
                continue;
            };
            expanded += 1;
            // Children pushed in reverse so the first e-node is explored first.
            for (i, (_, kids)) in x.nodes[h as usize].iter().enumerate().rev() {
                if reaches(x, &s, kids, h, &mut scratch) {
                    continue; // would close a cycle
                }
                let mut t = s.clone();
                t[h as usize] = i as u32;
                if !loads_only(x, &t) {
                    continue;
                }
                if self.compaction == Compaction::Early && !canonical_order(x, &t, h) {
                    continue; // an equivalent, canonically ordered choice exists
                }
                worklist.push(t);
            }
        }
        ExtractReport {
            stop,
            expanded,
            complete,
            rejected,
            distinct: distinct.len(),
            seconds: start.elapsed().as_secs_f64(),
            candidates,
        }
    }
}

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

fn acyclic(edges: &HashSet<(usize, usize)>) -> bool {
    let mut indegree: HashMap<usize, usize> = HashMap::new();
    let mut out: HashMap<usize, Vec<usize>> = HashMap::new();
    for &(a, b) in edges {
        indegree.entry(a).or_default();
        *indegree.entry(b).or_default() += 1;
        out.entry(a).or_default().push(b);
    }
    let mut ready: Vec<usize> = indegree
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(k, _)| *k)
        .collect();
    let mut done = 0;
    while let Some(k) = ready.pop() {
        done += 1;
        for m in out.get(&k).into_iter().flatten() {
            let d = indegree.get_mut(m).expect("node");
            *d -= 1;
            if *d == 0 {
                ready.push(*m);
            }
        }
    }
    done == indegree.len()
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

fn tiled(t: Option<&Type>) -> bool {
    match t {
        Some(Type::Tensor(t)) => !t.par.is_empty(),
        Some(Type::Tuple(ts)) => ts.iter().any(|t| tiled(Some(t))),
        None => false,
    }
}

/// Operators that are free or folded into their consumers (no kernel of their own).
fn is_leaf_kind(k: &ExprKind) -> bool {
    matches!(
        k,
        ExprKind::Input | ExprKind::Constant(..) | ExprKind::Fill(..) | ExprKind::Iota(..)
    )
}

/// Rebuilds candidate `choice` as a function named `name` (verified types filled in).
pub fn reconstruct(x: &ExtractGraph, choice: &Choice, name: &str) -> Function {
    let eg = &x.g.egraph;
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
    let mut stack: Vec<(u32, bool)> = x.roots.iter().rev().map(|r| (*r, false)).collect();
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
                .map(|k| node_of[*k as usize].unwrap_or(NodeId(0)))
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
            stack.extend(kids.iter().rev().map(|k| (*k, false)));
        }
    }
    body.results = x
        .roots
        .iter()
        .map(|r| node_of[*r as usize].unwrap_or(NodeId(0)))
        .collect();
    Function {
        name: name.to_string(),
        name_span: x.g.name_span,
        bindings: x.g.bindings.clone(),
        body,
        comment: None,
    }
}

/// Kernel regions, stored intermediates and parallel axes of a reconstructed candidate. Stored
/// intermediates are named (`stored0`, …) so the summary can refer to them.
pub fn summarize(f: &mut Function) -> Summary {
    let nodes = &f.body.nodes;
    let n = nodes.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    // A node is in a region when it or one of its operands is tiled (stores such as
    // `combination` and fully folding reductions belong to the region they leave).
    let in_region = |i: usize| {
        tiled(nodes[i].ty.as_ref())
            || nodes[i]
                .kind
                .operands()
                .iter()
                .any(|o| tiled(nodes[o.index()].ty.as_ref()))
    };
    let mut regions = vec![false; n];
    for (i, node) in nodes.iter().enumerate() {
        if is_leaf_kind(&node.kind) {
            continue;
        }
        regions[i] = in_region(i);
        if regions[i] {
            for o in node.kind.operands() {
                if tiled(nodes[o.index()].ty.as_ref()) {
                    let (a, b) = (find(&mut parent, i), find(&mut parent, o.index()));
                    parent[a] = b;
                }
            }
        }
    }
    // Kernels: each region, and each tensor-level operator outside one (default tiling).
    // Tuple plumbing at tensor level launches nothing but is a node of the launch graph.
    let mut comp: Vec<Option<usize>> = vec![None; n];
    let mut kernel_ids = HashSet::new();
    for (i, node) in nodes.iter().enumerate() {
        if is_leaf_kind(&node.kind) {
            continue;
        }
        let c = if regions[i] { find(&mut parent, i) } else { i };
        comp[i] = Some(c);
        if regions[i] || !matches!(node.kind, ExprKind::Get(..) | ExprKind::Tuple(..)) {
            kernel_ids.insert(c);
        }
    }
    let kernels = kernel_ids.len();
    // Launch order must exist: a kernel cannot read a global-memory value it writes itself,
    // directly or through other kernels.
    let mut edges: HashSet<(usize, usize)> = HashSet::new();
    let mut self_loop = false;
    for (i, node) in nodes.iter().enumerate() {
        for o in node.kind.operands() {
            if let (Some(a), Some(b)) = (comp[o.index()], comp[i]) {
                if tiled(nodes[o.index()].ty.as_ref()) {
                    continue; // inside one region
                }
                if a == b {
                    self_loop = true;
                } else {
                    edges.insert((a, b));
                }
            }
        }
    }
    let launch_order = !self_loop && acyclic(&edges);
    // Stored: tensor-level values produced by a kernel and read by another node.
    let mut stored = Vec::new();
    let mut used = vec![false; n];
    for node in nodes {
        for o in node.kind.operands() {
            used[o.index()] = true;
        }
    }
    let mut stored_ids = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        if used[i] && !is_leaf_kind(&node.kind) && !tiled(node.ty.as_ref()) {
            if let Some(Type::Tensor(t)) = &node.ty {
                stored_ids.push(i);
                stored.push(format!("stored{}: {}", stored.len(), t));
            }
        }
    }
    let mut axes: Vec<String> = nodes
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
        kernels,
        stored,
        axes,
        launch_order,
    }
}
