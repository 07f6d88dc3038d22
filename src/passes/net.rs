//! The net under every candidate: `extract` runs each candidate it outputs against the
//! function it was extracted from, in the reference interpreter, and drops one that computes
//! something else.
//!
//! Every rewrite is meant to be sound and every synthesised repair is verified
//! (`egraph::rules::repair`), so a candidate that fails here is a bug in efopt: the warning
//! says so, names the generated reducers (and their repairs) the candidate uses, and the test
//! suites run with `EFOPT_WRONG_CANDIDATES=error`, which turns the warning into an error.
//!
//! To be cheap enough to run by default the comparison runs at *small sizes*: the source's
//! dimension sizes are halved, largest first, until no value of the source holds more than
//! [`NET_ELEMENTS`] elements (a size never drops below 2, or its own value when smaller, and
//! an axis whose indices are compared with a constant, a sliding window's width, stays past
//! it: [`index_floors`]);
//! parallel axes take `check`'s default extents (the largest divisor up to 4), so folded axes
//! still have several tiles. Inputs are random at unit scale and at scale 30, as `check` does.
//! The comparison is `check`'s (`interp::reference_error`): where the source's value is not
//! finite (it overflowed, or a softmax row was fully masked) any candidate value is accepted;
//! a `NaN` or infinity where the source is finite is a failure; and at scale 30 nothing is
//! compared when the source has more non-finite results there, or at scale 60, than at unit
//! scale (it overflows, or has no headroom: which order its terms ran in decides its values).
//! The tolerance is `check`'s too: at least 0.01, widened to 16 times how far the source's
//! own results move when its inputs move by 2^-20 (`check::CONDITIONING_FACTOR`), so that a
//! candidate that only rounds differently on an ill-conditioned source (a softmax of scores
//! of 1e5: products of products of scale-30 inputs) is not taken for a wrong one.

use crate::diag::{Diagnostic, Severity};
use crate::egraph::rules::Rule;
use crate::egraph::runner::Runner;
use crate::egraph::TypedEGraph;
use crate::interp::{random_inputs, reference_error, Interpreter, Sizes, Value};
use crate::ir::{Function, Module, ReducerDef, Type};
use crate::passes::check::{
    non_finite, overflows, perturbed, results_error, tolerance, tolerance_text,
};
use rayon::prelude::*;
use std::time::{Duration, Instant};

/// Most elements any value of the source may hold at the net's sizes.
pub const NET_ELEMENTS: u64 = 1 << 12;

/// Largest relative L2 error the net accepts (as `check`'s default `tol`).
pub const NET_TOLERANCE: f64 = 0.01;

/// Largest size the net keeps an axis at for a constant its indices are compared with
/// ([`index_floors`]): a window of thousands would make the net's values millions of
/// elements. Past it the net says what it could not see (`NetReport::caveat`).
pub const NET_INDEX_FLOOR_MAX: u64 = 1024;

/// Input scales the net compares at: unit, and large values where an overflowing form shows.
pub const NET_SCALES: [f32; 2] = [1.0, 30.0];

/// What the net found on one e-graph's candidates.
#[derive(Debug, Default)]
pub struct NetReport {
    /// Candidates compared with the source.
    pub checked: usize,
    /// Indices (into the candidates) of those that differ, with why.
    pub wrong: Vec<(usize, String)>,
    /// Why nothing was compared, when nothing was.
    pub skipped: Option<String>,
    /// The sizes the comparison ran at, `NAME=N` sorted by name.
    pub sizes: Vec<(String, u64)>,
    /// What the comparison could not see at those sizes: an axis kept below a constant its
    /// indices are compared with ([`NET_INDEX_FLOOR_MAX`]).
    pub caveat: Option<String>,
    pub seconds: f64,
}

/// The source's dimension sizes, halved largest first until every value of the source fits
/// in [`NET_ELEMENTS`]. Only sizes bound to a number are halved; a derived size (`HD = NH*D`)
/// follows its factors, and a halving that would make one non-positive is not made.
pub fn small_sizes(source: &Function) -> Vec<(String, u64)> {
    let mut work: Vec<crate::ir::Binding> = source
        .bindings
        .iter()
        .filter(|b| crate::ir::is_dim_symbol(&b.name))
        .cloned()
        .collect();
    let shapes: Vec<&crate::ir::TensorType> = source
        .body
        .nodes
        .iter()
        .filter_map(|n| match n.ty.as_ref() {
            Some(Type::Tensor(t)) => Some(t),
            _ => None,
        })
        .collect();
    let floors = index_floors(source);
    let floor_of: Vec<u64> = work
        .iter()
        .map(|b| {
            let kept = floors
                .iter()
                .find(|(s, _, _)| *s == b.name)
                .map_or(2, |(_, f, _)| (*f).clamp(2, NET_INDEX_FLOOR_MAX));
            b.value.min(kept)
        })
        .collect();
    // (smaller, larger) index pairs into `work` a slice keeps apart ([`slice_orders`]).
    let orders: Vec<(usize, usize)> = slice_orders(source)
        .into_iter()
        .filter_map(|(lo, hi)| {
            let i = work.iter().position(|b| b.name == lo)?;
            let j = work.iter().position(|b| b.name == hi)?;
            (work[i].value < work[j].value).then_some((i, j))
        })
        .collect();
    let mut stuck = vec![false; work.len()];
    // Half of size `i`, no less than its floor, and at least twice every size a slice keeps
    // below it: a slice that drops a sliver (64 of 32,064 columns) moves a sum by less than
    // the tolerance, one that drops half does not.
    let halved = |work: &[crate::ir::Binding], i: usize| -> u64 {
        let above = orders
            .iter()
            .filter(|(_, hi)| *hi == i)
            .map(|(lo, _)| work[*lo].value.saturating_mul(2))
            .max()
            .unwrap_or(0);
        (work[i].value / 2).max(floor_of[i]).max(above)
    };
    // Each round halves one size: at most 64 rounds a symbol.
    for _ in 0..64 * work.len().max(1) {
        let lookup = |n: &str| work.iter().find(|b| b.name == n).map(|b| b.value);
        // The values still over the budget, largest first.
        let mut over: Vec<(u64, &crate::ir::TensorType)> = shapes
            .iter()
            .filter_map(|t| {
                let mut count: u64 = 1;
                for d in &t.shape {
                    count = count.saturating_mul(d.eval(&lookup).ok()?);
                }
                (count > NET_ELEMENTS).then_some((count, *t))
            })
            .collect();
        over.sort_by_key(|o| std::cmp::Reverse(o.0));
        // The largest base symbol that can still shrink of the largest such value (of the
        // next, when every symbol of that one is at its floor).
        let pick = over.iter().find_map(|(_, t)| {
            let mut symbols: Vec<String> = Vec::new();
            for d in &t.shape {
                if let crate::ir::DimBase::Sym(s) = &d.base {
                    crate::ir::sizes::base_symbols(&work, s, &mut symbols);
                }
            }
            // A size a slice keeps below one of these holds it up: it may shrink first.
            for (lo, hi) in &orders {
                if symbols.contains(&work[*hi].name) && !symbols.contains(&work[*lo].name) {
                    symbols.push(work[*lo].name.clone());
                }
            }
            work.iter()
                .enumerate()
                .filter(|(i, b)| {
                    b.def.is_none()
                        && !stuck[*i]
                        && symbols.contains(&b.name)
                        && halved(&work, *i) < b.value
                })
                .max_by_key(|(_, b)| b.value)
                .map(|(i, _)| i)
        });
        let Some(i) = pick else { break };
        let before = work[i].value;
        work[i].value = halved(&work, i);
        if crate::ir::sizes::resolve_bindings(&mut work).is_err() {
            work[i].value = before;
            stuck[i] = true;
            let _ = crate::ir::sizes::resolve_bindings(&mut work);
        }
    }
    let mut sizes: Vec<(String, u64)> = work.into_iter().map(|b| (b.name, b.value)).collect();
    sizes.sort();
    sizes
}

/// Sizes the net must not shrink an axis below. Where an index (`iota`) is compared with a
/// constant (a sliding window `col > row - 256`, a length `col < 77`, a clamp of a relative
/// position), the axis keeps half as many indices again as the constant at the net's sizes:
/// at smaller sizes every index falls on one side, and a candidate that dropped the
/// comparison would compute the same values there as its source.
/// Each entry: the axis's base symbol, its floor, and the constant that set it.
fn index_floors(source: &Function) -> Vec<(String, u64, u64)> {
    use crate::ir::{BinaryOp as B, DimBase, ExprKind as E};
    let nodes = &source.body.nodes;
    // The axes (base symbols) of the iotas each node is computed from.
    let mut axes: Vec<Vec<String>> = vec![Vec::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        let mut own = Vec::new();
        if let (E::Iota(d), Some(Type::Tensor(t))) = (&n.kind, n.ty.as_ref()) {
            if let Ok(k) = crate::ir::resolve_dim(&t.shape, d) {
                if let DimBase::Sym(s) = &t.shape[k].base {
                    crate::ir::sizes::base_symbols(&source.bindings, s, &mut own);
                }
            }
        }
        for o in n.kind.operands() {
            for s in axes.get(o.index()).into_iter().flatten() {
                if !own.contains(s) {
                    own.push(s.clone());
                }
            }
        }
        axes[i] = own;
    }
    // The largest whole constant an operand is computed from by pointwise steps.
    let largest_constant = |root: crate::ir::NodeId| -> u64 {
        let (mut stack, mut largest) = (vec![root], 0u64);
        while let Some(id) = stack.pop() {
            let Some(n) = nodes.get(id.index()) else {
                continue;
            };
            match &n.kind {
                E::Constant(v) | E::Fill(v) if v.is_finite() && v.fract() == 0.0 => {
                    largest = largest.max(v.abs().min(u64::MAX as f64 / 4.0) as u64)
                }
                E::Unary(..)
                | E::Binary(..)
                | E::Cast(..)
                | E::Broadcast(..)
                | E::Transpose(..)
                | E::Reshape(..)
                | E::Select(..) => stack.extend(n.kind.operands()),
                _ => {}
            }
        }
        largest
    };
    let mut floors: Vec<(String, u64, u64)> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let E::Binary(op, a, b) = &n.kind else {
            continue;
        };
        let compares = matches!(
            op,
            B::Less
                | B::LessEqual
                | B::Greater
                | B::GreaterEqual
                | B::Equal
                | B::NotEqual
                | B::Maximum
                | B::Minimum
        );
        if !compares || axes[i].is_empty() {
            continue;
        }
        let c = largest_constant(*a).max(largest_constant(*b));
        if c < 2 {
            continue;
        }
        // Past the constant by half of it again, a multiple of 8 so that axes still tile.
        let floor = (c.saturating_add(c / 2).saturating_add(2))
            .div_ceil(8)
            .saturating_mul(8);
        for s in &axes[i] {
            match floors.iter_mut().find(|(k, _, _)| k == s) {
                Some((_, f, k)) if *f < floor => (*f, *k) = (floor, c),
                Some(_) => {}
                None => floors.push((s.clone(), floor, c)),
            }
        }
    }
    floors
}

/// The axes `sizes` keeps below what [`index_floors`] asks (capped at
/// [`NET_INDEX_FLOOR_MAX`]), said as a caveat: there, a candidate that dropped a comparison of
/// indices with a constant may compute the same values as its source.
fn index_caveat(source: &Function, sizes: &[(String, u64)]) -> Option<String> {
    let short: Vec<String> = index_floors(source)
        .into_iter()
        .filter_map(|(s, floor, c)| {
            let (_, at) = sizes.iter().find(|(k, _)| *k == s)?;
            let original = source.bindings.iter().find(|b| b.name == s)?.value;
            (*at < floor && *at < original).then(|| {
                format!("{s}={at} is not past {c}, a constant its indices are compared with")
            })
        })
        .collect();
    (!short.is_empty()).then(|| short.join("; "))
}

/// Pairs of size symbols `(lo, hi)` a slice relates: `slice[d, 0, V](x)` of an axis of size
/// `VP` reads part of it while V < VP. Halved independently both could meet (32000 and 32064
/// both become 62), and at such sizes a candidate that read the whole axis would compute the
/// same values as its source; the net keeps each `hi` at twice its `lo` or more.
fn slice_orders(source: &Function) -> Vec<(String, String)> {
    use crate::ir::{DimBase, ExprKind as E};
    let nodes = &source.body.nodes;
    let mut pairs = Vec::new();
    for n in nodes {
        let E::Slice(d, start, end, x) = &n.kind else {
            continue;
        };
        let Some(Type::Tensor(t)) = nodes.get(x.index()).and_then(|m| m.ty.as_ref()) else {
            continue;
        };
        let Ok(k) = crate::ir::resolve_dim(&t.shape, d) else {
            continue;
        };
        let sym = |dim: &crate::ir::Dim| match &dim.base {
            DimBase::Sym(s) if dim.splits.is_empty() => Some(s.to_string()),
            _ => None,
        };
        let axis = sym(&t.shape[k]);
        let (a, b) = (sym(start), sym(end));
        // start < end, end < the axis (the caller keeps only pairs ordered so in the source).
        for (lo, hi) in [(a.clone(), b.clone()), (b, axis.clone()), (a, axis)] {
            if let (Some(lo), Some(hi)) = (lo, hi) {
                if lo != hi && !pairs.contains(&(lo.clone(), hi.clone())) {
                    pairs.push((lo, hi));
                }
            }
        }
    }
    pairs
}

/// `f` with its dimension bindings set to `sizes` (the others kept).
fn at_sizes(f: &Function, sizes: &[(String, u64)]) -> Sizes {
    let mut f = f.clone();
    for b in f.bindings.iter_mut() {
        if let Some((_, v)) = sizes.iter().find(|(k, _)| *k == b.name) {
            b.value = *v;
        }
    }
    Sizes::for_function(&f, 4)
}

/// The largest error over the results of one run, or why the candidate did not run.
fn compare(got: &[Value], want: &[Value]) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!(
            "returns {} results, the source {}",
            got.len(),
            want.len()
        ));
    }
    let mut worst = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        let (gl, wl) = (g.leaves(), w.leaves());
        if gl.len() != wl.len() {
            return Err("its results are shaped unlike the source's".into());
        }
        for ((_, a), (_, b)) in gl.iter().zip(&wl) {
            worst = worst.max(reference_error(a, b));
        }
    }
    Ok(worst)
}

/// The source's inputs and results at one input scale, and how far its results move when
/// its inputs move by a few ulps (`check::PERTURBATION`).
type SourceRun = (Vec<Value>, Vec<Value>, f64);

/// Runs every candidate of `candidates` (functions of `module`, which holds their reducers)
/// against `source` at small sizes.
pub fn check_candidates(
    module: &Module,
    source: &Function,
    candidates: &[Function],
    seed: u64,
) -> NetReport {
    let start = Instant::now();
    let mut report = NetReport {
        sizes: small_sizes(source),
        ..NetReport::default()
    };
    // The source's runs, one per input scale; a source that does not run at the small sizes
    // (sizes tied together in a way halving breaks) runs at its own.
    let mut runs = Vec::new();
    for attempt in [report.sizes.clone(), Vec::new()] {
        let sizes = at_sizes(source, &attempt);
        let run_at = |scale: f32| -> Result<SourceRun, String> {
            let inputs = random_inputs(source, &sizes, seed, scale).map_err(|e| e.to_string())?;
            let interp = Interpreter::new(module, sizes.clone());
            let want = interp.run(source, &inputs).map_err(|e| e.to_string())?;
            let moved = interp
                .run(source, &perturbed(&inputs, seed))
                .map_err(|e| e.to_string())?;
            let sensitivity = results_error(&moved, &want);
            Ok((inputs, want, sensitivity))
        };
        // As `check`: a source that overflows at a larger scale, or at twice it, is no
        // reference there (an empty run: nothing is compared).
        let made = || -> Result<Vec<SourceRun>, String> {
            let unit = run_at(NET_SCALES[0])?;
            let unit_non_finite = non_finite(&unit.1);
            let mut made = vec![unit];
            for &scale in &NET_SCALES[1..] {
                let run = run_at(scale)?;
                let doubled = run_at(2.0 * scale)?;
                let counts = [non_finite(&run.1), non_finite(&doubled.1)];
                made.push(if overflows(&counts, unit_non_finite) {
                    (Vec::new(), Vec::new(), 0.0)
                } else {
                    run
                });
            }
            Ok(made)
        };
        let made = made();
        match made {
            Ok(r) => {
                runs = r;
                if attempt.is_empty() {
                    report.sizes = source
                        .bindings
                        .iter()
                        .filter(|b| crate::ir::is_dim_symbol(&b.name))
                        .map(|b| (b.name.clone(), b.value))
                        .collect();
                    report.sizes.sort();
                }
                break;
            }
            Err(why) if attempt.is_empty() => {
                report.skipped = Some(format!("the source does not run: {why}"));
            }
            Err(_) => {}
        }
    }
    if report.skipped.is_some() {
        report.seconds = start.elapsed().as_secs_f64();
        return report;
    }
    report.caveat = index_caveat(source, &report.sizes);
    let wrong: Vec<Option<(usize, String)>> = candidates
        .par_iter()
        .enumerate()
        .map(|(i, f)| {
            // A candidate that does not type is no program (the verifier after `extract`
            // would stop the pipeline on it): wrong, named as such.
            let env = crate::verify::typing::TypeEnv::for_bindings(&module.reducers, &f.bindings);
            if let Err((_, e)) = crate::verify::typing::type_body(&f.body, &[], &env) {
                return Some((i, format!("does not verify: {}", e.message)));
            }
            let sizes = at_sizes(f, &report.sizes);
            let interp = Interpreter::new(module, sizes);
            for (k, (inputs, want, sensitivity)) in runs.iter().enumerate() {
                if want.is_empty() {
                    continue;
                }
                let verdict = interp
                    .run(f, inputs)
                    .map_err(|e| format!("does not run: {e}"))
                    .and_then(|got| compare(&got, want));
                // An ill-conditioned source moves past the tolerance under rounding alone.
                let tol = tolerance(NET_TOLERANCE, *sensitivity);
                match verdict {
                    Ok(e) if e <= tol => {}
                    Ok(e) => {
                        return Some((
                            i,
                            format!(
                                "relative L2 error {e:.3e} > {} at input scale {}",
                                tolerance_text(tol, NET_TOLERANCE),
                                NET_SCALES[k]
                            ),
                        ))
                    }
                    Err(why) => return Some((i, why)),
                }
            }
            None
        })
        .collect();
    report.checked = candidates.len();
    report.wrong = wrong.into_iter().flatten().collect();
    report.seconds = start.elapsed().as_secs_f64();
    report
}

/// What the net's warnings become: `EFOPT_WRONG_CANDIDATES=error` (the test suites) makes
/// them errors, so that a wrong candidate fails a test instead of scrolling past.
pub fn wrong_candidate_severity() -> Severity {
    match std::env::var("EFOPT_WRONG_CANDIDATES").as_deref() {
        Ok("error") => Severity::Error,
        _ => Severity::Warning,
    }
}

/// The generated reducers `f` calls, each with what made it.
pub fn generated_reducers(module: &Module, f: &Function) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for n in &f.body.nodes {
        if let crate::ir::ExprKind::Reduce {
            reducer: crate::ir::ReducerRef::User(name),
            ..
        } = &n.kind
        {
            let name = name.to_string();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
        .into_iter()
        .filter_map(|name| {
            let def = module.reducer(&name)?;
            crate::egraph::rules::describe_generated(def).map(|what| format!("@{name} ({what})"))
        })
        .collect()
}

/// The remark for a net that could not see a comparison of indices with a constant.
pub fn caveat_remark(graph: &str, caveat: &str) -> Diagnostic {
    let mut d = Diagnostic::global(
        Severity::Remark,
        format!("extract @{graph}: the net's small sizes cannot tell a candidate that dropped such a comparison: {caveat}"),
    );
    d.help =
        Some("`check` after `extract` compares the candidates at the program's own sizes".into());
    d
}

/// The warning (or error) for wrong candidate `f`.
pub fn wrong_candidate(module: &Module, graph: &str, f: &Function, why: &str) -> Diagnostic {
    let used = generated_reducers(module, f);
    let origin = if used.is_empty() {
        "it uses no generated reducer, so an equality rule is unsound here: add this program to \
         tests/rule_soundness.rs's instances to find which"
            .to_string()
    } else {
        format!("it uses {}", used.join(", "))
    };
    let mut d = Diagnostic::global(
        wrong_candidate_severity(),
        format!(
            "extract @{graph}: wrong candidate `{}` dropped: it differs from the source ({why}); {origin}",
            f.name
        ),
    );
    d.help = Some(
        "this is a bug in efopt: every candidate should compute its source; please report it \
         with this program"
            .into(),
    );
    d
}

/// Which equality rules a wrong candidate needs, found by saturating its source again
/// without each rule in turn: a rule without which efopt no longer derives the candidate is
/// one it used, and the unsound one is among those (unless the candidate came from an
/// e-graph efopt's rules do not make from this source, an edited or older dump).
#[derive(Debug, PartialEq)]
pub enum Diagnosis {
    /// The rules (in table order) without any one of which the candidate is not derived.
    Needs(Vec<&'static str>),
    /// Saturating the source with every rule does not derive the candidate.
    NotDerived,
    /// The time budget ran out (or a saturation failed) before every rule was tried.
    Unknown(String),
}

/// Saturates `source` with `rules` less `left_out` (at most `limit` seconds) and asks whether
/// the result holds `candidate`.
fn derives(
    source: &Function,
    reducers: &[ReducerDef],
    candidate: &Function,
    candidate_reducers: &[ReducerDef],
    rules: &[&'static Rule],
    left_out: Option<&'static str>,
    limit: Duration,
) -> Result<bool, String> {
    let mut g = TypedEGraph::from_function(source, reducers)?;
    let kept: Vec<&'static Rule> = rules
        .iter()
        .copied()
        .filter(|r| Some(r.name) != left_out)
        .collect();
    let report = Runner::default().with_time_limit(limit).run(&mut g, &kept);
    if matches!(report.stop, crate::egraph::runner::StopReason::TimeLimit(_)) {
        return Err("saturation reached its time limit".into());
    }
    let graph_reducers = g.egraph.analysis.env.reducers().to_vec();
    Ok(crate::passes::expect_contains::represents(
        &g,
        &graph_reducers,
        candidate,
        candidate_reducers,
    )?
    .is_some())
}

/// The rules wrong candidate `candidate` (of a module with reducers `candidate_reducers`)
/// needs, from `rules` (efopt's: `egraph::rules::all_rules()`), within `budget`.
pub fn diagnose(
    source: &Function,
    reducers: &[ReducerDef],
    candidate: &Function,
    candidate_reducers: &[ReducerDef],
    rules: &[&'static Rule],
    budget: Duration,
) -> Diagnosis {
    let start = Instant::now();
    let left = |start: Instant| budget.saturating_sub(start.elapsed());
    let run = |left_out, limit| {
        derives(
            source,
            reducers,
            candidate,
            candidate_reducers,
            rules,
            left_out,
            limit,
        )
    };
    match run(None, left(start)) {
        Ok(true) => {}
        Ok(false) => return Diagnosis::NotDerived,
        Err(why) => return Diagnosis::Unknown(why),
    }
    let mut needed = Vec::new();
    for r in rules {
        if start.elapsed() >= budget {
            return Diagnosis::Unknown(format!(
                "the {:.0} s budget ran out at rule `{}`",
                budget.as_secs_f64(),
                r.name
            ));
        }
        match run(Some(r.name), left(start)) {
            Ok(true) => {}
            Ok(false) => needed.push(r.name),
            Err(why) => return Diagnosis::Unknown(why),
        }
    }
    Diagnosis::Needs(needed)
}

/// The note a diagnosis adds to its wrong candidate's warning.
pub fn diagnosis_note(d: &Diagnosis) -> String {
    match d {
        Diagnosis::Needs(rules) if rules.is_empty() => "efopt derives it from the source with any one rule left out (several rules derive it, one of them unsound)".into(),
        Diagnosis::Needs(rules) => format!(
            "efopt derives it from the source with the rules {}, and without any one of them it does not: one of them is unsound here",
            rules.iter().map(|r| format!("`{r}`")).collect::<Vec<_>>().join(", ")
        ),
        Diagnosis::NotDerived => "efopt's rules do not derive it from the source: its e-graph was edited, or saved by another efopt".into(),
        Diagnosis::Unknown(why) => format!("which rules it needs is unknown: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egraph::rules::{all_rules, cls, Family, Out, Reach, Root};
    use crate::egraph::{ENode, Op};
    use crate::ir::UnaryOp;

    /// An unsound rule, `exp(x) = x`, for the diagnosis to find.
    fn exp_is_identity(_: &crate::egraph::graph::EGraph, _: egg::Id, n: &ENode, out: &mut Out) {
        if n.op == Op::Unary(UnaryOp::Exp) {
            out.push(cls(n.children[0]));
        }
    }

    static UNSOUND: Rule = Rule {
        name: "exp-is-identity",
        family: Family::Algebraic,
        equation: "exp(x) = x  (unsound)",
        root: Root::Pointwise,
        find: exp_is_identity,
        reach: Reach::Own,
    };

    fn function(text: &str) -> Module {
        let mut m = crate::parse::parse_module(text, 0).expect("parses");
        crate::verify::verify_module(&mut m).expect("verifies");
        m
    }

    /// A candidate that does not type (an operand on a parallel axis the other lacks) is
    /// wrong, named as such, before anything runs it.
    #[test]
    fn a_candidate_that_does_not_type_is_wrong() {
        let source = function(
            "func f where M = 8, K = 16 {\n  x: tensor<MxK, f32> = input\n  y: tensor<MxK, f32> = input\n  return x + y\n}\n",
        );
        let mut bad = function(
            "func f where M = 8, K = 16 {\n  x: tensor<MxK, f32> = input\n  y: tensor<MxK, f32> = input\n  return combination[0,m](partition[0,m](x) + partition[0,m](y))\n}\n",
        )
        .funcs
        .remove(0);
        // Point the sum's second operand at `y` itself: untiled beside a tile on `m`.
        let sum = bad
            .body
            .ids()
            .find(|id| matches!(bad.body.node(*id).kind, crate::ir::ExprKind::Binary(..)))
            .expect("a sum");
        let y = bad.body.params[1];
        let crate::ir::ExprKind::Binary(op, a, _) = bad.body.node(sum).kind.clone() else {
            unreachable!()
        };
        bad.body.nodes[sum.index()].kind = crate::ir::ExprKind::Binary(op, a, y);
        let report = check_candidates(&Module::default(), &source.funcs[0], &[bad], 1);
        assert_eq!(report.checked, 1);
        assert_eq!(report.wrong.len(), 1, "{:?}", report.wrong);
        assert!(
            report.wrong[0].1.starts_with("does not verify:"),
            "{:?}",
            report.wrong
        );
    }

    #[test]
    fn the_diagnosis_names_the_unsound_rule_a_wrong_candidate_needs() {
        let source = function(
            "func f where M = 8, K = 16 {\n  x: tensor<MxK, f32> = input\n  return reduce (exp(x)) axis=K reducer=@add\n}\n",
        );
        let wrong = function(
            "func f where M = 8, K = 16 {\n  x: tensor<MxK, f32> = input\n  return reduce x axis=K reducer=@add\n}\n",
        );
        let mut rules = vec![&UNSOUND];
        rules.extend(all_rules());
        let budget = Duration::from_secs(60);
        let (f, c) = (&source.funcs[0], &wrong.funcs[0]);
        assert_eq!(
            diagnose(f, &[], c, &[], &rules, budget),
            Diagnosis::Needs(vec!["exp-is-identity"])
        );
        // efopt's own rules do not derive it.
        assert_eq!(
            diagnose(f, &[], c, &[], &all_rules(), budget),
            Diagnosis::NotDerived
        );
        // And a wrong candidate the net finds is one: it differs from its source.
        let module = Module::default();
        let report = check_candidates(&module, f, std::slice::from_ref(c), 1);
        assert_eq!(report.wrong.len(), 1, "{report:?}");
    }

    /// Causal attention in a sliding window of `WINDOW` keys; `windowed = false` drops the
    /// window term (a candidate that lost it).
    fn window_attention(windowed: bool) -> Module {
        let visible = if windowed {
            "logical_and(less_equal(col, row), greater(col, row - width))"
        } else {
            "less_equal(col, row)"
        };
        function(&format!(
            "func f where NH = 8, T = 1024, D = 128 {{
  q: tensor<NHxTxD, f32> = input
  k: tensor<NHxTxD, f32> = input
  v: tensor<NHxTxD, f32> = input
  row: tensor<Tx1, i32> = iota[0]
  col: tensor<1xT, i32> = iota[1]
  width: tensor<i32> = constant 256
  s = matmul(q, transpose[0,2,1](k)) * 0.0625
  masked = select({visible}, s, -inf)
  m = reduce masked axis=2 reducer=@max keep_dims
  w = exp(masked - m)
  return matmul(w / reduce w axis=2 reducer=@add keep_dims, v)
}}
"
        ))
    }

    #[test]
    fn the_net_sees_a_dropped_window_term() {
        let (source, wrong) = (window_attention(true), window_attention(false));
        let sizes = small_sizes(&source.funcs[0]);
        let t = sizes.iter().find(|(k, _)| k == "T").map(|(_, v)| *v);
        assert!(t.is_some_and(|t| t > 256 && t < 1024), "{sizes:?}");
        let report = check_candidates(
            &Module::default(),
            &source.funcs[0],
            std::slice::from_ref(&wrong.funcs[0]),
            1,
        );
        assert_eq!(report.wrong.len(), 1, "{report:?}");
        // The windowed program itself passes.
        let report = check_candidates(
            &Module::default(),
            &source.funcs[0],
            std::slice::from_ref(&source.funcs[0]),
            1,
        );
        assert!(report.wrong.is_empty(), "{report:?}");
        // A window wider than the axis needs no floor past the axis.
        let narrow = small_sizes(&function(
            "func f where T = 64 {\n  row: tensor<Tx1, i32> = iota[0]\n  col: tensor<1xT, i32> = iota[1]\n  w: tensor<i32> = constant 256\n  return greater(col, row - w)\n}\n",
        ).funcs[0]);
        assert_eq!(narrow, [("T".to_string(), 64)]);
    }

    #[test]
    fn the_net_sees_a_dropped_slice() {
        let program = |read: &str| {
            function(&format!(
                "func f where N = 512, VP = 32064, V = 32000 {{\n  x: tensor<NxVP, f32> = input\n  return reduce ({read}) axis=1 reducer=@add\n}}\n"
            ))
        };
        let (source, wrong) = (program("slice[1, 0, V](x)"), program("x"));
        let sizes = small_sizes(&source.funcs[0]);
        let size = |k: &str| sizes.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert!(size("V") < size("VP"), "{sizes:?}");
        // Still within the net's budget.
        let n_vp = size("N").zip(size("VP")).map(|(n, vp)| n * vp);
        assert!(n_vp.is_some_and(|e| e <= NET_ELEMENTS), "{sizes:?}");
        let report = check_candidates(
            &Module::default(),
            &source.funcs[0],
            std::slice::from_ref(&wrong.funcs[0]),
            1,
        );
        assert_eq!(report.wrong.len(), 1, "{report:?}");
    }

    #[test]
    fn small_sizes_halve_the_largest_first_down_to_the_budget() {
        let m = function(
            "func f where B = 16, K = 4096, D = 128 {\n  x: tensor<BxKxD, f32> = input\n  return reduce x axis=K reducer=@add\n}\n",
        );
        let sizes = small_sizes(&m.funcs[0]);
        let product: u64 = sizes.iter().map(|(_, v)| v).product();
        assert!(product <= NET_ELEMENTS, "{sizes:?}");
        assert!(sizes.iter().all(|(_, v)| *v >= 2), "{sizes:?}");
        assert_eq!(
            sizes.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["B", "D", "K"]
        );
    }
}
