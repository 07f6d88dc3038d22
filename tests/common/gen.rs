//! The random program generator of the fuzz tests, shared with the candidate property test.
//!
//! Programs are built statement by statement with the verifier as the oracle for what
//! type-checks: a statement that does not verify is dropped. [`Mode::Full`] is the fuzz
//! test's generator (shapes, dtypes, pointwise ops, reductions, matmuls,
//! partition/replicate/combination/collection chains, user reducers); [`Mode::TensorLevel`]
//! builds programs without parallel state or user reducers, for `saturate,extract,check`.

use super::Rng;
use efopt::ir::{Dim, Module, ParKind, TensorType, Type};
use efopt::parse::parse_module;
use efopt::verify::verify_module;
use std::panic::{catch_unwind, AssertUnwindSafe};

const DIM_NAMES: &[&str] = &["M", "N", "K", "B", "D", "Q"];
const DIM_SIZES: &[u64] = &[2, 4, 6, 8];
const AXES: &[&str] = &["p", "q", "m", "n", "k"];
const UNARY: &[&str] = &[
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "neg",
    "abs",
    "tanh",
    "sigmoid",
    "silu",
    "gelu",
    "square",
];
const BINARY_CALLS: &[&str] = &[
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "pow", "mul", "sub", "div",
    "max", "min",
];
const INFIX: &[&str] = &["+", "-", "*", "/"];
const COMPARE: &[&str] = &[
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "equal",
    "not_equal",
];
const BUILTIN_REDUCERS: &[&str] = &["@add", "@max", "@min", "@mul"];
const LITERALS: &[&str] = &[
    "0.5", "2.0", "-1.0", "1e-3", "3", "0.0", "-0.0", "inf", "-inf", "1e20", "0.125", "-2.5e3",
];

/// User reducers a generated module may define, with their state arity.
const USER_REDUCERS: &[(&str, &str, usize)] = &[
    (
        "sum",
        "reducer @sum(state = acc, item = x) init = 0.0 {\n  return acc + x\n}\n",
        1,
    ),
    (
        "pair",
        "reducer @pair(state = <s, t>, item = <x, y>) init = <0.0, -inf> {\n  return tuple(s + x, maximum(t, y))\n}\n",
        2,
    ),
    (
        "softmax_sum",
        "reducer @softmax_sum(state = <mx, total>, item = x) init = <-inf, 0.0> {\n  next = maximum(mx, x)\n  return tuple(next, total * exp(mx - next) + exp(x - next))\n}\n",
        1,
    ),
];

/// Which programs [`generate`] builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Everything the fuzz test generates, parallel state and user reducers included.
    Full,
    /// Tensor-level programs only: `f32` inputs of rank 0 to 3, literals,
    /// `fill`/`constant`/`iota`, pointwise ops, `select` with `iota` masks, reductions with
    /// built-in reducers, `matmul` (with transposed operands), `transpose` and `broadcast`;
    /// dimension sizes 1, 2, 4, 8 and 16 and literal `1` dimensions. No parallel state, no
    /// user reducers.
    TensorLevel,
}

/// Something wrong with the front end that generation ran into: a panic in the oracle, or
/// an annotation of an inferred type that is rejected.
#[derive(Clone, Debug)]
pub struct Problem {
    pub kind: String,
    pub detail: String,
    /// The program text that showed it.
    pub input: String,
}

/// What the oracle says of a program text: `Ok(Some(module))` when it parses and verifies
/// (the verified module), `Ok(None)` when it is rejected with diagnostics, `Err((kind,
/// detail))` when checking it panicked.
pub type OracleResult = Result<Option<Module>, (String, String)>;

/// One generated program.
pub struct Generated {
    /// The program; it parses and verifies by construction.
    pub text: String,
    pub problems: Vec<Problem>,
    /// How many times the oracle ran.
    pub oracle_calls: u64,
}

/// The plain oracle: parse and verify, with a panic caught and reported (the default panic
/// hook still prints it).
pub fn verify_text(text: &str) -> OracleResult {
    let panicked = |stage: &str, payload: Box<dyn std::any::Any + Send>| {
        let message = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "(non-string panic payload)".to_string()
        };
        (format!("panic in {stage}"), message)
    };
    let parsed = catch_unwind(AssertUnwindSafe(|| parse_module(text, 0)))
        .map_err(|p| panicked("parse_module", p))?;
    let Ok(mut m) = parsed else {
        return Ok(None);
    };
    let verified = catch_unwind(AssertUnwindSafe(|| verify_module(&mut m).map(|_| ())))
        .map_err(|p| panicked("verify_module", p))?;
    Ok(verified.ok().map(|_| m))
}

struct Val {
    name: String,
    ty: Type,
}

struct Generator<'a> {
    rng: &'a mut Rng,
    mode: Mode,
    verify: &'a mut dyn FnMut(&str) -> OracleResult,
    reducers: Vec<(&'static str, usize)>,
    preamble: String,
    func_line: String,
    stmts: Vec<String>,
    vals: Vec<Val>,
    counter: usize,
    problems: Vec<Problem>,
    oracle_calls: u64,
    /// Values `close` has handled.
    closed: Vec<String>,
    /// The dimension symbols bound by `where`.
    dims: Vec<String>,
    /// Symbols `X` with a derived size `X2 = X + X` in `where` (a concat of two `X`s).
    doubled: Vec<String>,
}

fn tensor_of(t: &Type) -> Option<&TensorType> {
    match t {
        Type::Tensor(t) => Some(t),
        Type::Tuple(_) => None,
    }
}

fn has_state(t: &Type) -> bool {
    match t {
        Type::Tensor(t) => !t.par.is_empty(),
        Type::Tuple(fs) => fs.iter().any(has_state),
    }
}

/// A dimension reference as the printer would write it: the symbol when unique, else the
/// index.
fn dim_ref(t: &TensorType, i: usize) -> String {
    efopt::ir::dim_ref_text(&t.shape, i)
}

/// Now and then a derived size `X2 = X + X` for one of `dims`, which a concat of two `X`s
/// takes (and a slice of either half undoes); the symbols it doubles.
fn doubled_size(rng: &mut Rng, dims: &[String], bindings: &mut Vec<String>) -> Vec<String> {
    if !rng.chance(1, 3) {
        return Vec::new();
    }
    let x = rng.pick(dims).clone();
    bindings.push(format!("{x}2 = {x} + {x}"));
    vec![x]
}

fn shape_text(shape: &[Dim]) -> String {
    efopt::ir::shape_to_string(shape)
}

impl<'a> Generator<'a> {
    fn new(
        rng: &'a mut Rng,
        mode: Mode,
        oracle: &'a mut dyn FnMut(&str) -> OracleResult,
        index: u64,
    ) -> Generator<'a> {
        if mode == Mode::TensorLevel {
            return Generator::new_tensor_level(rng, oracle, index);
        }
        let mut preamble = String::new();
        let mut reducers = Vec::new();
        for (name, text, arity) in USER_REDUCERS {
            if rng.chance(1, 3) {
                preamble.push_str(text);
                preamble.push('\n');
                reducers.push((*name, *arity));
            }
        }
        let ndims = 2 + rng.below(3);
        let mut names: Vec<&str> = DIM_NAMES.to_vec();
        let mut bindings = Vec::new();
        let mut dims = Vec::new();
        for _ in 0..ndims {
            let i = rng.below(names.len());
            let name = names.remove(i);
            bindings.push(format!("{name} = {}", rng.pick(DIM_SIZES)));
            dims.push(name.to_string());
        }
        if rng.chance(1, 5) {
            bindings.push(format!("{} = {}", rng.pick(AXES), rng.pick(&[1, 2])));
        }
        let doubled = doubled_size(rng, &dims, &mut bindings);
        let func_line = format!("func gen{index} where {} {{\n", bindings.join(", "));
        let mut g = Generator {
            rng,
            reducers,
            preamble,
            func_line,
            stmts: Vec::new(),
            vals: Vec::new(),
            counter: 0,
            mode,
            verify: oracle,
            problems: Vec::new(),
            oracle_calls: 0,
            closed: Vec::new(),
            dims: dims.clone(),
            doubled,
        };
        let ninputs = 1 + g.rng.below(3);
        for _ in 0..ninputs {
            let rank = 1 + g.rng.below(3);
            let mut shape = Vec::new();
            for _ in 0..rank {
                if g.rng.chance(1, 12) {
                    shape.push("1".to_string());
                } else {
                    shape.push(g.rng.pick(&dims).clone());
                }
            }
            let dtype = *g.rng.pick(&["f32", "f32", "f32", "bf16", "f16"]);
            let name = g.fresh("in");
            g.try_leaf(
                &name,
                &format!("tensor<{}, {dtype}>", shape.join("x")),
                "input",
            );
        }
        g
    }

    fn fresh(&mut self, base: &str) -> String {
        self.counter += 1;
        format!("{base}{}", self.counter)
    }

    fn text_with(&self, extra: Option<&str>, ret: &str) -> String {
        let mut s = self.preamble.clone();
        s.push_str(&self.func_line);
        for st in &self.stmts {
            s.push_str(st);
            s.push('\n');
        }
        if let Some(e) = extra {
            s.push_str(e);
            s.push('\n');
        }
        s.push_str(&format!("  return {ret}\n}}\n"));
        s
    }

    fn default_ret(&self) -> String {
        self.vals
            .first()
            .map(|v| v.name.clone())
            .unwrap_or_else(|| "nothing".into())
    }

    /// Parses and verifies the program with `stmt` appended; on success keeps the
    /// statement and returns the new value's type.
    fn oracle(&mut self, name: &str, stmt: &str) -> Option<Type> {
        self.oracle_calls += 1;
        let ret = if self.vals.is_empty() {
            name.to_string()
        } else {
            self.default_ret()
        };
        let text = self.text_with(Some(stmt), &ret);
        match (self.verify)(&text) {
            Err((kind, detail)) => {
                self.problems.push(Problem {
                    kind,
                    detail,
                    input: text,
                });
                None
            }
            Ok(None) => None,
            Ok(Some(m)) => m
                .funcs
                .first()?
                .body
                .nodes
                .iter()
                .find(|n| n.name.as_deref() == Some(name))
                .and_then(|n| n.ty.clone().or_else(|| n.annot.clone())),
        }
    }

    /// Adds `name = expr` if it verifies, sometimes with its inferred type written out.
    /// Whether value `i` is the result of an `exp`.
    fn defined_by_exp(&self, i: usize) -> bool {
        let name = &self.vals[i].name;
        self.stmts.iter().any(|s| {
            let s = s.trim_start();
            (s.starts_with(&format!("{name} ")) || s.starts_with(&format!("{name}:")))
                && s.contains("= exp(")
        })
    }

    fn try_stmt(&mut self, name: &str, expr: &str) -> bool {
        let stmt = format!("  {name} = {expr}");
        let Some(ty) = self.oracle(name, &stmt) else {
            return false;
        };
        let mut stmt = stmt;
        if self.rng.chance(1, 4) {
            let annotated = format!("  {name}: {ty} = {expr}");
            match self.oracle(name, &annotated) {
                Some(_) => stmt = annotated,
                None => {
                    let text = self.text_with(Some(&annotated), &self.default_ret());
                    self.problems.push(Problem {
                        kind: "an annotation of the inferred type is rejected".into(),
                        detail: format!("`{name}: {ty}`"),
                        input: text,
                    });
                }
            }
        }
        self.stmts.push(stmt);
        self.vals.push(Val {
            name: name.to_string(),
            ty,
        });
        true
    }

    /// Adds a leaf (`input`, `fill`, `iota`, `constant`), which needs its type written.
    fn try_leaf(&mut self, name: &str, ty: &str, expr: &str) -> bool {
        let stmt = format!("  {name}: {ty} = {expr}");
        let Some(t) = self.oracle(name, &stmt) else {
            return false;
        };
        // Inputs are declared first, in order.
        if expr == "input" {
            let pos = self
                .stmts
                .iter()
                .position(|s| !s.ends_with("= input"))
                .unwrap_or(self.stmts.len());
            self.stmts.insert(pos, stmt);
        } else {
            self.stmts.push(stmt);
        }
        self.vals.push(Val {
            name: name.to_string(),
            ty: t,
        });
        true
    }

    fn pick_val(&mut self, pred: impl Fn(&Val) -> bool) -> Option<usize> {
        let idx: Vec<usize> = (0..self.vals.len())
            .filter(|&i| pred(&self.vals[i]))
            .collect();
        if idx.is_empty() {
            return None;
        }
        // Prefer recent values, so chains form.
        let k = if self.rng.chance(2, 3) {
            idx.len() - 1 - self.rng.below(idx.len().min(3))
        } else {
            self.rng.below(idx.len())
        };
        Some(idx[k])
    }

    /// An operand expression for value `i`: its name, or a type-preserving wrapper of it.
    fn operand(&mut self, i: usize, depth: usize) -> String {
        let name = self.vals[i].name.clone();
        let float = tensor_of(&self.vals[i].ty).is_some_and(|t| t.dtype.is_float());
        if depth > 2 || !float || !self.rng.chance(1, 5) {
            return name;
        }
        let inner = self.operand(i, depth + 1);
        match self.rng.below(8) {
            // Tensor level, no `exp` of an unbounded value here (an `exp` of an `exp` is
            // decided by one rounding; seed 4343, program 14525).
            0 if self.mode == Mode::TensorLevel => format!("exp(tanh({inner}))"),
            0 => format!("exp({inner})"),
            1 => format!("neg({inner})"),
            2 => format!("({inner} * 0.5)"),
            3 => format!("({inner} + {inner})"),
            4 => format!("-{inner}"),
            5 => format!("abs({inner})"),
            6 => format!("maximum({inner}, 0.0)"),
            // Tensor level, divisors stay away from 0: `1.5 / x` near `x = 0` is ~1e6, and a
            // candidate that rounds `x` one ulp apart (a matmul tiled) then differs by
            // percents after an `exp` (seed 4242, programs 13429 and 13366): conditioning,
            // which says nothing about the rules.
            _ if self.mode == Mode::TensorLevel => {
                format!("({inner} - 1.5 / (abs({inner}) + 1.0))")
            }
            _ => format!("({inner} - 1.5 / {inner})"),
        }
    }

    fn float_tensor(v: &Val) -> bool {
        tensor_of(&v.ty).is_some_and(|t| t.dtype.is_float())
    }

    fn step(&mut self) {
        if self.mode == Mode::TensorLevel {
            return self.tensor_step();
        }
        let name = self.fresh("v");
        match self.rng.below(20) {
            0 | 1 => {
                let Some(i) = self.pick_val(Self::float_tensor) else {
                    return;
                };
                let op = *self.rng.pick(UNARY);
                let x = self.operand(i, 0);
                self.try_stmt(&name, &format!("{op}({x})"));
            }
            2..=4 => {
                let Some(i) = self.pick_val(|v| tensor_of(&v.ty).is_some()) else {
                    return;
                };
                let ti = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let axes: Vec<String> = ti.par.axes().map(|a| a.to_string()).collect();
                // A partner with the same axes, preferably the same shape.
                let j = self
                    .pick_val(|v| {
                        tensor_of(&v.ty).is_some_and(|t| {
                            t.shape == ti.shape
                                && t.par.axes().map(|a| a.to_string()).collect::<Vec<_>>() == axes
                        })
                    })
                    .or_else(|| {
                        self.pick_val(|v| {
                            tensor_of(&v.ty).is_some_and(|t| {
                                t.par.axes().map(|a| a.to_string()).collect::<Vec<_>>() == axes
                            })
                        })
                    });
                let x = self.operand(i, 0);
                let y = match j {
                    Some(j) if !self.rng.chance(1, 4) => self.operand(j, 0),
                    _ => self.rng.pick(LITERALS).to_string(),
                };
                let expr = if self.rng.chance(1, 2) {
                    format!("{x} {} {y}", self.rng.pick(INFIX))
                } else {
                    format!("{}({x}, {y})", self.rng.pick(BINARY_CALLS))
                };
                self.try_stmt(&name, &expr);
            }
            5 => {
                let Some(i) = self.pick_val(Self::float_tensor) else {
                    return;
                };
                let ti = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let j = self.pick_val(|v| {
                    tensor_of(&v.ty).is_some_and(|t| t.shape == ti.shape && t.par == ti.par)
                });
                let x = self.vals[i].name.clone();
                let y = match j {
                    Some(j) => self.vals[j].name.clone(),
                    None => self.rng.pick(LITERALS).to_string(),
                };
                let cmp = self.rng.pick(COMPARE);
                let cond = if self.rng.chance(1, 3) {
                    let logic = self.rng.pick(&["logical_and", "logical_or"]);
                    let cmp2 = self.rng.pick(COMPARE);
                    format!("{logic}({cmp}({x}, {y}), {cmp2}({y}, {x}))")
                } else {
                    format!("{cmp}({x}, {y})")
                };
                self.try_stmt(&name, &format!("select({cond}, {x}, {y})"));
            }
            6 | 7 => {
                let Some(i) = self.pick_val(|v| tensor_of(&v.ty).is_some_and(|t| t.rank() > 0))
                else {
                    return;
                };
                let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let d = self.rng.below(t.rank());
                let dim = if self.rng.chance(1, 4) {
                    d.to_string()
                } else {
                    dim_ref(&t, d)
                };
                let x = self.operand(i, 0);
                let input = if x.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    x
                } else {
                    format!("({x})")
                };
                let user: Vec<(&str, usize)> =
                    self.reducers.iter().filter(|r| r.1 == 1).cloned().collect();
                let expr = if !user.is_empty() && self.rng.chance(1, 4) {
                    let (r, _) = self.rng.pick(&user);
                    format!("reduce {input} axis={dim} reducer=@{r}")
                } else {
                    let keep = if self.rng.chance(1, 3) {
                        " keep_dims"
                    } else {
                        ""
                    };
                    format!(
                        "reduce {input} axis={dim} reducer={}{keep}",
                        self.rng.pick(BUILTIN_REDUCERS)
                    )
                };
                self.try_stmt(&name, &expr);
            }
            8 => {
                // Fold partial values, or fold a tiled value with a user reducer.
                let Some(i) =
                    self.pick_val(|v| tensor_of(&v.ty).is_some_and(|t| !t.par.is_empty()))
                else {
                    return;
                };
                let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let partial: Vec<String> = t
                    .par
                    .0
                    .iter()
                    .filter(|(_, k)| **k == ParKind::Partial)
                    .map(|(a, _)| a.to_string())
                    .collect();
                let x = self.vals[i].name.clone();
                let user: Vec<(&str, usize)> =
                    self.reducers.iter().filter(|r| r.1 == 1).cloned().collect();
                let expr = if !partial.is_empty() && (user.is_empty() || self.rng.chance(3, 4)) {
                    let a = self.rng.pick(&partial).to_string();
                    format!(
                        "reduce {x} parallel={a} reducer={}",
                        self.rng.pick(&["@add", "@max", "@min"])
                    )
                } else if !user.is_empty() {
                    let axes: Vec<String> = t.par.axes().map(|a| a.to_string()).collect();
                    let a = self.rng.pick(&axes).clone();
                    let (r, _) = self.rng.pick(&user);
                    format!("reduce {x} parallel={a} reducer=@{r}")
                } else {
                    return;
                };
                self.try_stmt(&name, &expr);
            }
            9 | 10 => {
                // Partition a dimension along an axis the value is not on.
                let Some(i) = self.pick_val(|v| tensor_of(&v.ty).is_some_and(|t| t.rank() > 0))
                else {
                    return;
                };
                let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let free: Vec<usize> = (0..t.rank())
                    .filter(|&d| !t.shape[d].is_one() && t.par.partitioner_of(d).is_none())
                    .collect();
                let axes: Vec<&str> = AXES
                    .iter()
                    .copied()
                    .filter(|a| t.par.get(a).is_none())
                    .collect();
                if free.is_empty() || axes.is_empty() {
                    return;
                }
                let d = *self.rng.pick(&free);
                let a = *self.rng.pick(&axes);
                let x = self.operand(i, 0);
                let dim = dim_ref(&t, d);
                self.try_stmt(&name, &format!("partition[{dim},{a}]({x})"));
            }
            11 => {
                let Some(i) = self.pick_val(|_| true) else {
                    return;
                };
                let x = self.vals[i].name.clone();
                let a = *self.rng.pick(AXES);
                self.try_stmt(&name, &format!("replicate[{a}]({x})"));
            }
            12 => {
                let Some(i) = self.pick_val(|v| {
                    tensor_of(&v.ty).is_some_and(|t| {
                        t.par.0.values().any(|k| matches!(k, ParKind::Partition(_)))
                    })
                }) else {
                    return;
                };
                let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let parts: Vec<(String, usize)> = t
                    .par
                    .0
                    .iter()
                    .filter_map(|(a, k)| match k {
                        ParKind::Partition(d) => Some((a.to_string(), *d)),
                        _ => None,
                    })
                    .collect();
                let (a, d) = self.rng.pick(&parts).clone();
                let x = self.operand(i, 0);
                let dim = dim_ref(&t, d);
                self.try_stmt(&name, &format!("combination[{dim},{a}]({x})"));
            }
            13 => {
                let Some(i) = self.pick_val(|v| has_state(&v.ty)) else {
                    return;
                };
                let axes: Vec<String> = match &self.vals[i].ty {
                    Type::Tensor(t) => t.par.axes().map(|a| a.to_string()).collect(),
                    Type::Tuple(fs) => fs
                        .iter()
                        .filter_map(tensor_of)
                        .flat_map(|t| t.par.axes().map(|a| a.to_string()))
                        .collect(),
                };
                if axes.is_empty() {
                    return;
                }
                let a = self.rng.pick(&axes).clone();
                let x = self.vals[i].name.clone();
                self.try_stmt(&name, &format!("collection[{a}]({x})"));
            }
            14 => self.matmul(&name),
            15 => self.tiled_matmul(&name),
            16 => {
                let Some(i) = self.pick_val(|v| tensor_of(&v.ty).is_some_and(|t| t.rank() >= 2))
                else {
                    return;
                };
                let rank = tensor_of(&self.vals[i].ty).unwrap().rank();
                let mut perm: Vec<usize> = (0..rank).collect();
                for k in (1..rank).rev() {
                    let j = self.rng.below(k + 1);
                    perm.swap(k, j);
                }
                let p: Vec<String> = perm.iter().map(|d| d.to_string()).collect();
                let x = self.operand(i, 0);
                self.try_stmt(&name, &format!("transpose[{}]({x})", p.join(",")));
            }
            17 => {
                // Reshape to a permutation of the dims (with a unit dim sometimes), or
                // broadcast to one more leading dim.
                let Some(i) = self.pick_val(|v| tensor_of(&v.ty).is_some_and(|t| t.rank() > 0))
                else {
                    return;
                };
                let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let x = self.operand(i, 0);
                if self.rng.chance(1, 2) {
                    let mut dims = t.shape.clone();
                    for k in (1..dims.len()).rev() {
                        let j = self.rng.below(k + 1);
                        dims.swap(k, j);
                    }
                    if self.rng.chance(1, 3) {
                        let at = self.rng.below(dims.len() + 1);
                        dims.insert(at, Dim::lit(1));
                    }
                    let s = shape_text(&dims);
                    self.try_stmt(&name, &format!("reshape[{s}]({x})"));
                } else {
                    let lead = if self.rng.chance(1, 2) {
                        "2".to_string()
                    } else {
                        self.rng.pick(DIM_NAMES).to_string()
                    };
                    let s = shape_text(&t.shape);
                    self.try_stmt(&name, &format!("broadcast[{lead}x{s}]({x})"));
                }
            }
            18 => {
                let Some(i) = self.pick_val(|v| tensor_of(&v.ty).is_some()) else {
                    return;
                };
                let x = self.operand(i, 0);
                let to = *self.rng.pick(&["f32", "bf16", "f16", "f32"]);
                if self.rng.chance(1, 2) {
                    self.try_stmt(&name, &format!("cast({x}) to={to}"));
                } else {
                    self.try_stmt(&name, &format!("cast[{to}]({x})"));
                }
            }
            _ if self.rng.chance(1, 6) => self.slice_or_concat(&name),
            _ => self.misc(&name),
        }
    }

    /// A value beside itself or its negation (`concat`, along a dimension `X` with
    /// `X2 = X + X` bound), or a slice: the first index, or either half of such a concat.
    fn slice_or_concat(&mut self, name: &str) {
        let Some(i) = self.pick_val(|v| Self::float_tensor(v) && Self::rank(v) > 0) else {
            return;
        };
        let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
        let d = self.rng.below(t.rank());
        let dim = t.shape[d].to_string();
        let x = self.vals[i].name.clone();
        let whole = self.doubled.iter().find(|b| **b == dim).cloned();
        let half = self
            .doubled
            .iter()
            .find(|b| format!("{b}2") == dim)
            .cloned();
        let expr = match (self.rng.below(3), whole, half) {
            (0, Some(_), _) => {
                let other = if self.rng.chance(1, 2) {
                    x.clone()
                } else {
                    format!("neg({x})")
                };
                format!("concat[{d}]({x}, {other})")
            }
            (1, _, Some(b)) => format!("slice[{d},{b},{b}2]({x})"),
            (_, _, Some(b)) => format!("slice[{d},0,{b}]({x})"),
            _ => format!("slice[{d},0,1]({x})"),
        };
        self.try_stmt(name, &expr);
    }

    /// Tuples, `get`, user tuple reducers, and new leaves.
    fn misc(&mut self, name: &str) {
        match self.rng.below(5) {
            0 => {
                let Some(i) = self.pick_val(|v| tensor_of(&v.ty).is_some()) else {
                    return;
                };
                let Some(j) = self.pick_val(|v| tensor_of(&v.ty).is_some()) else {
                    return;
                };
                let (x, y) = (self.vals[i].name.clone(), self.vals[j].name.clone());
                self.try_stmt(name, &format!("tuple({x}, {y})"));
            }
            1 => {
                let Some(i) = self.pick_val(|v| matches!(v.ty, Type::Tuple(_))) else {
                    return;
                };
                let n = match &self.vals[i].ty {
                    Type::Tuple(fs) => fs.len(),
                    Type::Tensor(_) => 1,
                };
                let x = self.vals[i].name.clone();
                let k = self.rng.below(n);
                self.try_stmt(name, &format!("get[{k}]({x})"));
            }
            2 if self.rng.chance(1, 2) => {
                // A tuple reducer folding the tiles of a value on a parallel axis.
                if !self.reducers.iter().any(|r| r.0 == "pair") {
                    return;
                }
                let Some(i) =
                    self.pick_val(|v| tensor_of(&v.ty).is_some_and(|t| !t.par.is_empty()))
                else {
                    return;
                };
                let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let axes: Vec<String> = t.par.axes().map(|a| a.to_string()).collect();
                let a = self.rng.pick(&axes).clone();
                let x = self.vals[i].name.clone();
                let r = self.fresh("r");
                let item = format!("tuple({x}, neg({x}))");
                if self.try_stmt(&r, &format!("reduce ({item}) parallel={a} reducer=@pair")) {
                    let field = *self.rng.pick(&["s", "t", "0", "1"]);
                    self.try_stmt(name, &format!("get[{field}]({r})"));
                }
            }
            2 => {
                if !self.reducers.iter().any(|r| r.0 == "pair") {
                    return;
                }
                let Some(i) = self.pick_val(|v| tensor_of(&v.ty).is_some_and(|t| t.rank() > 0))
                else {
                    return;
                };
                let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let x = self.vals[i].name.clone();
                let d = dim_ref(&t, self.rng.below(t.rank()));
                let r = self.fresh("r");
                if self.try_stmt(
                    &r,
                    &format!("reduce (tuple({x}, exp({x}))) axis={d} reducer=@pair"),
                ) {
                    let field = *self.rng.pick(&["s", "t", "0", "1"]);
                    self.try_stmt(name, &format!("get[{field}]({r})"));
                }
            }
            3 => {
                if !self.reducers.iter().any(|r| r.0 == "softmax_sum") {
                    return;
                }
                let Some(i) = self.pick_val(|v| tensor_of(&v.ty).is_some_and(|t| t.rank() > 0))
                else {
                    return;
                };
                let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let x = self.vals[i].name.clone();
                let d = dim_ref(&t, self.rng.below(t.rank()));
                let r = self.fresh("r");
                if self.try_stmt(&r, &format!("reduce {x} axis={d} reducer=@softmax_sum")) {
                    let field = *self.rng.pick(&["mx", "total"]);
                    self.try_stmt(name, &format!("get[{field}]({r})"));
                }
            }
            _ => {
                let Some(i) = self.pick_val(|v| tensor_of(&v.ty).is_some()) else {
                    return;
                };
                let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let shape = shape_text(&t.shape);
                let prefix = if shape.is_empty() {
                    String::new()
                } else {
                    format!("{shape}, ")
                };
                match self.rng.below(3) {
                    0 => {
                        let v = self.rng.pick(&["0.0", "-inf", "1.5", "-2.0", "3"]);
                        self.try_leaf(name, &format!("tensor<{prefix}f32>"), &format!("fill[{v}]"));
                    }
                    1 if t.rank() > 0 => {
                        let d = dim_ref(&t, self.rng.below(t.rank()));
                        let dt = self.rng.pick(&["f32", "i32"]);
                        self.try_leaf(
                            name,
                            &format!("tensor<{prefix}{dt}>"),
                            &format!("iota[{d}]"),
                        );
                    }
                    _ => {
                        let v = self.rng.pick(&["0.25", "-1.0", "nan", "inf", "2"]);
                        self.try_leaf(
                            name,
                            &format!("tensor<{prefix}f32>"),
                            &format!("constant {v}"),
                        );
                    }
                }
            }
        }
    }

    /// `matmul`/`tile_matmul` of two values whose contraction dims agree, transposing the
    /// rhs when needed.
    fn matmul(&mut self, name: &str) {
        let Some(i) = self
            .pick_val(|v| tensor_of(&v.ty).is_some_and(|t| t.rank() >= 2 && t.dtype.is_float()))
        else {
            return;
        };
        let a = tensor_of(&self.vals[i].ty).cloned().unwrap();
        let k = a.shape[a.rank() - 1].clone();
        let direct = self.pick_val(|v| {
            tensor_of(&v.ty)
                .is_some_and(|t| t.rank() >= 2 && t.dtype.is_float() && t.shape[t.rank() - 2] == k)
        });
        let (rhs, j) = match direct {
            Some(j) => (self.operand(j, 0), j),
            None => {
                let Some(j) = self.pick_val(|v| {
                    tensor_of(&v.ty)
                        .is_some_and(|t| t.rank() == 2 && t.dtype.is_float() && t.shape[1] == k)
                }) else {
                    return;
                };
                (format!("transpose[1,0]({})", self.vals[j].name), j)
            }
        };
        let tiled = has_state(&self.vals[i].ty) || has_state(&self.vals[j].ty);
        let op = if tiled || self.rng.chance(1, 8) {
            "tile_matmul"
        } else {
            "matmul"
        };
        let acc = if self.rng.chance(1, 2) {
            " acc=f32"
        } else {
            ""
        };
        let lhs = self.operand(i, 0);
        self.try_stmt(name, &format!("{op}({lhs}, {rhs}){acc}"));
    }

    /// Brings values with parallel state back to global memory so they can be returned:
    /// each such value (latest first) gets one closing step; results that still have state
    /// are visited in turn.
    fn close(&mut self) {
        for _ in 0..12 {
            let Some(i) = (0..self.vals.len()).rev().find(|&i| {
                tensor_of(&self.vals[i].ty).is_some_and(|t| !t.par.is_empty())
                    && !self.closed.contains(&self.vals[i].name)
            }) else {
                return;
            };
            let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
            let x = self.vals[i].name.clone();
            self.closed.push(x.clone());
            let (a, k) = t.par.0.iter().next().map(|(a, k)| (*a, *k)).unwrap();
            let name = self.fresh("c");
            let expr = match k {
                ParKind::Partition(d) => format!("combination[{},{a}]({x})", dim_ref(&t, d)),
                ParKind::Partial => format!(
                    "reduce {x} parallel={a} reducer={}",
                    self.rng.pick(&["@add", "@max", "@min"])
                ),
                ParKind::Replicate => format!("collection[{a}]({x})"),
            };
            self.try_stmt(&name, &expr);
        }
    }

    /// A tiled product from the refinement table: inputs `MxK` and `KxN` (with a batch
    /// dimension sometimes), viewed on up to four axes with roles M, N, K, batch or
    /// replicate, multiplied with `tile_matmul`.
    fn tiled_matmul(&mut self, name: &str) {
        let dims = self.dims.clone();
        let pick = |rng: &mut Rng| rng.pick(&dims).clone();
        let (m, k, n) = (pick(self.rng), pick(self.rng), pick(self.rng));
        let batch = if self.rng.chance(1, 4) {
            Some(pick(self.rng))
        } else {
            None
        };
        let dtype = *self.rng.pick(&["f32", "bf16"]);
        let prefix = batch.as_ref().map(|b| format!("{b}x")).unwrap_or_default();
        let a = self.fresh("in");
        let b = self.fresh("in");
        if !self.try_leaf(&a, &format!("tensor<{prefix}{m}x{k}, {dtype}>"), "input")
            || !self.try_leaf(&b, &format!("tensor<{prefix}{k}x{n}, {dtype}>"), "input")
        {
            return;
        }
        let rank = if batch.is_some() { 3 } else { 2 };
        // Dimension references by index, since symbols may repeat (MxM).
        let (im, ika, ikb, inn) = (rank - 2, rank - 1, rank - 2, rank - 1);
        let mut lhs = a.clone();
        let mut rhs = b.clone();
        let mut roles = vec!["M", "N", "K", "R"];
        if batch.is_some() {
            roles.push("B");
        }
        let mut axes: Vec<&str> = AXES.to_vec();
        for _ in 0..1 + self.rng.below(3) {
            if roles.is_empty() || axes.is_empty() {
                break;
            }
            let role = roles.remove(self.rng.below(roles.len()));
            let axis = axes.remove(self.rng.below(axes.len()));
            let (l, r) = match role {
                "M" => (
                    format!("partition[{im},{axis}]"),
                    format!("replicate[{axis}]"),
                ),
                "N" => (
                    format!("replicate[{axis}]"),
                    format!("partition[{inn},{axis}]"),
                ),
                "K" => (
                    format!("partition[{ika},{axis}]"),
                    format!("partition[{ikb},{axis}]"),
                ),
                "B" => (
                    format!("partition[0,{axis}]"),
                    format!("partition[0,{axis}]"),
                ),
                _ => (format!("replicate[{axis}]"), format!("replicate[{axis}]")),
            };
            lhs = format!("{l}({lhs})");
            rhs = format!("{r}({rhs})");
        }
        let acc = if self.rng.chance(1, 2) {
            " acc=f32"
        } else {
            ""
        };
        if self.rng.chance(1, 2) {
            self.try_stmt(name, &format!("tile_matmul({lhs}, {rhs}){acc}"));
        } else {
            let (l, r) = (self.fresh("t"), self.fresh("t"));
            if self.try_stmt(&l, &lhs) && self.try_stmt(&r, &rhs) {
                self.try_stmt(name, &format!("tile_matmul({l}, {r}){acc}"));
            }
        }
    }

    fn finish(mut self) -> Generated {
        if self.mode == Mode::TensorLevel {
            return self.finish_tensor_level();
        }
        self.close();
        let closed: Vec<String> = self
            .vals
            .iter()
            .filter(|v| !has_state(&v.ty))
            .map(|v| v.name.clone())
            .collect();
        let mut ret: Vec<String> = closed
            .iter()
            .rev()
            .take(1 + self.rng.below(3))
            .cloned()
            .collect();
        ret.dedup();
        if ret.is_empty() {
            ret.push(self.default_ret());
        }
        let text = self.text_with(None, &ret.join(", "));
        Generated {
            text,
            problems: self.problems,
            oracle_calls: self.oracle_calls,
        }
    }
}

/// Generates one well-formed program `gen{index}` (it parses and verifies by construction),
/// with `oracle` deciding what verifies ([`verify_text`] will do).
pub fn generate(
    rng: &mut Rng,
    mode: Mode,
    index: u64,
    oracle: &mut dyn FnMut(&str) -> OracleResult,
) -> Generated {
    let mut g = Generator::new(rng, mode, oracle, index);
    let steps = match mode {
        Mode::Full => 4 + g.rng.below(22),
        Mode::TensorLevel => 3 + g.rng.below(12),
    };
    for _ in 0..steps {
        g.step();
    }
    g.finish()
}

// ---------------------------------------------------------------------------------------
// Tensor-level programs (`Mode::TensorLevel`).

/// Dimension sizes of tensor-level programs: 1 makes the one-row and one-column shapes.
const TL_SIZES: &[u64] = &[1, 2, 4, 8, 16];
/// Unary operations defined on every real input (no `log`, `sqrt`, ... of negatives).
const TL_UNARY: &[&str] = &[
    "exp", "neg", "abs", "tanh", "sigmoid", "silu", "gelu", "square",
];
const TL_BINARY_CALLS: &[&str] = &[
    "add", "subtract", "multiply", "divide", "maximum", "minimum",
];
const TL_LITERALS: &[&str] = &["0.5", "2.0", "-1.0", "1e-3", "3", "0.0", "0.125", "-2.5"];
/// What a mask replaces: `-inf` (attention), zero, a large negative number.
const TL_MASK_FILL: &[&str] = &["-inf", "-inf", "0.0", "-1e4"];

/// The name a statement (`  name = …` or `  name: TYPE = …`) defines.
fn stmt_name(stmt: &str) -> String {
    stmt.trim_start()
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .next()
        .unwrap_or("")
        .to_string()
}

/// The identifiers a statement's expression mentions.
fn stmt_uses(stmt: &str) -> Vec<String> {
    let body = stmt.split_once(" = ").map_or("", |(_, e)| e);
    body.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic()))
        .map(str::to_string)
        .collect()
}

impl<'a> Generator<'a> {
    fn new_tensor_level(
        rng: &'a mut Rng,
        oracle: &'a mut dyn FnMut(&str) -> OracleResult,
        index: u64,
    ) -> Generator<'a> {
        let ndims = 2 + rng.below(3);
        let mut names: Vec<&str> = DIM_NAMES.to_vec();
        let mut bindings = Vec::new();
        let mut dims = Vec::new();
        for _ in 0..ndims {
            let name = names.remove(rng.below(names.len()));
            bindings.push(format!("{name} = {}", rng.pick(TL_SIZES)));
            dims.push(name.to_string());
        }
        let doubled = doubled_size(rng, &dims, &mut bindings);
        let func_line = format!("func gen{index} where {} {{\n", bindings.join(", "));
        let mut g = Generator {
            rng,
            mode: Mode::TensorLevel,
            verify: oracle,
            reducers: Vec::new(),
            preamble: String::new(),
            func_line,
            stmts: Vec::new(),
            vals: Vec::new(),
            counter: 0,
            problems: Vec::new(),
            oracle_calls: 0,
            closed: Vec::new(),
            dims,
            doubled,
        };
        for _ in 0..1 + g.rng.below(3) {
            let rank = *g.rng.pick(&[0, 1, 1, 2, 2, 2, 2, 3, 3]);
            let shape = g.random_shape(rank);
            g.new_input(&shape);
        }
        g
    }

    /// `rank` dimensions: bound symbols, with a literal `1` now and then.
    fn random_shape(&mut self, rank: usize) -> Vec<String> {
        (0..rank)
            .map(|_| {
                if self.rng.chance(1, 8) {
                    "1".to_string()
                } else {
                    self.rng.pick(&self.dims).clone()
                }
            })
            .collect()
    }

    /// A new `f32` input of `shape` (rank 0 when empty); its name, if it verified.
    fn new_input(&mut self, shape: &[String]) -> Option<String> {
        self.new_leaf("in", shape, "f32", "input")
    }

    /// A leaf of type `tensor<SHAPE, DTYPE>` (`SHAPE` may be empty: rank 0).
    fn new_leaf(
        &mut self,
        base: &str,
        shape: &[String],
        dtype: &str,
        expr: &str,
    ) -> Option<String> {
        let name = self.fresh(base);
        let ty = if shape.is_empty() {
            format!("tensor<{dtype}>")
        } else {
            format!("tensor<{}, {dtype}>", shape.join("x"))
        };
        self.try_leaf(&name, &ty, expr).then_some(name)
    }

    /// `name = expr` under a fresh name; the name, if it verified.
    fn stmt(&mut self, base: &str, expr: &str) -> Option<String> {
        let name = self.fresh(base);
        self.try_stmt(&name, expr).then_some(name)
    }

    fn shape_of(&self, i: usize) -> Vec<Dim> {
        tensor_of(&self.vals[i].ty)
            .map(|t| t.shape.clone())
            .unwrap_or_default()
    }

    /// The shape's dimensions as text (symbols, literals).
    fn dims_text(shape: &[Dim]) -> Vec<String> {
        shape.iter().map(|d| d.to_string()).collect()
    }

    fn tensor_step(&mut self) {
        let name = self.fresh("v");
        match self.rng.below(23) {
            0..=2 => {
                let Some(i) = self.pick_val(Self::float_tensor) else {
                    return;
                };
                let op = *self.rng.pick(TL_UNARY);
                // `exp` of an `exp` is finite or `inf` by one rounding of its argument, which
                // a reassociated product changes: no reference value (found: program 4690 of
                // seed 4242, where the source gave 3.3e38 and a candidate `inf`).
                if op == "exp" && self.defined_by_exp(i) {
                    return;
                }
                let x = self.operand(i, 0);
                self.try_stmt(&name, &format!("{op}({x})"));
            }
            3..=6 => self.tensor_binary(&name),
            7 | 8 => self.masked(&name),
            9..=11 => {
                let Some(i) = self.pick_val(|v| Self::float_tensor(v) && Self::rank(v) > 0) else {
                    return;
                };
                let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
                let d = self.rng.below(t.rank());
                let dim = if self.rng.chance(1, 4) {
                    d.to_string()
                } else {
                    dim_ref(&t, d)
                };
                let x = self.operand(i, 0);
                let input = if x.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    x
                } else {
                    format!("({x})")
                };
                let keep = if self.rng.chance(1, 2) {
                    " keep_dims"
                } else {
                    ""
                };
                let r = self.rng.pick(BUILTIN_REDUCERS);
                // A product reduction of unbounded values (`exp` of scale-30 inputs) overflows
                // or not depending on the order it multiplies in, which tiling changes: the
                // reference interpreter's f64 accumulation keeps a product finite that f32
                // partial products of a split reduction take to `inf · 0`. Real arithmetic
                // says nothing there, so products fold bounded values.
                let input = if *r == "@mul" {
                    format!("(tanh({input}))")
                } else {
                    input
                };
                self.try_stmt(
                    &name,
                    &format!("reduce {input} axis={dim} reducer={r}{keep}"),
                );
            }
            12..=14 => self.tensor_matmul(&name),
            15 => {
                let Some(i) = self.pick_val(|v| Self::float_tensor(v) && Self::rank(v) >= 2) else {
                    return;
                };
                let rank = Self::rank(&self.vals[i]);
                let mut perm: Vec<usize> = (0..rank).collect();
                while perm.iter().enumerate().all(|(k, &p)| k == p) {
                    for k in (1..rank).rev() {
                        let j = self.rng.below(k + 1);
                        perm.swap(k, j);
                    }
                }
                let p: Vec<String> = perm.iter().map(|d| d.to_string()).collect();
                let x = self.operand(i, 0);
                self.try_stmt(&name, &format!("transpose[{}]({x})", p.join(",")));
            }
            16 => self.tensor_broadcast(&name),
            17 => self.tensor_leaf(&name),
            18 | 19 => self.softmax(),
            20 => self.rmsnorm(),
            21 => self.attention(),
            _ => self.slice_or_concat(&name),
        }
    }

    /// Returns up to three of the latest float values nothing uses, and keeps only the
    /// statements they depend on: no dead statements, and every input is used.
    fn finish_tensor_level(mut self) -> Generated {
        let defined: Vec<String> = self.stmts.iter().map(|s| stmt_name(s)).collect();
        let used_later = |name: &str| {
            defined
                .iter()
                .zip(&self.stmts)
                .any(|(d, s)| d != name && stmt_uses(s).contains(&name.to_string()))
        };
        let sinks: Vec<String> = self
            .vals
            .iter()
            .filter(|v| Self::float_tensor(v) && !used_later(&v.name))
            .map(|v| v.name.clone())
            .collect();
        let n = 1 + self.rng.below(3);
        let ret: Vec<String> = sinks.iter().rev().take(n).rev().cloned().collect();
        if ret.is_empty() {
            let ret = self.default_ret();
            let text = self.text_with(None, &ret);
            return Generated {
                text,
                problems: self.problems,
                oracle_calls: self.oracle_calls,
            };
        }
        // Live statements: what the results use, transitively.
        let mut live: Vec<String> = ret.clone();
        for (d, s) in defined.iter().zip(&self.stmts).rev() {
            if live.contains(d) {
                live.extend(stmt_uses(s));
            }
        }
        let all = std::mem::take(&mut self.stmts);
        self.stmts = defined
            .iter()
            .zip(&all)
            .filter(|(d, _)| live.contains(d))
            .map(|(_, s)| s.clone())
            .collect();
        let text = self.text_with(None, &ret.join(", "));
        // Dropping dead statements keeps a program valid; if it did not, keep them.
        self.oracle_calls += 1;
        let text = match (self.verify)(&text) {
            Ok(Some(_)) => text,
            _ => {
                self.stmts = all;
                self.text_with(None, &ret.join(", "))
            }
        };
        Generated {
            text,
            problems: self.problems,
            oracle_calls: self.oracle_calls,
        }
    }

    fn rank(v: &Val) -> usize {
        tensor_of(&v.ty).map_or(0, |t| t.rank())
    }

    /// A binary operation with a partner of the same shape, one that broadcasts, or a literal.
    fn tensor_binary(&mut self, name: &str) {
        let Some(i) = self.pick_val(Self::float_tensor) else {
            return;
        };
        let shape = self.shape_of(i);
        let j = if self.rng.chance(2, 3) {
            self.pick_val(|v| Self::float_tensor(v) && tensor_of(&v.ty).unwrap().shape == shape)
        } else {
            self.pick_val(Self::float_tensor)
        };
        let x = self.operand(i, 0);
        let y = match j {
            Some(j) if !self.rng.chance(1, 4) => self.operand(j, 0),
            _ => self.rng.pick(TL_LITERALS).to_string(),
        };
        let (x, mut y) = if self.rng.chance(1, 4) {
            (y, x)
        } else {
            (x, y)
        };
        let (infix, op) = if self.rng.chance(1, 2) {
            (true, *self.rng.pick(INFIX))
        } else {
            (false, *self.rng.pick(TL_BINARY_CALLS))
        };
        // No division by a literal zero: `(a·b)/0` and `a·(b/0)` differ where `a` holds a
        // zero (NaN against infinity), which says nothing about the rules.
        if (op == "/" || op == "divide") && y == "0.0" {
            y = "2.0".to_string();
        }
        // Nor by values near zero (see `operand`).
        if op == "/" || op == "divide" {
            y = format!("(abs({y}) + 1.0)");
        }
        let expr = if infix {
            format!("{x} {op} {y}")
        } else {
            format!("{op}({x}, {y})")
        };
        self.try_stmt(name, &expr);
    }

    /// A mask from `iota` comparisons, and a `select` of a value by it (a matrix mostly, as
    /// `lower` takes masks of matrices).
    fn masked(&mut self, name: &str) {
        let matrix = self.rng.chance(4, 5);
        let Some(i) = self
            .pick_val(|v| Self::float_tensor(v) && Self::rank(v) == 2)
            .filter(|_| matrix)
            .or_else(|| self.pick_val(|v| Self::float_tensor(v) && Self::rank(v) > 0))
        else {
            return;
        };
        let Some(mask) = self.iota_mask(&self.shape_of(i)) else {
            return;
        };
        let x = self.operand(i, 0);
        let fill = self.rng.pick(TL_MASK_FILL).to_string();
        let expr = if self.rng.chance(3, 4) {
            format!("select({mask}, {x}, {fill})")
        } else {
            format!("select({mask}, {fill}, {x})")
        };
        // Mostly followed by a softmax over the last axis, as in attention (`lower` takes a
        // mask only into a kernel that reduces it).
        if self.try_stmt(name, &expr) && self.rng.chance(2, 3) {
            let i = self.vals.len() - 1;
            let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
            self.softmax_of(i, &dim_ref(&t, t.rank() - 1));
        }
    }

    /// An `i1` mask over `shape` built from `iota` leaves (row `Dx1`, column `1xE`, with
    /// `i32` offsets): a causal, window or band mask, or a threshold on one index.
    fn iota_mask(&mut self, shape: &[Dim]) -> Option<String> {
        let rank = shape.len();
        let dims = Self::dims_text(shape);
        // The index of dimension `d`: a `1x…xDx…x1` iota.
        let index = |g: &mut Self, d: usize| {
            let s: Vec<String> = (0..rank)
                .map(|k| if k == d { dims[k].clone() } else { "1".into() })
                .collect();
            g.new_leaf("idx", &s, "i32", &format!("iota[{d}]"))
        };
        let a = self.rng.below(rank);
        let row = index(self, a)?;
        let other = if rank >= 2 && self.rng.chance(4, 5) {
            let mut b = self.rng.below(rank - 1);
            if b >= a {
                b += 1;
            }
            index(self, b)?
        } else {
            let c = self.rng.below(9) as i64 - 2;
            self.new_leaf("off", &[], "i32", &format!("constant {c}"))?
        };
        let cmp = *self.rng.pick(&[
            "less_equal",
            "less_equal",
            "less",
            "greater_equal",
            "greater",
            "equal",
            "not_equal",
        ]);
        let first = format!("{cmp}({other}, {row})");
        if !self.rng.chance(1, 3) {
            return Some(first);
        }
        // A window: the other index stays within a width of the row's.
        let w = 1 + self.rng.below(4);
        let width = self.new_leaf("w", &[], "i32", &format!("constant {w}"))?;
        let logic = *self.rng.pick(&["logical_and", "logical_or"]);
        Some(format!(
            "{logic}({first}, greater({other}, {row} - {width}))"
        ))
    }

    /// `matmul` of a value with a partner of the same rank whose rows match its columns: an
    /// existing value, one transposed with `transpose[1,0]`, or a new input; the lhs
    /// transposed sometimes.
    fn tensor_matmul(&mut self, name: &str) {
        let Some(i) = self.pick_val(|v| Self::float_tensor(v) && Self::rank(v) >= 2) else {
            return;
        };
        let a = tensor_of(&self.vals[i].ty).cloned().unwrap();
        let r = a.rank();
        let (lhs, k) = if r == 2 && self.rng.chance(1, 4) {
            (
                format!("transpose[1,0]({})", self.vals[i].name),
                a.shape[0].clone(),
            )
        } else {
            (self.operand(i, 0), a.shape[r - 1].clone())
        };
        let direct = self.pick_val(|v| {
            tensor_of(&v.ty)
                .is_some_and(|t| t.rank() == r && t.dtype.is_float() && t.shape[r - 2] == k)
        });
        let transposed = self.pick_val(|v| {
            tensor_of(&v.ty)
                .is_some_and(|t| r == 2 && t.rank() == 2 && t.dtype.is_float() && t.shape[1] == k)
        });
        let rhs = match (direct, transposed, self.rng.below(3)) {
            (Some(j), _, 0) => self.operand(j, 0),
            (_, Some(j), 1) => format!("transpose[1,0]({})", self.vals[j].name),
            _ => {
                let n = if self.rng.chance(1, 8) {
                    "1".to_string()
                } else {
                    self.rng.pick(&self.dims).clone()
                };
                // The lhs's batch dimensions, then K x N (or N x K, transposed).
                let mut shape = Self::dims_text(&a.shape[..r - 2]);
                let k = k.to_string();
                let swap = (0..r).map(|d| d.to_string()).collect::<Vec<_>>();
                let swap = [&swap[..r - 2], &[swap[r - 1].clone(), swap[r - 2].clone()]].concat();
                if self.rng.chance(1, 2) {
                    shape.extend([k, n]);
                    let Some(w) = self.new_input(&shape) else {
                        return;
                    };
                    w
                } else {
                    shape.extend([n, k]);
                    let Some(w) = self.new_input(&shape) else {
                        return;
                    };
                    format!("transpose[{}]({w})", swap.join(","))
                }
            }
        };
        self.try_stmt(name, &format!("matmul({lhs}, {rhs})"));
    }

    /// `broadcast` that expands the unit dimensions of a value (a `keep_dims` result, say)
    /// and sometimes adds a leading dimension.
    fn tensor_broadcast(&mut self, name: &str) {
        let Some(i) = self.pick_val(Self::float_tensor) else {
            return;
        };
        let mut dims = Self::dims_text(&self.shape_of(i));
        let mut changed = false;
        for d in dims.iter_mut() {
            if d == "1" && self.rng.chance(3, 4) {
                *d = self.rng.pick(&self.dims).clone();
                changed = true;
            }
        }
        if !changed || dims.len() < 3 && self.rng.chance(1, 3) {
            dims.insert(0, self.rng.pick(&self.dims).clone());
        }
        let x = self.operand(i, 0);
        self.try_stmt(name, &format!("broadcast[{}]({x})", dims.join("x")));
    }

    /// `fill`, `constant` (a scalar or a broadcast factor) or a new input.
    fn tensor_leaf(&mut self, name: &str) {
        let shape = match self.pick_val(Self::float_tensor) {
            Some(i) if self.rng.chance(2, 3) => Self::dims_text(&self.shape_of(i)),
            _ => {
                let rank = 1 + self.rng.below(2);
                self.random_shape(rank)
            }
        };
        let prefix = if shape.is_empty() {
            String::new()
        } else {
            format!("{}, ", shape.join("x"))
        };
        match self.rng.below(4) {
            0 => {
                let v = self.rng.pick(&["0.0", "1.5", "-2.0", "3", "-inf"]);
                self.try_leaf(name, &format!("tensor<{prefix}f32>"), &format!("fill[{v}]"));
            }
            1 => {
                let v = self.rng.pick(&["0.25", "-1.0", "2"]);
                let ty = if self.rng.chance(1, 2) {
                    "tensor<f32>".to_string()
                } else {
                    let ones = vec!["1"; shape.len().max(1)];
                    format!("tensor<{}, f32>", ones.join("x"))
                };
                self.try_leaf(name, &ty, &format!("constant {v}"));
            }
            _ => {
                self.new_input(&shape);
            }
        }
    }

    /// A float value of rank ≥ 1 and one of its dimensions (as printed), recent ones first.
    fn value_and_axis(&mut self) -> Option<(usize, String, usize)> {
        let i = self.pick_val(|v| Self::float_tensor(v) && Self::rank(v) > 0)?;
        let t = tensor_of(&self.vals[i].ty).cloned().unwrap();
        // The last dimension mostly, as attention and norms reduce it.
        let d = if self.rng.chance(2, 3) {
            t.rank() - 1
        } else {
            self.rng.below(t.rank())
        };
        Some((i, dim_ref(&t, d), d))
    }

    /// Softmax over one axis: max, subtract, exp, sum, divide (sometimes without the max).
    fn softmax(&mut self) {
        if let Some((i, d, _)) = self.value_and_axis() {
            self.softmax_of(i, &d);
        }
    }

    fn softmax_of(&mut self, i: usize, d: &str) {
        let x = self.vals[i].name.clone();
        let shifted = if self.rng.chance(4, 5) {
            let Some(m) = self.stmt("mx", &format!("reduce {x} axis={d} reducer=@max keep_dims"))
            else {
                return;
            };
            format!("{x} - {m}")
        } else {
            x
        };
        let Some(e) = self.stmt("e", &format!("exp({shifted})")) else {
            return;
        };
        let Some(s) = self.stmt(
            "sum",
            &format!("reduce {e} axis={d} reducer=@add keep_dims"),
        ) else {
            return;
        };
        if self.rng.chance(1, 5) {
            self.stmt("p", &format!("{e} * reciprocal({s})"));
        } else {
            self.stmt("p", &format!("{e} / {s}"));
        }
    }

    /// RMSNorm over one axis: `x * rsqrt(mean(x²) + ε)`, times a weight sometimes.
    fn rmsnorm(&mut self) {
        let Some((i, d, k)) = self.value_and_axis() else {
            return;
        };
        let x = self.vals[i].name.clone();
        let shape = Self::dims_text(&self.shape_of(i));
        let Some(ss) = self.stmt(
            "ss",
            &format!("reduce ({x} * {x}) axis={d} reducer=@add keep_dims"),
        ) else {
            return;
        };
        let Some(r) = self.stmt("rs", &format!("rsqrt({ss} * 0.125 + 1e-5)")) else {
            return;
        };
        let Some(y) = self.stmt("norm", &format!("{x} * {r}")) else {
            return;
        };
        if self.rng.chance(1, 2) {
            if let Some(w) = self.new_input(&shape[k..]) {
                self.stmt("scaled", &format!("{y} * {w}"));
            }
        }
    }

    /// Attention over new or existing `QxD`, `KxD`, `KxE` operands: scores, an optional
    /// causal or window mask, softmax over the keys, and the product with the values.
    fn attention(&mut self) {
        let q_dim = self.rng.pick(&self.dims).clone();
        let k_dim = self.rng.pick(&self.dims).clone();
        let d_dim = self.rng.pick(&self.dims).clone();
        let e_dim = self.rng.pick(&self.dims).clone();
        let Some(q) = self.new_input(&[q_dim, d_dim.clone()]) else {
            return;
        };
        let Some(k) = self.new_input(&[k_dim.clone(), d_dim]) else {
            return;
        };
        let Some(mut s) = self.stmt("score", &format!("matmul({q}, transpose[1,0]({k})) * 0.5"))
        else {
            return;
        };
        let shape = self
            .vals
            .last()
            .map(|v| tensor_of(&v.ty).unwrap().shape.clone());
        if self.rng.chance(2, 3) {
            let Some(mask) = self.iota_mask(&shape.unwrap_or_default()) else {
                return;
            };
            let fill = self.rng.pick(TL_MASK_FILL).to_string();
            let Some(m) = self.stmt("masked", &format!("select({mask}, {s}, {fill})")) else {
                return;
            };
            s = m;
        }
        let Some(mx) = self.stmt("mx", &format!("reduce {s} axis=1 reducer=@max keep_dims")) else {
            return;
        };
        let Some(e) = self.stmt("e", &format!("exp({s} - {mx})")) else {
            return;
        };
        let Some(v) = self.new_input(&[k_dim, e_dim]) else {
            return;
        };
        if self.rng.chance(1, 2) {
            // Normalise before the product, or after it (as FlashAttention does).
            let Some(sum) = self.stmt("sum", &format!("reduce {e} axis=1 reducer=@add keep_dims"))
            else {
                return;
            };
            self.stmt("attn", &format!("matmul({e} / {sum}, {v})"));
        } else {
            let Some(o) = self.stmt("o", &format!("matmul({e}, {v})")) else {
                return;
            };
            let Some(sum) = self.stmt("sum", &format!("reduce {e} axis=1 reducer=@add keep_dims"))
            else {
                return;
            };
            self.stmt("attn", &format!("{o} / {sum}"));
        }
    }
}
