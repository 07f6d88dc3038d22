//! Algebraic equalities (real arithmetic): commutativity, matmul reassociation and factor
//! motion, which moves a factor invariant along the contraction dimension across a matmul —
//! the identity normalisations need (a per-row scale commutes with a projection).

use super::*;
use crate::ir::BinaryOp;

#[rustfmt::skip]
pub static RULES: &[Rule] = &[
    // name                    family               equation
    Rule { name: "commute-add",        family: Family::Algebraic, equation: "a + b = b + a", root: Root::Binary, find: commute_add, reach: Reach::Own },
    Rule { name: "commute-multiply",   family: Family::Algebraic, equation: "a * b = b * a", root: Root::Binary, find: commute_multiply, reach: Reach::Own },
    Rule { name: "commute-maximum",    family: Family::Algebraic, equation: "maximum(a, b) = maximum(b, a)", root: Root::Binary, find: commute_maximum, reach: Reach::Own },
    Rule { name: "commute-minimum",    family: Family::Algebraic, equation: "minimum(a, b) = minimum(b, a)", root: Root::Binary, find: commute_minimum, reach: Reach::Own },
    Rule { name: "matmul-reassoc-right", family: Family::Algebraic, equation: "matmul(matmul(A,B),C) = matmul(A, matmul(B,C))", root: Root::MatMul, find: reassoc_right, reach: Reach::Node },
    Rule { name: "matmul-reassoc-left", family: Family::Algebraic, equation: "matmul(A, matmul(B,C)) = matmul(matmul(A,B),C)", root: Root::MatMul, find: reassoc_left, reach: Reach::Node },
    Rule { name: "factor-out-lhs",     family: Family::Algebraic, equation: "matmul(X ∘ a, W) = matmul(X, W) ∘ a  (∘ ∈ {*, /}; a invariant along K)", root: Root::MatMul, find: factor_out_lhs, reach: Reach::Node },
    Rule { name: "factor-out-rhs",     family: Family::Algebraic, equation: "matmul(X, W ∘ a) = matmul(X, W) ∘ a  (∘ ∈ {*, /}; a invariant along K)", root: Root::MatMul, find: factor_out_rhs, reach: Reach::Node },
    Rule { name: "factor-out-cast-lhs", family: Family::Algebraic, equation: "matmul(cast(P ∘ a), W) = matmul(cast(P), W) ∘ a  (∘ ∈ {*, /}; a invariant along K; P an exp: probabilities cast to the product's dtype)", root: Root::MatMul, find: factor_out_cast_lhs, reach: Reach::Node },
    Rule { name: "factor-out-narrow-lhs", family: Family::Algebraic, equation: "matmul(P ∘ a, W) = matmul(P, W) ∘ a  (∘ ∈ {*, /}; a invariant along K; P an exp in bf16/f16, a of the product's dtype: probabilities computed narrow)", root: Root::MatMul, find: factor_out_narrow_lhs, reach: Reach::Node },
    Rule { name: "factor-into-lhs",    family: Family::Algebraic, equation: "matmul(X, W) ∘ a = matmul(X ∘ a, W)  (∘ ∈ {*, /}; a invariant along N)", root: Root::Binary, find: factor_into_lhs, reach: Reach::Node },
    Rule { name: "distribute-matmul-lhs", family: Family::Algebraic, equation: "matmul(A,B) + matmul(A,C) = matmul(A, B + C)", root: Root::Binary, find: distribute_matmul_lhs, reach: Reach::Node },
    Rule { name: "distribute-matmul-rhs", family: Family::Algebraic, equation: "matmul(A,C) + matmul(B,C) = matmul(A + B, C)", root: Root::Binary, find: distribute_matmul_rhs, reach: Reach::Node },
    Rule { name: "factor-common-multiply", family: Family::Algebraic, equation: "a * b + a * c = a * (b + c)", root: Root::Binary, find: factor_common_multiply, reach: Reach::Node },
    Rule { name: "row-factor-outward", family: Family::Algebraic, equation: "(x ∘ a) * b = (x * b) ∘ a  (∘ ∈ {*, /}; a invariant along the last dim, b not: guarded reassociation)", root: Root::Binary, find: row_factor_outward, reach: Reach::Node },
];

fn commute(op: BinaryOp, n: &ENode, out: &mut Out) {
    if n.op == Op::Binary(op) && n.children[0] != n.children[1] {
        out.push(node(
            n.op.clone(),
            vec![cls(n.children[1]), cls(n.children[0])],
        ));
    }
}

fn commute_add(_eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    commute(BinaryOp::Add, n, out)
}

fn commute_multiply(_eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    commute(BinaryOp::Multiply, n, out)
}

fn commute_maximum(_eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    commute(BinaryOp::Maximum, n, out)
}

fn commute_minimum(_eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    commute(BinaryOp::Minimum, n, out)
}

fn reassoc_right(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::MatMul(acc) = n.op else { return };
    for inner in nodes(eg, n.children[0]) {
        if let Op::MatMul(acc2) = inner.op {
            if acc2 == acc {
                let bc = node(
                    Op::MatMul(acc),
                    vec![cls(inner.children[1]), cls(n.children[1])],
                );
                out.push(node(Op::MatMul(acc), vec![cls(inner.children[0]), bc]));
            }
        }
    }
}

fn reassoc_left(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::MatMul(acc) = n.op else { return };
    for inner in nodes(eg, n.children[1]) {
        if let Op::MatMul(acc2) = inner.op {
            if acc2 == acc {
                let ab = node(
                    Op::MatMul(acc),
                    vec![cls(n.children[0]), cls(inner.children[0])],
                );
                out.push(node(Op::MatMul(acc), vec![ab, cls(inner.children[1])]));
            }
        }
    }
}

/// True when `a` (a factor of an operand of rank `rank`) has size 1 (or no dimension) at
/// operand dimension `dim`.
fn invariant_at(a: &TensorType, rank: usize, dim: usize) -> bool {
    let off = rank as isize - a.rank() as isize;
    let l = dim as isize - off;
    a.rank() <= rank && (l < 0 || a.shape[l as usize].is_one())
}

fn scaled_operands(eg: &EGraph, x: Id) -> Vec<(BinaryOp, Id, Id)> {
    nodes(eg, x)
        .iter()
        .filter_map(|m| match m.op {
            Op::Binary(b @ (BinaryOp::Multiply | BinaryOp::Divide)) => {
                Some((b, m.children[0], m.children[1]))
            }
            _ => None,
        })
        .collect()
}

/// Whether scaling a matrix-product operand (`X ∘ a`, typed `scaled`) rounds as scaling the
/// product does: the scaled operand is f32, or `a` is a constant power of two (exact in any
/// float format). A bf16 `X ∘ a` rounds the scaled operand to 8 bits; merged with the
/// product scaled after its f32 accumulation, a softmax could take its maximum from one
/// rounding and its normaliser from the other, off by exp(|score| · 2^-8) (a GPT block's
/// attention at inputs of scale 30: relative error 0.19, `tests/lit/corpus/gpt_block_decode.ef`).
fn scales_exactly(eg: &EGraph, scaled: crate::ir::DType, a: Id) -> bool {
    scaled == crate::ir::DType::F32
        || nodes(eg, a).iter().any(|m| match &m.op {
            Op::Constant(bits, _) => {
                let v = f64::from_bits(*bits).abs();
                v > 0.0 && v.is_finite() && v.log2().fract() == 0.0
            }
            _ => false,
        })
}

/// Probabilities computed in bf16/f16 (`P` an `exp`, `a` of the product's dtype): as for
/// [`factor_out_cast_lhs`], both sides round each probability once before the product and
/// the normaliser once after it, and no maximum is taken from a rounding of a score.
fn narrow_probabilities(eg: &EGraph, x: Id, ta: &TensorType, class: Id) -> bool {
    let Some(tout) = tensor_type(eg, class) else {
        return false;
    };
    ta.dtype == tout.dtype
        && ta.par.is_empty()
        && nodes(eg, x)
            .iter()
            .any(|m| matches!(m.op, Op::Unary(crate::ir::UnaryOp::Exp)))
}

fn factor_out_lhs(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    factor_out_lhs_where(eg, class, n, true, out)
}

fn factor_out_narrow_lhs(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    factor_out_lhs_where(eg, class, n, false, out)
}

/// `matmul(X ∘ a, W) = matmul(X, W) ∘ a`, where the scaling rounds as the product's does
/// (`exact`), or else for narrow probabilities only.
fn factor_out_lhs_where(eg: &EGraph, class: Id, n: &ENode, exact: bool, out: &mut Out) {
    let Op::MatMul(acc) = n.op else { return };
    let Some(tx) = tensor_type(eg, n.children[0]) else {
        return;
    };
    let rank = tx.rank();
    let scaled = tx.dtype;
    for (b, x, a) in scaled_operands(eg, n.children[0]) {
        let candidates: Vec<(Id, Id)> = if b == BinaryOp::Multiply {
            vec![(x, a), (a, x)]
        } else {
            vec![(x, a)]
        };
        for (x, a) in candidates {
            let (Some(ta), Some(tx2)) = (tensor_type(eg, a), tensor_type(eg, x)) else {
                continue;
            };
            // A rank-0 or rank-1 product has no row dimension to factor along.
            let Some(row) = rank.checked_sub(1) else {
                return;
            };
            if tx2.rank() != rank
                || !invariant_at(ta, rank, row)
                || scales_exactly(eg, scaled, a) != exact
                || (!exact && !narrow_probabilities(eg, x, ta, class))
            {
                continue;
            }
            let prod = node(Op::MatMul(acc), vec![cls(x), cls(n.children[1])]);
            out.push(node(Op::Binary(b), vec![prod, cls(a)]));
        }
    }
}

fn factor_out_rhs(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::MatMul(acc) = n.op else { return };
    let Some(tw) = tensor_type(eg, n.children[1]) else {
        return;
    };
    let rank = tw.rank();
    let scaled = tw.dtype;
    for (b, w, a) in scaled_operands(eg, n.children[1]) {
        let candidates: Vec<(Id, Id)> = if b == BinaryOp::Multiply {
            vec![(w, a), (a, w)]
        } else {
            vec![(w, a)]
        };
        for (w, a) in candidates {
            let (Some(ta), Some(tw2)) = (tensor_type(eg, a), tensor_type(eg, w)) else {
                continue;
            };
            let Some(col) = rank.checked_sub(2) else {
                return;
            };
            if tw2.rank() != rank || !invariant_at(ta, rank, col) || !scales_exactly(eg, scaled, a)
            {
                continue;
            }
            let prod = node(Op::MatMul(acc), vec![cls(n.children[0]), cls(w)]);
            out.push(node(Op::Binary(b), vec![prod, cls(a)]));
        }
    }
}

/// FlashAttention's `P·V` with the probabilities cast to V's dtype first
/// (`matmul(cast(w / l) to=bf16, v)`): the normaliser moves out of the cast and the product,
/// so the product is a sum of `cast(exp(…))·V` terms that an online softmax can rescale.
/// Both sides round each probability once to the cast's dtype (`cast(w / l)` against
/// `cast(w)`, divided after the f32 accumulation), so each is within one rounding of the
/// exact product; what `scales_exactly` guards against — a maximum and a normaliser taken
/// from two roundings of one score, amplified by `exp` — cannot arise from values an `exp`
/// already produced and a product sums. Only for `P` an `exp` and `a` of the product's dtype.
fn factor_out_cast_lhs(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::MatMul(acc) = n.op else { return };
    let (Some(tout), Some(tc)) = (tensor_type(eg, class), tensor_type(eg, n.children[0])) else {
        return;
    };
    if !tout.par.is_empty() || !tc.par.is_empty() {
        return;
    }
    let rank = tc.rank();
    let Some(row) = rank.checked_sub(1) else {
        return;
    };
    for c in nodes(eg, n.children[0]) {
        let Op::Cast(to) = c.op else { continue };
        let Some(tin) = tensor_type(eg, c.children[0]) else {
            continue;
        };
        if tin.dtype != crate::ir::DType::F32 {
            continue;
        }
        for (b, x, a) in scaled_operands(eg, c.children[0]) {
            let (Some(ta), Some(tx)) = (tensor_type(eg, a), tensor_type(eg, x)) else {
                continue;
            };
            let probabilities = nodes(eg, x)
                .iter()
                .any(|m| matches!(m.op, Op::Unary(crate::ir::UnaryOp::Exp)));
            if !probabilities
                || tx.rank() != rank
                || tx.dtype != crate::ir::DType::F32
                || ta.dtype != tout.dtype
                || !ta.par.is_empty()
                || !invariant_at(ta, rank, row)
            {
                continue;
            }
            let cast = node(Op::Cast(to), vec![cls(x)]);
            let prod = node(Op::MatMul(acc), vec![cast, cls(n.children[1])]);
            out.push(node(Op::Binary(b), vec![prod, cls(a)]));
        }
    }
}

fn factor_into_lhs(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::Binary(b @ (BinaryOp::Multiply | BinaryOp::Divide)) = n.op else {
        return;
    };
    let Some(tout) = tensor_type(eg, class) else {
        return;
    };
    let (m, a) = (n.children[0], n.children[1]);
    let Some(ta) = tensor_type(eg, a) else { return };
    let rank = tout.rank();
    // A rank-0 product (of two rank-1 operands, or of scalars) has no row to scale.
    let Some(row) = rank.checked_sub(1) else {
        return;
    };
    if !invariant_at(ta, rank, row) || !ta.par.is_empty() {
        return;
    }
    for mm in nodes(eg, m) {
        let Op::MatMul(acc) = mm.op else { continue };
        let Some(tx) = tensor_type(eg, mm.children[0]) else {
            continue;
        };
        // The scaled operand is typed as `X` is (a scalar factor takes the tensor's dtype).
        if tx.rank() != rank || !scales_exactly(eg, tx.dtype, a) {
            continue;
        }
        let scaled = node(Op::Binary(b), vec![cls(mm.children[0]), cls(a)]);
        out.push(node(Op::MatMul(acc), vec![scaled, cls(mm.children[1])]));
    }
}

fn row_factor_outward(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    if n.op != Op::Binary(BinaryOp::Multiply) {
        return;
    }
    let Some(tout) = tensor_type(eg, class) else {
        return;
    };
    let rank = tout.rank();
    if rank == 0 {
        return;
    }
    let (l, b) = (n.children[0], n.children[1]);
    let Some(tb) = tensor_type(eg, b) else { return };
    // Only moves a row factor past a factor that varies along the row: no reassociation loop.
    if invariant_at(tb, rank, rank - 1) {
        return;
    }
    for (op, x, a) in scaled_operands(eg, l) {
        let Some(ta) = tensor_type(eg, a) else {
            continue;
        };
        if invariant_at(ta, rank, rank - 1) && !ta.shape.is_empty() {
            let xb = node(Op::Binary(BinaryOp::Multiply), vec![cls(x), cls(b)]);
            out.push(node(Op::Binary(op), vec![xb, cls(a)]));
        }
    }
}

/// `(x, y)` operand pairs of the matmuls in a class, with their accumulation dtype.
fn matmuls(eg: &EGraph, c: Id) -> Vec<(Option<crate::ir::DType>, Id, Id)> {
    nodes(eg, c)
        .iter()
        .filter_map(|n| match n.op {
            Op::MatMul(acc) => Some((acc, n.children[0], n.children[1])),
            _ => None,
        })
        .collect()
}

fn distribute_matmul_lhs(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    if n.op != Op::Binary(BinaryOp::Add) {
        return;
    }
    for (acc1, a1, b) in matmuls(eg, n.children[0]) {
        for (acc2, a2, c) in matmuls(eg, n.children[1]) {
            if acc1 == acc2 && eg.find(a1) == eg.find(a2) && same_type(eg, b, c) {
                let sum = node(Op::Binary(BinaryOp::Add), vec![cls(b), cls(c)]);
                out.push(node(Op::MatMul(acc1), vec![cls(a1), sum]));
            }
        }
    }
}

fn distribute_matmul_rhs(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    if n.op != Op::Binary(BinaryOp::Add) {
        return;
    }
    for (acc1, a, c1) in matmuls(eg, n.children[0]) {
        for (acc2, b, c2) in matmuls(eg, n.children[1]) {
            if acc1 == acc2 && eg.find(c1) == eg.find(c2) && same_type(eg, a, b) {
                let sum = node(Op::Binary(BinaryOp::Add), vec![cls(a), cls(b)]);
                out.push(node(Op::MatMul(acc1), vec![sum, cls(c1)]));
            }
        }
    }
}

/// Operands of the same type: their sum keeps it (no broadcasting, no promotion).
fn same_type(eg: &EGraph, a: Id, b: Id) -> bool {
    matches!((tensor_type(eg, a), tensor_type(eg, b)), (Some(x), Some(y)) if x == y)
}

fn factor_common_multiply(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    if n.op != Op::Binary(BinaryOp::Add) {
        return;
    }
    let products = |c: Id| -> Vec<(Id, Id)> {
        nodes(eg, c)
            .iter()
            .filter(|m| m.op == Op::Binary(BinaryOp::Multiply))
            .map(|m| (eg.find(m.children[0]), eg.find(m.children[1])))
            .collect()
    };
    for (a1, b) in products(n.children[0]) {
        for (a2, c) in products(n.children[1]) {
            if a1 == a2 && same_type(eg, b, c) {
                let sum = node(Op::Binary(BinaryOp::Add), vec![cls(b), cls(c)]);
                out.push(node(Op::Binary(BinaryOp::Multiply), vec![cls(a1), sum]));
            }
        }
    }
}
