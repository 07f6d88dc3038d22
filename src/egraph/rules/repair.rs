//! Repairs for repair fusion (paper §4.2), and the check that accepts one.
//!
//! A consumer that accumulates `g(y, s)` with `@add`, where `s` is a producer's *final*
//! result (a running `@max` or `@min`), can join the producer's fold if it repairs what it has
//! accumulated whenever the running state moves from `s` to `s'`: a repair `h(c, s, s')` with
//!
//! 1. `h(g(y, s), s, s') = g(y, s')` — a contribution made under the old state becomes the
//!    one the new state would have made (with the old state empty: `h(0, s, s') = 0`, an
//!    empty accumulator stays empty; see below), and
//! 2. `h(a + b, s, s') = h(a, s, s') + h(b, s, s')` — the repair distributes over the
//!    accumulation, so repairing the sum repairs every contribution in it.
//!
//! Then the fold keeps `c = Σᵢ g(yᵢ, S)` for the current state `S` at every step, and its
//! final `c` is the consumer's value. Both are identities in *free* scalars `s`, `s'`, `y`:
//! nothing orders `s` and `s'` (the guard below can make `σ(s) > σ(s')`), and nothing ties
//! them to the program's shapes.
//!
//! **The empty state.** Before any item that is not `-inf` (a masked key), a running
//! maximum is its identity `-inf`, and `exp(y − s)` or `exp(s − s')` at `s = s' = -inf` is
//! `exp(-inf + inf) = NaN`. A fold that starts with a fully masked tile (a sliding window)
//! would carry that `NaN` to its result. So the fold reads its new state through a guard
//! `σ(s') = select(equal(s', -inf), K, s')` — the shift FlashAttention uses for an empty row,
//! `K = 0` (1 for the ratio repair, where 0 would divide) — in `g` and in `h`. The exponential
//! repairs read the *old* state raw: `h(c, -inf, σ(s')) = c · exp(-inf − σ(s')) = 0`, so
//! what was accumulated while the state was empty is discarded. That is exact when the
//! consumer is masked with its producer (its contributions while the producer saw only
//! `-inf` are `exp(-inf − K) = 0`: attention's scores), and it never overflows, since
//! `s ≤ s'` whenever `s` is finite. (Guarding the old state too would keep the algebra exact
//! for any consumer but overflow: `exp(0 − s')` is `inf` for a first maximum below −88 and
//! `0 · inf = NaN`.) A consumer not masked with its producer is the net's to catch
//! (`passes::net`): it compares every candidate with its source. The shift and ratio repairs
//! read both states guarded, which is exact and overflows nothing.
//!
//! **The check.** Each identity is built as a small program (items, states and accumulators
//! as inputs, the guarded repair as written into the fold) and evaluated in the reference
//! interpreter on many samples: both orders of `s` and `s'`, equal states, small and large
//! gaps between them, a large common offset, empty states (`-inf`) alone or mixed with finite
//! ones, items far below the states (where `exp` underflows), and masked (`-inf`) items. A repair is accepted only when every sample agrees — no
//! `NaN` on either side, infinities equal, finite values within [`TOLERANCE`]. The samples
//! cover the scalar algebra however small the program's shapes are: with one query row the
//! producer's state is a single number, and two random draws of it (the earlier check) often
//! have `s ≥ s'` both times, which accepts the identity repair `h(c) = c` for
//! `exp(y − s)`.

use crate::interp::{l2_distance, Interpreter, Rng, Sizes, Tensor, TiledTensor, Value};
use crate::ir::{
    BinaryOp, Binding, Body, DType, ExprKind, Function, Module, Node, NodeId, TensorType, Type,
    UnaryOp,
};
use crate::verify::typing::TypeEnv;
use std::sync::Arc;

/// A repair `h(c, s, s')`, simplest first (the order they are tried in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Repair {
    Keep,
    ScaleExpOldMinusNew,
    ScaleExpNewMinusOld,
    ShiftNewMinusOld,
    ScaleOldOverNew,
}

#[rustfmt::skip]
impl Repair {
    pub const ALL: [Repair; 5] = [
        Repair::Keep,
        Repair::ScaleExpOldMinusNew,
        Repair::ScaleExpNewMinusOld,
        Repair::ShiftNewMinusOld,
        Repair::ScaleOldOverNew,
    ];

    /// A kebab-case name and the repair's equation, for diagnostics and docs.
    pub fn name(self) -> &'static str {
        match self {
            Repair::Keep                => "keep",
            Repair::ScaleExpOldMinusNew => "scale-exp-old-minus-new",
            Repair::ScaleExpNewMinusOld => "scale-exp-new-minus-old",
            Repair::ShiftNewMinusOld    => "shift-new-minus-old",
            Repair::ScaleOldOverNew     => "scale-old-over-new",
        }
    }

    pub fn equation(self) -> &'static str {
        match self {
            Repair::Keep                => "h(c, s, s') = c",
            Repair::ScaleExpOldMinusNew => "h(c, s, s') = c · exp(s − s')",
            Repair::ScaleExpNewMinusOld => "h(c, s, s') = c · exp(s' − s)",
            Repair::ShiftNewMinusOld    => "h(c, s, s') = c + (s' − s)",
            Repair::ScaleOldOverNew     => "h(c, s, s') = c · (s / s')",
        }
    }

    /// The finite value the guard gives an empty state: one where the repair is defined.
    pub fn empty_shift(self) -> f64 {
        match self {
            Repair::ScaleOldOverNew => 1.0,
            _ => 0.0,
        }
    }

    /// Whether the repair reads the old state (all but `keep`).
    pub fn reads_state(self) -> bool {
        !matches!(self, Repair::Keep)
    }

    /// Whether the repair reads the old state through the guard. The exponential repairs
    /// read it raw, as FlashAttention does: `exp(-inf − σ(s')) = 0` discards what was
    /// accumulated while the state was empty (nothing, when the consumer is masked with the
    /// producer), and `exp(s − σ(s'))` never overflows since `s ≤ s'`. Guarding the old state
    /// too would keep the algebra exact but overflow: `exp(0 − s')` is `inf` for a first
    /// maximum below −88, and `0 · inf` is `NaN` (seen at input scale 30).
    pub fn guards_old(self) -> bool {
        matches!(self, Repair::ShiftNewMinusOld | Repair::ScaleOldOverNew)
    }
}

pub(super) fn push(body: &mut Body, kind: ExprKind) -> NodeId {
    body.push(Node {
        kind,
        name: None,
        annot: None,
        span: Default::default(),
        ty: None,
    })
}

/// A rank-0 `f32` literal, as the parser builds `0.0` or `-inf` in an expression.
pub fn literal(body: &mut Body, v: f64) -> NodeId {
    let id = push(body, ExprKind::Constant(v));
    body.node_mut(id).annot = Some(Type::Tensor(TensorType::new(DType::F32, vec![])));
    id
}

/// `select(equal(s, empty), shift, s)`: the state `s` with its empty value (the producer's
/// identity, `-inf` for `@max`) replaced by the finite `shift`.
pub fn emit_guard(body: &mut Body, s: NodeId, empty: f64, shift: f64) -> NodeId {
    let e = literal(body, empty);
    let is_empty = push(body, ExprKind::Binary(BinaryOp::Equal, s, e));
    let k = literal(body, shift);
    push(body, ExprKind::Select(is_empty, k, s))
}

/// `h(c, s, s')` on (guarded) states `s` and `s1`.
pub fn emit_repair(body: &mut Body, r: Repair, c: NodeId, s: NodeId, s1: NodeId) -> NodeId {
    match r {
        Repair::Keep => c,
        Repair::ScaleExpOldMinusNew | Repair::ScaleExpNewMinusOld => {
            let d = if matches!(r, Repair::ScaleExpOldMinusNew) {
                push(body, ExprKind::Binary(BinaryOp::Subtract, s, s1))
            } else {
                push(body, ExprKind::Binary(BinaryOp::Subtract, s1, s))
            };
            let e = push(body, ExprKind::Unary(UnaryOp::Exp, d));
            push(body, ExprKind::Binary(BinaryOp::Multiply, c, e))
        }
        Repair::ShiftNewMinusOld => {
            let d = push(body, ExprKind::Binary(BinaryOp::Subtract, s1, s));
            push(body, ExprKind::Binary(BinaryOp::Add, c, d))
        }
        Repair::ScaleOldOverNew => {
            let q = push(body, ExprKind::Binary(BinaryOp::Divide, s, s1));
            push(body, ExprKind::Binary(BinaryOp::Multiply, c, q))
        }
    }
}

/// Appends a consumer's contribution `g(y, s)` to a body, given the node of the (guarded)
/// producer state and the nodes of the items in order; `None` when it cannot be written.
pub type EmitContribution<'a> = &'a dyn Fn(&mut Body, NodeId, &[NodeId]) -> Option<NodeId>;

/// What a repair is checked for: one consumer's contribution, with the types of one step of
/// the fold (plain `f32` tensors, a tile of the fused axis) and sizes to run them at.
pub struct RepairProblem<'a> {
    pub env: &'a TypeEnv,
    pub sizes: Sizes,
    pub items: Vec<TensorType>,
    pub producer: TensorType,
    pub contribution: TensorType,
    /// The producer's empty state: its reducer's identity (`-inf` for `@max`).
    pub empty: f64,
    pub g: EmitContribution<'a>,
    /// The unit roundoff of the narrowest float `g` casts to (2^-8 for bf16, 2^-11 for f16;
    /// 0 without a cast): a contribution that rounds `exp(y − s)` to bf16 before a product
    /// (FlashAttention's `cast(P)·V`) rounds it at the running state in the fused fold and at
    /// the final one in the source, so the two sides of an identity differ by that rounding
    /// even for the right repair, as the source differs from exact arithmetic by it.
    pub cast_rounding: f64,
}

/// Largest relative L2 distance between the two sides of an identity on one sample, beyond
/// [`ROUNDINGS_ALLOWED`] of the contribution's cast rounding.
pub const TOLERANCE: f64 = 1e-3;

/// How many unit roundoffs of a cast in the contribution an identity may differ by: each side
/// rounds every term once, and a sum of terms of both signs can lose a few bits relative to
/// its norm. A wrong repair is off by O(1) on all but the `Close` and `Equal` regimes.
pub const ROUNDINGS_ALLOWED: f64 = 4.0;

/// Samples per regime; [`REGIMES`] has 14, so an accepted repair passed 26 × 14 = 364
/// samples of each identity.
pub const SAMPLES_PER_REGIME: u64 = 26;

/// How the states `s`, `s'` (and the items) of one sample are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// `s < s'` everywhere.
    Rising,
    /// `s > s'` everywhere (a guarded empty state can exceed the next one).
    Falling,
    /// Independent draws: both orders within one sample.
    Mixed,
    /// `s = s'`.
    Equal,
    /// `s'` within 1e-3 of `s`.
    Close,
    /// Gaps of tens between `s` and `s'` (repairs that overflow or lose the ratio).
    FarApart,
    /// Everything offset by +1000 (large magnitudes that cancel).
    LargePositive,
    /// Everything offset by −1000.
    LargeNegative,
    /// `s` empty (`-inf`), `s'` finite.
    OldEmpty,
    /// Both empty.
    BothEmpty,
    /// `s` finite, `s'` empty (never for a running maximum; the algebra must not care).
    NewEmpty,
    /// Each element of `s` and `s'` empty with probability ½.
    SomeEmpty,
    /// Items 200 below the states: what a tile far below the running maximum looks like at
    /// large input scale. `exp(y − s)` underflows to 0 there, and a contribution that divides
    /// by a sum of such terms (a softmax within the tile, which needs no repair in exact
    /// arithmetic) is `0/0`: the fused fold would be NaN where its source, normalised by its
    /// own maximum, is not.
    ItemsFarBelow,
    /// One item (in turn) masked (`-inf`) with probability ½, states finite or empty. A
    /// masked item can take the contribution itself out of its domain (a masked value
    /// tensor makes `g` NaN whatever the state): such a sample is skipped.
    MaskedItems,
}

pub const REGIMES: [Regime; 14] = [
    Regime::Mixed,
    Regime::Rising,
    Regime::Falling,
    Regime::Equal,
    Regime::Close,
    Regime::FarApart,
    Regime::LargePositive,
    Regime::LargeNegative,
    Regime::OldEmpty,
    Regime::BothEmpty,
    Regime::NewEmpty,
    Regime::SomeEmpty,
    Regime::ItemsFarBelow,
    Regime::MaskedItems,
];

/// Why a repair was refused.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// The identity (1 or 2) failed on a sample of this regime.
    Identity {
        identity: u8,
        regime: Regime,
        sample: u64,
        error: f64,
    },
    /// The identity programs could not be built, typed or run.
    NotEvaluable(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Identity {
                identity,
                regime,
                sample,
                error,
            } => write!(
                f,
                "identity {identity} fails on sample {sample} of {regime:?} (relative L2 {error:.3e})"
            ),
            Refusal::NotEvaluable(why) => write!(f, "cannot evaluate the identities: {why}"),
        }
    }
}

/// The two identity programs of a repair, typed, with their input types.
struct Identities {
    module: Module,
    one: Function,
    one_inputs: Vec<Role>,
    two: Function,
    two_inputs: Vec<Role>,
    shapes: Vec<Vec<usize>>,
}

/// What an input of an identity program stands for.
#[derive(Clone, Copy, Debug)]
enum Role {
    Item(usize),
    Old,
    New,
    Accumulated,
}

fn input(body: &mut Body, t: &TensorType) -> NodeId {
    let id = body.push(Node {
        kind: ExprKind::Input,
        name: None,
        annot: Some(Type::Tensor(t.clone())),
        span: Default::default(),
        ty: None,
    });
    body.params.push(id);
    id
}

fn function(body: Body, env: &TypeEnv, sizes: &Sizes) -> Result<Function, String> {
    let mut body = body;
    let types = crate::verify::typing::type_body(&body, &[], env).map_err(|e| format!("{e:?}"))?;
    for (n, t) in body.nodes.iter_mut().zip(types) {
        n.ty = Some(t);
    }
    let mut bindings: Vec<Binding> = sizes
        .0
        .iter()
        .map(|(k, v)| Binding {
            name: k.clone(),
            value: *v,
            def: None,
            span: Default::default(),
        })
        .collect();
    bindings.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Function {
        name: "identity".into(),
        name_span: Default::default(),
        bindings,
        body,
        comment: None,
        schedule: None,
    })
}

impl Identities {
    fn build(p: &RepairProblem, r: Repair) -> Result<Identities, String> {
        let shift = r.empty_shift();
        // Identity 1: h(g(y, σ(s)), σ(s), σ(s')) against g(y, σ(s')).
        let mut body = Body::default();
        let mut roles = Vec::new();
        let items: Vec<NodeId> = p
            .items
            .iter()
            .enumerate()
            .map(|(i, t)| {
                roles.push(Role::Item(i));
                input(&mut body, t)
            })
            .collect();
        let s = input(&mut body, &p.producer);
        let s1 = input(&mut body, &p.producer);
        roles.extend([Role::Old, Role::New]);
        let gs = emit_guard(&mut body, s, p.empty, shift);
        let gs1 = emit_guard(&mut body, s1, p.empty, shift);
        let mut old = (p.g)(&mut body, gs, &items).ok_or("the contribution cannot be written")?;
        let mut new = (p.g)(&mut body, gs1, &items).ok_or("the contribution cannot be written")?;
        let (raw_old, raw_new) = (old, new);
        let h_old = if r.guards_old() { gs } else { s };
        if r.reads_state() && !r.guards_old() {
            // Where the old state is empty the fold has accumulated nothing (its consumer is
            // masked with its producer) and the repair must keep that: h(0, -inf, σ(s')) = 0.
            let e = literal(&mut body, p.empty);
            let empty = push(&mut body, ExprKind::Binary(BinaryOp::Equal, s, e));
            let zero = literal(&mut body, 0.0);
            old = push(&mut body, ExprKind::Select(empty, zero, old));
            new = push(&mut body, ExprKind::Select(empty, zero, new));
        }
        let lhs = emit_repair(&mut body, r, old, h_old, gs1);
        // The contribution at each state, for the samples outside a fold (below).
        body.results = vec![lhs, new, raw_old, raw_new];
        let one = function(body, p.env, &p.sizes)?;
        // Identity 2: h(a + b, σ(s), σ(s')) against h(a, …) + h(b, …).
        let mut body = Body::default();
        let a = input(&mut body, &p.contribution);
        let b = input(&mut body, &p.contribution);
        let s = input(&mut body, &p.producer);
        let s1 = input(&mut body, &p.producer);
        let gs = emit_guard(&mut body, s, p.empty, shift);
        let gs1 = emit_guard(&mut body, s1, p.empty, shift);
        let h_old = if r.guards_old() { gs } else { s };
        let ab = push(&mut body, ExprKind::Binary(BinaryOp::Add, a, b));
        let lhs = emit_repair(&mut body, r, ab, h_old, gs1);
        let ha = emit_repair(&mut body, r, a, h_old, gs1);
        let hb = emit_repair(&mut body, r, b, h_old, gs1);
        let rhs = push(&mut body, ExprKind::Binary(BinaryOp::Add, ha, hb));
        body.results = vec![lhs, rhs];
        let two = function(body, p.env, &p.sizes)?;
        let mut shapes = Vec::new();
        for t in p.items.iter().chain([&p.producer, &p.contribution]) {
            shapes.push(p.sizes.eval_shape(&t.shape)?);
        }
        Ok(Identities {
            module: Module {
                reducers: p.env.reducers().to_vec(),
                ..Module::default()
            },
            one,
            one_inputs: roles,
            two,
            two_inputs: vec![Role::Accumulated, Role::Accumulated, Role::Old, Role::New],
            shapes,
        })
    }

    fn shape(&self, role: Role, items: usize) -> &[usize] {
        match role {
            Role::Item(i) => &self.shapes[i],
            Role::Old | Role::New => &self.shapes[items],
            Role::Accumulated => &self.shapes[items + 1],
        }
    }
}

/// One sample's values for the inputs of an identity program.
fn sample_inputs(
    roles: &[Role],
    shape: impl Fn(Role) -> Vec<usize>,
    regime: Regime,
    empty: f32,
    masked_item: usize,
    rng: &mut Rng,
) -> Vec<Value> {
    let offset = match regime {
        Regime::LargePositive => 1000.0,
        Regime::LargeNegative => -1000.0,
        _ => 0.0,
    };
    let normal = |rng: &mut Rng| rng.normal() as f32;
    // The states are drawn together, element by element, so that their order is the
    // regime's.
    let state_shape = roles
        .iter()
        .find(|r| matches!(r, Role::Old))
        .map(|r| shape(*r))
        .unwrap_or_default();
    let n: usize = state_shape.iter().product();
    let mut old = Vec::with_capacity(n);
    let mut new = Vec::with_capacity(n);
    for _ in 0..n {
        let s = normal(rng) + offset;
        let (a, b) = match regime {
            Regime::Rising => (s, s + normal(rng).abs() + 0.05),
            Regime::Falling => (s + normal(rng).abs() + 0.05, s),
            Regime::Mixed
            | Regime::LargePositive
            | Regime::LargeNegative
            | Regime::ItemsFarBelow => (s, normal(rng) + offset),
            Regime::Equal => (s, s),
            Regime::Close => (s, s + 1e-3 * normal(rng)),
            Regime::FarApart => (6.0 * s, 6.0 * normal(rng)),
            Regime::OldEmpty => (empty, s),
            Regime::BothEmpty => (empty, empty),
            Regime::NewEmpty => (s, empty),
            Regime::SomeEmpty | Regime::MaskedItems => {
                let t = normal(rng);
                let pick = |rng: &mut Rng, v: f32| if rng.below(2) == 0 { empty } else { v };
                (pick(rng, s), pick(rng, t))
            }
        };
        old.push(a);
        new.push(b);
    }
    roles
        .iter()
        .map(|role| {
            let shape = shape(*role);
            let data: Vec<f32> = match role {
                Role::Old => old.clone(),
                Role::New => new.clone(),
                Role::Item(i) => {
                    let count: usize = shape.iter().product();
                    let masked = regime == Regime::MaskedItems && *i == masked_item;
                    let offset = if regime == Regime::ItemsFarBelow {
                        -200.0
                    } else {
                        offset
                    };
                    (0..count)
                        .map(|_| {
                            if masked && rng.below(2) == 0 {
                                empty
                            } else {
                                normal(rng) + offset
                            }
                        })
                        .collect()
                }
                Role::Accumulated => {
                    let count: usize = shape.iter().product();
                    (0..count).map(|_| normal(rng)).collect()
                }
            };
            Value::Tensor(TiledTensor {
                dtype: DType::F32,
                axes: vec![],
                tiles: vec![Arc::new(Tensor { shape, data })],
            })
        })
        .collect()
}

/// How far apart the two sides of an identity are: the relative L2 distance of their finite
/// elements, infinite where they cannot be compared (a `NaN` on either side, unequal
/// infinities, different shapes).
pub fn sides_distance(lhs: &Tensor, rhs: &Tensor) -> f64 {
    l2_distance(lhs, rhs, |a, b| !a.is_nan() && a == b)
}

/// Checks repair `r` for problem `p` on every regime's samples; the first failure refuses it.
/// An accepted repair gives the number of samples each identity was compared on (masked-item
/// samples whose contribution is itself undefined are not counted).
pub fn verify_repair(p: &RepairProblem, r: Repair) -> Result<[usize; 2], Refusal> {
    let mut compared = [0usize; 2];
    let ids = Identities::build(p, r).map_err(Refusal::NotEvaluable)?;
    let interp = Interpreter::new(&ids.module, p.sizes.clone());
    let n_items = p.items.len();
    let empty = p.empty as f32;
    for sample in 0..SAMPLES_PER_REGIME {
        for regime in REGIMES {
            let mut rng = Rng::new(0x5eed_0000 + sample * 131 + regime as u64);
            for (identity, f, roles) in [
                (1u8, &ids.one, &ids.one_inputs),
                (2u8, &ids.two, &ids.two_inputs),
            ] {
                let masked_item = sample as usize % n_items.max(1);
                let inputs = sample_inputs(
                    roles,
                    |role| ids.shape(role, n_items).to_vec(),
                    regime,
                    empty,
                    masked_item,
                    &mut rng,
                );
                let out = interp
                    .run(f, &inputs)
                    .map_err(|e| Refusal::NotEvaluable(e.to_string()))?;
                let (Some(lhs), Some(rhs)) = (
                    out.first().and_then(Value::dense),
                    out.get(1).and_then(Value::dense),
                ) else {
                    return Err(Refusal::NotEvaluable(
                        "the identity has no tensor results".into(),
                    ));
                };
                if regime == Regime::MaskedItems && rhs.data.iter().any(|v| v.is_nan()) {
                    continue;
                }
                // The samples draw items above the states (`FarApart`: gaps of tens), which a
                // fold never evaluates: the state bounds its items (`exponents_bounded`), so
                // `exp(y − s)` ≤ 1. Cast to f16, such an `exp(18)` is `inf` on both sides; a
                // sample where the contribution itself overflows its cast says nothing.
                let overflows = |k: usize| {
                    out.get(k)
                        .and_then(Value::dense)
                        .is_some_and(|t| t.data.iter().any(|v| v.is_infinite()))
                };
                if identity == 1 && p.cast_rounding > 0.0 && (overflows(2) || overflows(3)) {
                    continue;
                }
                let error = sides_distance(lhs, rhs);
                compared[usize::from(identity - 1)] += 1;
                if std::env::var_os("EFOPT_DEBUG_REPAIR").is_some() {
                    eprintln!("repair {r:?} identity {identity} {regime:?}: {error}");
                }
                if error > TOLERANCE + ROUNDINGS_ALLOWED * p.cast_rounding {
                    return Err(Refusal::Identity {
                        identity,
                        regime,
                        sample,
                        error,
                    });
                }
            }
        }
    }
    Ok(compared)
}

/// The first repair of [`Repair::ALL`] that passes [`verify_repair`].
pub fn synthesise(p: &RepairProblem) -> Option<Repair> {
    Repair::ALL
        .into_iter()
        .find(|r| verify_repair(p, *r).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::{random_inputs, relative_l2};
    use crate::ir::Dim;

    /// `g(y, s) = tile_matmul(exp(y0 − s), y1)`: the value sum of decode attention.
    fn value_sum(body: &mut Body, s: NodeId, items: &[NodeId]) -> Option<NodeId> {
        let d = push(body, ExprKind::Binary(BinaryOp::Subtract, items[0], s));
        let e = push(body, ExprKind::Unary(UnaryOp::Exp, d));
        Some(push(
            body,
            ExprKind::TileMatMul {
                a: e,
                b: items[1],
                acc: Some(DType::F32),
            },
        ))
    }

    /// `g(y, s) = reduce(exp(y0 − s)) axis=1`: the normaliser.
    fn normaliser(body: &mut Body, s: NodeId, items: &[NodeId]) -> Option<NodeId> {
        let d = push(body, ExprKind::Binary(BinaryOp::Subtract, items[0], s));
        let e = push(body, ExprKind::Unary(UnaryOp::Exp, d));
        Some(push(
            body,
            ExprKind::Reduce {
                input: e,
                over: crate::ir::ReduceOver::Axis(crate::ir::DimRef::Index(1)),
                reducer: crate::ir::ReducerRef::Builtin(crate::ir::BuiltinReducer::Add),
                keep_dims: true,
            },
        ))
    }

    fn f32_type(shape: Vec<Dim>) -> TensorType {
        TensorType::new(DType::F32, shape)
    }

    /// Single-query decode attention at the sizes repair fusion uses (every symbol 4, every
    /// axis 2): the query is one row, so the running maximum is 1×1.
    fn one_row_problem<'a>(
        env: &'a TypeEnv,
        g: EmitContribution<'a>,
        value: bool,
    ) -> RepairProblem<'a> {
        let tile = Dim::sym("K").split_by("k");
        let mut items = vec![f32_type(vec![Dim::lit(1), tile.clone()])];
        if value {
            items.push(f32_type(vec![tile, Dim::sym("D")]));
        }
        let contribution = if value {
            f32_type(vec![Dim::lit(1), Dim::sym("D")])
        } else {
            f32_type(vec![Dim::lit(1), Dim::lit(1)])
        };
        RepairProblem {
            env,
            sizes: Sizes(
                [("K", 4), ("D", 4), ("k", 2)]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            ),
            items,
            producer: f32_type(vec![Dim::lit(1), Dim::lit(1)]),
            contribution,
            empty: f64::NEG_INFINITY,
            g,
            cast_rounding: 0.0,
        }
    }

    /// The check repair fusion used before issue 42: both identities on the program's
    /// shapes, unguarded, with `s' = max(s, t)`, on the random inputs of two seeds.
    fn thin_check(p: &RepairProblem, r: Repair) -> bool {
        [11u64, 12].into_iter().all(|seed| {
            let mut body = Body::default();
            let items: Vec<NodeId> = p.items.iter().map(|t| input(&mut body, t)).collect();
            let s = input(&mut body, &p.producer);
            let t = input(&mut body, &p.producer);
            let s1 = push(&mut body, ExprKind::Binary(BinaryOp::Maximum, s, t));
            let Some(gs) = (p.g)(&mut body, s, &items) else {
                return false;
            };
            let Some(gs1) = (p.g)(&mut body, s1, &items) else {
                return false;
            };
            let lhs = emit_repair(&mut body, r, gs, s, s1);
            body.results = vec![lhs, gs1];
            let Ok(f) = function(body, p.env, &p.sizes) else {
                return false;
            };
            let module = Module::default();
            let Ok(inputs) = random_inputs(&f, &p.sizes, seed, 1.0) else {
                return false;
            };
            let Ok(out) = Interpreter::new(&module, p.sizes.clone()).run(&f, &inputs) else {
                return false;
            };
            match (out[0].dense(), out[1].dense()) {
                (Some(a), Some(b)) => relative_l2(a, b) <= 1e-4,
                _ => false,
            }
        })
    }

    #[test]
    fn the_old_check_accepts_the_identity_repair_on_a_one_by_one_state_and_the_new_refuses_it() {
        let env = TypeEnv::new(&[]);
        let p = one_row_problem(&env, &value_sum, true);
        assert!(
            thin_check(&p, Repair::Keep),
            "with a 1×1 state both random draws had s ≥ t: the old check accepted h(c) = c"
        );
        let refusal = verify_repair(&p, Repair::Keep).expect_err("the identity repair is wrong");
        assert!(
            matches!(refusal, Refusal::Identity { identity: 1, .. }),
            "{refusal}"
        );
        assert_eq!(synthesise(&p), Some(Repair::ScaleExpOldMinusNew));
    }

    #[test]
    fn every_wrong_repair_is_refused_and_the_right_one_accepted() {
        let env = TypeEnv::new(&[]);
        for (g, value) in [
            (&value_sum as EmitContribution, true),
            (&normaliser as EmitContribution, false),
        ] {
            let p = one_row_problem(&env, g, value);
            for r in Repair::ALL {
                let verdict = verify_repair(&p, r);
                assert_eq!(
                    verdict.is_ok(),
                    r == Repair::ScaleExpOldMinusNew,
                    "{r:?}: {verdict:?}"
                );
            }
        }
    }

    /// `g(y, s) = tile_matmul(cast(exp(y0 − s)) to=t, y1)`: FlashAttention's value sum with
    /// the probabilities cast to the values' dtype.
    fn cast_value_sum(to: DType) -> impl Fn(&mut Body, NodeId, &[NodeId]) -> Option<NodeId> {
        move |body, s, items| {
            let d = push(body, ExprKind::Binary(BinaryOp::Subtract, items[0], s));
            let e = push(body, ExprKind::Unary(UnaryOp::Exp, d));
            let c = push(body, ExprKind::Cast(to, e));
            Some(push(
                body,
                ExprKind::TileMatMul {
                    a: c,
                    b: items[1],
                    acc: Some(DType::F32),
                },
            ))
        }
    }

    /// With the probabilities rounded to bf16 or f16 inside the contribution, the right
    /// repair passes within the cast's rounding and every wrong one is still refused; without
    /// the allowance the bf16 rounding alone refuses the right one.
    #[test]
    fn a_cast_contribution_is_repaired_within_its_rounding() {
        let env = TypeEnv::new(&[]);
        for (to, u) in [(DType::BF16, 2f64.powi(-8)), (DType::F16, 2f64.powi(-11))] {
            let g = cast_value_sum(to);
            let mut p = one_row_problem(&env, &g, true);
            p.cast_rounding = u;
            for r in Repair::ALL {
                let verdict = verify_repair(&p, r);
                assert_eq!(
                    verdict.is_ok(),
                    r == Repair::ScaleExpOldMinusNew,
                    "{to:?} {r:?}: {verdict:?}"
                );
            }
            if to == DType::BF16 {
                p.cast_rounding = 0.0;
                assert!(verify_repair(&p, Repair::ScaleExpOldMinusNew).is_err());
            }
        }
    }

    /// The guarded fold is NaN-free where the unguarded one is not: with both states empty
    /// (a first tile fully masked) `exp(y0 − σ(s'))` and `exp(s − σ(s'))` are finite.
    #[test]
    fn the_guard_keeps_empty_states_finite() {
        let env = TypeEnv::new(&[]);
        let p = one_row_problem(&env, &value_sum, true);
        let ids = Identities::build(&p, Repair::ScaleExpOldMinusNew).expect("builds");
        let interp = Interpreter::new(&ids.module, p.sizes.clone());
        let mut rng = Rng::new(7);
        let inputs = sample_inputs(
            &ids.one_inputs,
            |role| ids.shape(role, 2).to_vec(),
            Regime::BothEmpty,
            f32::NEG_INFINITY,
            0,
            &mut rng,
        );
        let out = interp.run(&ids.one, &inputs).expect("runs");
        for v in &out {
            let t = v.dense().expect("dense");
            assert!(t.data.iter().all(|x| x.is_finite()), "{t:?}");
        }
    }

    #[test]
    fn sides_disagree_on_nan_and_unequal_infinities() {
        let t = |data: Vec<f32>| Tensor {
            shape: vec![data.len()],
            data,
        };
        let inf = f64::INFINITY;
        assert_eq!(sides_distance(&t(vec![1.0, 2.0]), &t(vec![1.0, 2.0])), 0.0);
        assert_eq!(sides_distance(&t(vec![f32::NAN]), &t(vec![f32::NAN])), inf);
        assert_eq!(sides_distance(&t(vec![f32::INFINITY]), &t(vec![1.0])), inf);
        let both = sides_distance(&t(vec![f32::INFINITY]), &t(vec![f32::INFINITY]));
        assert_eq!(both, 0.0);
    }

    /// An accepted repair was compared on hundreds of samples of each identity, whatever
    /// the program's shapes (here a 1×1 state).
    #[test]
    fn an_accepted_repair_passed_hundreds_of_samples() {
        let env = TypeEnv::new(&[]);
        for (g, value) in [
            (&value_sum as EmitContribution, true),
            (&normaliser as EmitContribution, false),
        ] {
            let p = one_row_problem(&env, g, value);
            let [one, two] =
                verify_repair(&p, Repair::ScaleExpOldMinusNew).expect("the rescale is right");
            assert!(one >= 300 && two >= 300, "{one} and {two} samples");
        }
    }
}
