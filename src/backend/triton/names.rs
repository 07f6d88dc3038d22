//! Python names and literals: identifiers from IR names, dtypes, float literals, and the
//! host-side expressions for block lengths.

use super::Ctx;
use crate::ir::print::Namer;
use crate::ir::{BuiltinReducer, DType, DimBase};

pub(super) const PY_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "tl", "triton", "torch", "np", "range", "min", "max", "float", "int", "len",
    "empty", "schedule",
];

/// The `@triton.jit` combine function of a product reduction over a block: Triton has `tl.sum`,
/// `tl.max` and `tl.min` but no product, so `tl.reduce` takes this one. A module defines it
/// once, before its kernels, when some kernel uses it.
pub(super) const PRODUCT_COMBINE: &str = "efopt_product";

pub(super) fn namer() -> Namer {
    let mut n = Namer::default();
    for k in PY_KEYWORDS {
        n.reserve(k);
    }
    n.reserve(PRODUCT_COMBINE);
    n
}

/// A Python identifier from IR text.
pub(super) fn ident(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, 'v');
    }
    out
}

pub(super) fn dtype_tl(d: DType) -> &'static str {
    match d {
        DType::BF16 => "tl.bfloat16",
        DType::F16 => "tl.float16",
        DType::F32 => "tl.float32",
        DType::I32 => "tl.int32",
        DType::I1 => "tl.int1",
    }
}

/// The dtype's name in torch and in the numpy wrapper.
pub fn dtype_host(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::F32 => "float32",
        DType::I32 => "int32",
        DType::I1 => "bool",
    }
}

/// The dtype a kernel computes values of dtype `d` in: floats in f32 (a cast to bf16 or f16
/// rounds), `i32` and `i1` as themselves, so that index arithmetic and comparisons on `iota`
/// stay exact past 2^24, where f32 runs out of integers.
pub(super) fn compute_tl(d: DType) -> &'static str {
    match d {
        DType::I32 => "tl.int32",
        DType::I1 => "tl.int1",
        DType::F32 | DType::BF16 | DType::F16 => "tl.float32",
    }
}

/// A literal of dtype `d` (see [`compute_tl`]): an integer for `i32` (`4`, not `4.0`, which
/// would make the arithmetic float; ±inf, a reducer's identity, become the extremes), a
/// boolean for `i1`, a float otherwise.
pub(super) fn lit(v: f64, d: DType) -> String {
    match d {
        // `as` saturates (NaN to 0), as the interpreter's rounding to i32 clamps.
        DType::I32 => ((v.trunc() as i64).clamp(i32::MIN as i64, i32::MAX as i64)).to_string(),
        DType::I1 => if v != 0.0 && !v.is_nan() {
            "True"
        } else {
            "False"
        }
        .to_string(),
        DType::F32 | DType::BF16 | DType::F16 => float_lit(v),
    }
}

pub(super) fn float_lit(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 {
            "float('inf')".into()
        } else {
            "float('-inf')".into()
        }
    } else if v.is_nan() {
        "float('nan')".into()
    } else {
        format!("{v:?}")
    }
}

pub(super) fn builtin_identity(r: BuiltinReducer) -> f64 {
    match r {
        BuiltinReducer::Add => 0.0,
        BuiltinReducer::Mul => 1.0,
        BuiltinReducer::Max => f64::NEG_INFINITY,
        BuiltinReducer::Min => f64::INFINITY,
    }
}

pub(super) fn base_text(b: &DimBase) -> String {
    match b {
        DimBase::Sym(s) => s.to_string(),
        DimBase::Lit(n) => n.to_string(),
        DimBase::Extent(a) => format!("EXT_{a}"),
    }
}

pub(super) fn p2_name(b: &DimBase) -> String {
    match b {
        DimBase::Sym(s) => format!("P_{s}"),
        DimBase::Lit(n) => (n.max(&16).next_power_of_two()).to_string(),
        DimBase::Extent(a) => format!("P_EXT_{a}"),
    }
}

/// The host expression for `P_<name>`, the block length of a whole dimension `name`.
pub(super) fn padded_len(ctx: &Ctx, name: &str) -> String {
    if ctx.dot_padded.borrow().contains(name) {
        format!("max(16, triton.next_power_of_2({name}))")
    } else {
        format!("triton.next_power_of_2({name})")
    }
}
