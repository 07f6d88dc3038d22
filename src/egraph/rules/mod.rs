//! The equality-rule library. See `README.md` in this folder for the policy every rule
//! follows. A rule looks at one e-node of one e-class and proposes equal terms; the runner
//! type-checks each proposal against the class before the union, so a wrong rule is reported
//! by name instead of silently merging values of different types.

mod algebraic;
mod fusion;
mod layout;
mod propagation;
mod refinement;
pub mod repair;
mod slicing;

pub use fusion::describe_generated;
mod storage;
mod structural;

use super::graph::EGraph;
use super::lang::{ENode, Op};
use crate::ir::{Dim, DimBase, ParState, Sym, TensorType, Type};
use egg::Id;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Family {
    Algebraic,
    Refinement,
    Propagation,
    Fusion,
    Structural,
    Storage,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Algebraic => "algebraic",
            Family::Refinement => "refinement",
            Family::Propagation => "propagation",
            Family::Fusion => "fusion",
            Family::Structural => "structural",
            Family::Storage => "storage",
        }
    }

    pub const ALL: [Family; 6] = [
        Family::Algebraic,
        Family::Refinement,
        Family::Propagation,
        Family::Fusion,
        Family::Structural,
        Family::Storage,
    ];

    pub fn parse(s: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == s)
    }
}

/// A term to add to the e-graph: existing classes at the leaves.
#[derive(Clone, Debug, PartialEq)]
pub enum Term {
    Class(Id),
    Node(Op, Vec<Term>),
}

pub fn node(op: Op, kids: Vec<Term>) -> Term {
    Term::Node(op, kids)
}

pub fn cls(id: Id) -> Term {
    Term::Class(id)
}

/// What a rule proposes at one e-node: terms equal to the matched class (or to another class
/// the rule names), and reducer definitions those terms use (made by fusion rules).
#[derive(Default)]
pub struct Out {
    pub proposals: Vec<(Option<Id>, Term)>,
    pub reducers: Vec<crate::ir::ReducerDef>,
}

impl Out {
    /// Proposes `t` as equal to the matched class.
    pub fn push(&mut self, t: Term) {
        self.proposals.push((None, t));
    }

    /// Proposes `t` as equal to `class`.
    pub fn equal(&mut self, class: Id, t: Term) {
        self.proposals.push((Some(class), t));
    }
}

pub type Finder = fn(&EGraph, Id, &ENode, &mut Out);

pub struct Rule {
    pub name: &'static str,
    pub family: Family,
    pub equation: &'static str,
    /// The operators the rule's matched e-node can have: the runner calls `find` on those only.
    pub root: Root,
    pub find: Finder,
    /// What the finder reads besides its e-node: the runner's incremental search relies on it.
    pub reach: Reach,
}

/// What a rule's finder reads, which decides where incremental search must look again after
/// a change (see `docs/egraph.md` §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// The e-node alone, with the identity and type of its operands (commutativity): only a
    /// new e-node, or one with an operand class merged with another, is searched again.
    Own,
    /// The e-node, the e-nodes of its operand classes and the identity of their operands: a
    /// new e-node, or one whose operands changed, is searched again.
    Node,
    /// Also which e-nodes its own class holds (combination injectivity pairs siblings):
    /// every e-node of a changed class is searched again.
    ClassNodes,
    /// Anything, to any depth (repair fusion follows a consumer's contribution down and pairs
    /// it with a producer anywhere; product fusion pairs independent reductions anywhere):
    /// every e-node is searched every iteration.
    EGraph,
    /// Like `EGraph`, and the finder proposes nothing until the other rules have saturated
    /// (`TypeAnalysis::late`): the runner then runs one more iteration for it. For rules that
    /// refine what no other rule refined, which is known only then.
    Late,
}

/// The kind of e-node a rule matches at, as egg indexes patterns by their root operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    Any,
    Binary,
    Pointwise,
    MatMul,
    Transpose,
    Broadcast,
    ReduceAxis,
    ReduceParallel,
    Partition,
    Replicate,
    Combination,
    Slice,
    Concat,
    Reshape,
}

impl Root {
    pub const ALL: [Root; 14] = [
        Root::Any,
        Root::Binary,
        Root::Pointwise,
        Root::MatMul,
        Root::Transpose,
        Root::Broadcast,
        Root::ReduceAxis,
        Root::ReduceParallel,
        Root::Partition,
        Root::Replicate,
        Root::Combination,
        Root::Slice,
        Root::Concat,
        Root::Reshape,
    ];

    /// The roots `op` matches, as a bit set indexed by discriminant.
    pub fn set_of(op: &Op) -> u16 {
        let one = |r: Root| 1u16 << r as usize;
        let specific = match op {
            Op::Binary(_) => one(Root::Binary) | one(Root::Pointwise),
            Op::Unary(_) | Op::Select | Op::Cast(_) => one(Root::Pointwise),
            Op::MatMul(_) => one(Root::MatMul),
            Op::Transpose(_) => one(Root::Transpose),
            Op::Broadcast(_) => one(Root::Broadcast),
            Op::ReduceAxis { .. } => one(Root::ReduceAxis),
            Op::ReduceParallel { .. } => one(Root::ReduceParallel),
            Op::Partition(..) => one(Root::Partition),
            Op::Replicate(_) => one(Root::Replicate),
            Op::Combination(..) => one(Root::Combination),
            Op::Slice(..) => one(Root::Slice),
            Op::Concat(_) => one(Root::Concat),
            Op::Reshape(_) => one(Root::Reshape),
            _ => 0,
        };
        one(Root::Any) | specific
    }

    /// Whether a rule rooted here can match an e-node with operator `op`.
    pub fn matches(self, op: &Op) -> bool {
        Root::set_of(op) & (1 << self as usize) != 0
    }
}

/// Every rule, grouped by family.
pub fn all_rules() -> Vec<&'static Rule> {
    let mut v: Vec<&'static Rule> = Vec::new();
    v.extend(algebraic::RULES.iter());
    v.extend(layout::RULES.iter());
    v.extend(refinement::RULES.iter());
    v.extend(fusion::RULES.iter());
    v.extend(propagation::RULES.iter());
    v.extend(structural::RULES.iter());
    v.extend(storage::RULES.iter());
    v.extend(slicing::RULES.iter());
    v
}

// ---- helpers shared by the rule families ----

pub fn class_type(eg: &EGraph, id: Id) -> Option<&Type> {
    eg[id].data.as_ref()
}

pub fn tensor_type(eg: &EGraph, id: Id) -> Option<&TensorType> {
    match class_type(eg, id)? {
        Type::Tensor(t) => Some(t),
        Type::Tuple(_) => None,
    }
}

/// The parallel axis a refinement introduces for a dimension: named after it (`Q` → `q`,
/// `D_V` → `d_v`, `4096` → `n4096`), so that producer and consumer tiles of the same
/// dimension line up under propagation. Tile dimensions and axis extents are not refined.
pub fn axis_for(dim: &Dim) -> Option<String> {
    if !dim.splits.is_empty() {
        return None;
    }
    match &dim.base {
        DimBase::Sym(s) => Some(s.to_ascii_lowercase()),
        DimBase::Lit(n) if *n > 1 => Some(format!("n{n}")),
        _ => None,
    }
}

/// The `i`-th name (0-based) for a dimension whose base axis name is `base`: `k`, `k_2`,
/// `k_3`… A value or product in which one symbol names several dimensions (`SxS` scores, a
/// `DxD` weight) gives each its own axis, so that both can be split at once.
pub fn nth_axis(base: &str, i: usize) -> String {
    if i == 0 {
        base.to_string()
    } else {
        format!("{base}_{}", i + 1)
    }
}

/// The axis for dimension `d` of a value of shape `shape`: [`axis_for`] of the dimension,
/// suffixed by how many earlier dimensions of the shape have the same base name (dimension 1
/// of `SxS` is split by `s_2`). Refinements of producers and consumers of one value thus name
/// the same dimension alike.
pub fn axis_at(shape: &[Dim], d: usize) -> Option<String> {
    let base = axis_for(shape.get(d)?)?;
    let earlier = shape[..d]
        .iter()
        .filter(|e| axis_for(e).as_deref() == Some(base.as_str()))
        .count();
    Some(nth_axis(&base, earlier))
}

/// The axis for dimension `d` of `shape` as [`axis_at`] names it, or, for a literal 1, `n1`
/// (`n1_2` for the second literal 1 of the shape…). A reduction splits a kept literal 1 only
/// where it is the leading dimension and every dimension ahead of the reduced one is a
/// literal 1: a one-row batch written `1xH` then gets a grid of one
/// program over the row, whose loads of a stored value are other e-classes than the tiles
/// that computed it (without one, a softmax over a stored `1xV` product could only
/// recompute the product). Products and pointwise values are not split along a literal 1:
/// programs full of size-1 dimensions would hold ten times the e-classes.
pub fn axis_at_or_one(shape: &[Dim], d: usize) -> Option<String> {
    if !shape.get(d)?.is_one() {
        return axis_at(shape, d);
    }
    let earlier = shape[..d].iter().filter(|e| e.is_one()).count();
    Some(nth_axis("n1", earlier))
}

/// True when `axis` is free in every given state.
pub fn fresh(axis: &str, states: &[&ParState]) -> bool {
    states.iter().all(|s| s.get(axis).is_none())
}

/// The e-nodes of a class (canonical children).
pub fn nodes(eg: &EGraph, id: Id) -> &[ENode] {
    &eg[id].nodes
}
