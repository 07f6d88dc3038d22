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
//! [`NET_ELEMENTS`] elements (a size never drops below 2, or its own value when smaller);
//! parallel axes take `check`'s default extents (the largest divisor up to 4), so folded axes
//! still have several tiles. Inputs are random at unit scale and at scale 30, as `check` does.
//! The comparison is `check`'s (`interp::reference_error`): where the source's value is not
//! finite (it overflowed, or a softmax row was fully masked) any candidate value is accepted;
//! a `NaN` or infinity where the source is finite is a failure.

use crate::diag::{Diagnostic, Severity};
use crate::interp::{random_inputs, reference_error, Interpreter, Sizes, Value};
use crate::ir::{Function, Module, Type};
use rayon::prelude::*;
use std::time::Instant;

/// Most elements any value of the source may hold at the net's sizes.
pub const NET_ELEMENTS: u64 = 1 << 12;

/// Largest relative L2 error the net accepts (as `check`'s default `tol`).
pub const NET_TOLERANCE: f64 = 0.01;

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
    pub seconds: f64,
}

/// The source's dimension sizes, halved largest first until every value of the source fits
/// in [`NET_ELEMENTS`].
pub fn small_sizes(source: &Function) -> Vec<(String, u64)> {
    let mut sizes: Vec<(String, u64)> = source
        .bindings
        .iter()
        .filter(|b| crate::ir::is_dim_symbol(&b.name))
        .map(|b| (b.name.clone(), b.value))
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
    let floor = |original: u64| original.min(2);
    let originals: Vec<u64> = sizes.iter().map(|s| s.1).collect();
    // Each round halves one size: at most 64 rounds a symbol.
    for _ in 0..64 * sizes.len().max(1) {
        let lookup = |n: &str| sizes.iter().find(|(k, _)| k == n).map(|(_, v)| *v);
        let largest = shapes
            .iter()
            .filter_map(|t| {
                let mut count: u64 = 1;
                for d in &t.shape {
                    count = count.saturating_mul(d.eval(&lookup).ok()?);
                }
                Some((count, *t))
            })
            .max_by_key(|(count, _)| *count);
        let Some((count, t)) = largest else { break };
        if count <= NET_ELEMENTS {
            break;
        }
        // The largest symbol of the largest value that can still shrink.
        let symbols: Vec<String> = t
            .shape
            .iter()
            .filter_map(|d| match &d.base {
                crate::ir::DimBase::Sym(s) => Some(s.to_string()),
                _ => None,
            })
            .collect();
        let pick = sizes
            .iter()
            .enumerate()
            .filter(|(i, (k, v))| symbols.contains(k) && *v > floor(originals[*i]))
            .max_by_key(|(_, (_, v))| *v)
            .map(|(i, _)| i);
        let Some(i) = pick else { break };
        sizes[i].1 = (sizes[i].1 / 2).max(floor(originals[i]));
    }
    sizes.sort();
    sizes
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

/// The source's inputs and results at one input scale.
type SourceRun = (Vec<Value>, Vec<Value>);

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
        let made: Result<Vec<SourceRun>, String> = NET_SCALES
            .iter()
            .map(|&scale| {
                let inputs =
                    random_inputs(source, &sizes, seed, scale).map_err(|e| e.to_string())?;
                let want = Interpreter::new(module, sizes.clone())
                    .run(source, &inputs)
                    .map_err(|e| e.to_string())?;
                Ok((inputs, want))
            })
            .collect();
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
    let wrong: Vec<Option<(usize, String)>> = candidates
        .par_iter()
        .enumerate()
        .map(|(i, f)| {
            let sizes = at_sizes(f, &report.sizes);
            let interp = Interpreter::new(module, sizes);
            for (k, (inputs, want)) in runs.iter().enumerate() {
                let verdict = interp
                    .run(f, inputs)
                    .map_err(|e| format!("does not run: {e}"))
                    .and_then(|got| compare(&got, want));
                match verdict {
                    Ok(e) if e <= NET_TOLERANCE => {}
                    Ok(e) => {
                        return Some((
                            i,
                            format!(
                                "relative L2 error {e:.3e} > {NET_TOLERANCE} at input scale {}",
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
