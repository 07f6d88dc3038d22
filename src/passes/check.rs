//! `check` compares every function with a reference program on the same seeded random inputs,
//! at unit and at large input scale. Also what `triton-check` and the net under `extract`
//! share with it: the fixed-seed sample, and when a reference overflows.

use super::interpret::{run_function, SizeOptions, EXTENTS_HELP, MAX_EXTENT_HELP, SEED_HELP};
use super::options::{pass_options, OptionKind, OptionSpans};
use super::{NamedPass, Pass, PassContext};
use crate::diag::{Diagnostic, Severity};
use crate::interp::{random_inputs, reference_error, Sizes, Value};
use crate::ir::{Function, Module, Type};
use rayon::prelude::*;

/// Indices of a fixed-seed sample of `sample` out of `n` functions, in order (all of them
/// when `sample` is 0 or at least `n`): a partial Fisher–Yates shuffle.
pub fn sample_indices(n: usize, sample: usize, seed: u64) -> Vec<usize> {
    let mut chosen: Vec<usize> = (0..n).collect();
    if sample > 0 && n > sample {
        let mut rng = crate::interp::Rng::new(seed ^ 0x5eed);
        for i in 0..sample {
            let j = i + rng.below((n - i) as u64) as usize;
            chosen.swap(i, j);
        }
        chosen.truncate(sample);
        chosen.sort();
    }
    chosen
}

/// The help of `tol=X`, shared by the passes that compare functions with a reference.
pub(crate) const TOL_HELP: &str = "largest accepted relative L2 error";

#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// `against`: the reference program file; unset, the program the pipeline started from.
    pub against: Option<String>,
    /// `sample`: how many functions are compared, a fixed-seed sample when there are more, as
    /// after `extract` (0: all).
    pub sample: usize,
    /// `tol`: the largest accepted relative L2 error.
    pub tol: f64,
    /// `scale`: standard deviation of the random float inputs.
    pub scale: f32,
    /// `large-scale`: every function is also compared on inputs of this standard deviation
    /// (0: off).
    pub large_scale: f32,
    pub sizes: SizeOptions,
}

impl Default for CheckOptions {
    fn default() -> CheckOptions {
        CheckOptions {
            against: None,
            sample: 100,
            tol: 0.01,
            scale: 1.0,
            large_scale: 30.0,
            sizes: SizeOptions::default(),
        }
    }
}

pass_options!(CheckOptions {
    "against" => against: OptionKind::Path,
        "reference program file (default: the program the pipeline started from)";
    "sample" => sample: OptionKind::Int,
        "check a fixed-seed sample of this many functions when there are more, as after `extract` (0: check all)";
    "tol" => tol: OptionKind::Float, TOL_HELP;
    "scale" => scale: OptionKind::Float,
        "standard deviation of the random float inputs (large values probe numerical robustness)";
    "large-scale" => large_scale: OptionKind::Float,
        "every function is also compared on inputs of this standard deviation, where an overflowing or cancelling form shows (0: off)";
    "seed" => sizes.seed: OptionKind::Int, SEED_HELP;
    "max-extent" => sizes.max_extent: OptionKind::Int, MAX_EXTENT_HELP;
    "extents" => sizes.extents: OptionKind::Extents, EXTENTS_HELP;
});

pub struct CheckPass {
    options: CheckOptions,
    against_span: Option<crate::diag::Span>,
}

impl NamedPass for CheckPass {
    const NAME: &'static str = "check";
    type Options = CheckOptions;

    fn summary() -> String {
        format!(
            "Compare functions with a reference program on seeded random inputs, at unit and at large scale (relative L2 error); a fixed-seed sample of {} when there are more",
            CheckOptions::default().sample
        )
    }

    fn with_options(options: CheckOptions, spans: OptionSpans) -> CheckPass {
        CheckPass {
            options,
            against_span: spans.get("against"),
        }
    }
}

/// The reference function for `f`: same name, else the same name without a `.suffix`
/// (candidates `attention.c3` check against `attention`), else the only function.
fn find_reference<'a>(reference: &'a Module, f: &Function) -> Option<&'a Function> {
    let base = f.name.split('.').next().unwrap_or(&f.name);
    reference
        .funcs
        .iter()
        .find(|r| r.name == f.name)
        .or_else(|| reference.funcs.iter().find(|r| r.name == base))
        .or_else(|| (reference.funcs.len() == 1).then(|| &reference.funcs[0]))
}

impl CheckPass {
    fn load_reference(&self, cx: &mut PassContext) -> Result<Option<Module>, Vec<Diagnostic>> {
        let Some(path) = &self.options.against else {
            return Ok(None);
        };
        let full = super::options::option_input_path(path, &cx.base_dir);
        let bytes = std::fs::read(&full).map_err(|e| {
            vec![super::options::option_error(
                self.against_span,
                format!("check: cannot read reference `{}`: {e}", full.display()),
                super::options::OPTION_PATH_HELP,
            )]
        })?;
        let text = String::from_utf8(bytes).map_err(|_| {
            vec![super::options::option_error(
                self.against_span,
                format!("check: reference `{}` is not valid UTF-8", full.display()),
                "the reference must be a `.ef` program",
            )]
        })?;
        let id = cx.sources.add(full.display().to_string(), text.clone());
        let mut m = crate::parse::parse_module(&text, id)?;
        crate::verify::verify_module(&mut m)?;
        Ok(Some(m))
    }
}

impl Pass for CheckPass {
    fn name(&self) -> &'static str {
        "check"
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        let loaded = self.load_reference(cx)?;
        let reference: &Module = loaded.as_ref().unwrap_or(cx.original);
        let seed = self.options.sizes.seed.unwrap_or(cx.seed);
        let scales = self.scales();
        let mut errors = Vec::new();
        // Subgraph functions (`partition`) are checked within the compositions that call them.
        let called: std::collections::BTreeSet<String> = module
            .funcs
            .iter()
            .flat_map(crate::partition::compose::calls)
            .collect();
        let chosen = sample_indices(module.funcs.len(), self.options.sample, seed);
        // Pair every function with its reference and the sizes both run at.
        let mut jobs = Vec::new();
        for f in chosen
            .iter()
            .map(|i| &module.funcs[*i])
            .filter(|f| !called.contains(&f.name))
        {
            let Some(r) = find_reference(reference, f) else {
                errors.push(
                    Diagnostic::error(
                        f.name_span,
                        format!("no reference function for `{}`", f.name),
                    )
                    .with_help(
                        "the reference needs a function of the same name, or a single function",
                    ),
                );
                continue;
            };
            if let Err(mut d) = same_interface(f, r) {
                errors.append(&mut d);
                continue;
            }
            let (fsizes, rsizes) = self.sizes_of(f, r);
            jobs.push(Job {
                f,
                r,
                fsizes,
                key: reference_key(r, &rsizes),
                rsizes,
            });
        }
        // The reference's results, once per (reference, sizes): candidates `f.c0`, `f.c1`, …
        // share them. Then every function on the thread pool; reports keep function order.
        let mut firsts: Vec<&Job> = jobs.iter().collect();
        firsts.sort_by(|a, b| a.key.cmp(&b.key));
        firsts.dedup_by(|a, b| a.key == b.key);
        let keys: Vec<&ReferenceKey> = firsts.iter().map(|j| &j.key).collect();
        let runs: Vec<Result<Vec<ReferenceRun>, Vec<Diagnostic>>> = firsts
            .par_iter()
            .map(|j| {
                scales
                    .iter()
                    .enumerate()
                    .map(|(k, &scale)| {
                        let inputs = random_inputs(j.r, &j.rsizes, seed, scale)
                            .map_err(|e| vec![e.into_diagnostic()])?;
                        let want = run_function(reference, j.r, j.rsizes.clone(), &inputs)?;
                        // At a larger scale, also at twice that: the reference's headroom.
                        let mut non_finite_at = vec![non_finite(&want)];
                        if k > 0 {
                            let doubled = random_inputs(j.r, &j.rsizes, seed, 2.0 * scale)
                                .map_err(|e| vec![e.into_diagnostic()])?;
                            let got = run_function(reference, j.r, j.rsizes.clone(), &doubled)?;
                            non_finite_at.push(non_finite(&got));
                        }
                        let moved = run_function(
                            reference,
                            j.r,
                            j.rsizes.clone(),
                            &perturbed(&inputs, seed),
                        )?;
                        let sensitivity = results_error(&moved, &want);
                        Ok(ReferenceRun {
                            non_finite: non_finite_at,
                            inputs,
                            want,
                            sensitivity,
                        })
                    })
                    .collect()
            })
            .collect();
        let run_of = |j: &Job| keys.binary_search(&&j.key).ok().map(|i| (i, &runs[i]));
        let module: &Module = module;
        let results: Vec<Option<Checked>> = jobs
            .par_iter()
            .map(|j| match run_of(j)? {
                (_, Ok(refs)) => Some(
                    refs.iter()
                        .map(|run| {
                            // The reference overflows at this scale: no comparison (empty).
                            if overflows(&run.non_finite[1..], refs[0].non_finite[0]) {
                                Ok((Vec::new(), 0.0))
                            } else {
                                compare_results(module, j, run).map(|e| (e, run.sensitivity))
                            }
                        })
                        .collect(),
                ),
                (_, Err(_)) => None,
            })
            .collect();
        // A reference that does not run is reported once.
        let mut reported = vec![false; keys.len()];
        let mut worst = 0.0f64;
        for (j, result) in jobs.iter().zip(results) {
            let Some(result) = result else {
                if let Some((i, Err(d))) = run_of(j) {
                    if !std::mem::replace(&mut reported[i], true) {
                        errors.extend(d.iter().cloned());
                    }
                }
                continue;
            };
            let per_scale = match result {
                Ok(e) => e,
                Err(mut d) => {
                    errors.append(&mut d);
                    continue;
                }
            };
            for (k, (errs, sensitivity)) in per_scale.iter().enumerate() {
                let at = if k == 0 {
                    String::new()
                } else {
                    format!(" at scale {}", scales[k])
                };
                if errs.is_empty() {
                    cx.report.push(format!(
                        "// check @{} against @{}{at}: not compared: the reference overflows on these inputs or on twice them (more non-finite values than at scale {})",
                        j.f.name, j.r.name, scales[0]
                    ));
                    continue;
                }
                let line: Vec<String> = errs
                    .iter()
                    .enumerate()
                    .map(|(i, e)| format!("result {i}: {e:.3e}"))
                    .collect();
                let max = errs.iter().copied().fold(0.0, f64::max);
                let tol = tolerance(self.options.tol, *sensitivity);
                worst = worst.max(max);
                let verdict = if max <= tol { "ok" } else { "FAILED" };
                // A reference this ill-conditioned moves past `tol` under rounding alone.
                let tol_text = if tol > self.options.tol {
                    format!(
                        "tol {tol:.3e}: the reference moves by {sensitivity:.3e} when its inputs move by 2^-20"
                    )
                } else {
                    format!("tol {}", self.options.tol)
                };
                cx.report.push(format!(
                    "// check @{} against @{}{at}: relative L2 {} ({tol_text}) {verdict}",
                    j.f.name,
                    j.r.name,
                    line.join(", "),
                ));
                if max > tol {
                    let which = errs.iter().position(|e| *e == max).unwrap_or(0);
                    let mut d = Diagnostic::error(
                        j.f.name_span,
                        format!(
                            "`{}` differs from reference `{}`{at}: result {which} has relative L2 error {max:.3e} > tol {}",
                            j.f.name, j.r.name, tolerance_text(tol, self.options.tol)
                        ),
                    )
                    .with_note(Some(j.r.name_span), "reference function");
                    d = if k == 0 {
                        d.with_help(
                            "inspect both with --passes=interpret{print=values} at small sizes",
                        )
                    } else {
                        d.with_help(format!(
                            "this comparison uses inputs of standard deviation {} (`large-scale`): look for a form that overflows or cancels on large inputs (e.g. an exp of unbounded scores), or set `large-scale=0` to compare at `scale` only",
                            scales[k]
                        ))
                    };
                    errors.push(d);
                }
            }
        }
        if chosen.len() < module.funcs.len() {
            cx.diagnostics.push(Diagnostic::global(
                Severity::Remark,
                format!(
                    "check: compared a fixed-seed sample of {} of {} functions (`check{{sample=0}}` compares all)",
                    chosen.len(),
                    module.funcs.len()
                ),
            ));
        }
        cx.counters
            .insert("functions_checked".into(), chosen.len().into());
        // Runs of a reference: once per (reference, sizes) and input scale, however many
        // functions share it.
        let reference_runs: usize = runs
            .iter()
            .map(|r| r.as_ref().map_or(1, |runs| runs.len()))
            .sum();
        cx.counters
            .insert("reference_runs".into(), reference_runs.into());
        cx.counters.insert("max_relative_l2".into(), worst.into());
        cx.counters.insert(
            "input_scales".into(),
            scales
                .iter()
                .map(|s| *s as f64)
                .collect::<Vec<f64>>()
                .into(),
        );
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// A function to check, its reference, and the sizes each runs at.
struct Job<'a> {
    f: &'a Function,
    r: &'a Function,
    fsizes: Sizes,
    rsizes: Sizes,
    key: ReferenceKey,
}

/// Which reference run a function is compared with: the reference's name and its sizes.
type ReferenceKey = (String, Vec<(String, u64)>);

/// Per input scale: the relative L2 error per result (empty: not compared) and the
/// reference's sensitivity there.
type Checked = Result<Vec<(Vec<f64>, f64)>, Vec<Diagnostic>>;

/// The reference's inputs and results at one input scale.
/// Non-finite values among a run's results.
pub fn non_finite(results: &[Value]) -> usize {
    results
        .iter()
        .flat_map(|r| r.leaves())
        .map(|(_, t)| t.data.iter().filter(|v| !v.is_finite()).count())
        .sum()
}

/// Whether a reference run at a larger input scale overflows, or does at twice that scale:
/// it has more non-finite results than at the input scale (a fully masked row is `NaN` at any
/// scale; an `exp` of raw inputs overflows only on large ones). Its values there are no
/// reference — which order a sum or product of overflowing terms ran in decides them, and a
/// reference with no headroom (`exp` of raw scale-30 inputs reaches 1e38) is finite or not by
/// one rounding — so nothing is compared. A stable reference (a softmax shifted by its
/// maximum) keeps its headroom, and an overflowing form checked against it still fails.
pub fn overflows(at_scale: &[usize], at_unit: usize) -> bool {
    at_scale.iter().any(|n| *n > at_unit)
}

struct ReferenceRun {
    /// Non-finite values among `want`, and (at a larger scale) among the results at twice it.
    non_finite: Vec<usize>,
    inputs: Vec<Value>,
    want: Vec<Value>,
    /// How far the reference's results move when its inputs move by [`PERTURBATION`].
    sensitivity: f64,
}

/// The relative size of the random perturbation (each float input element times `1 ± δ`)
/// that measures how sensitive a reference is to rounding: about 16 f32 ulps.
pub const PERTURBATION: f32 = 1.0 / (1u32 << 20) as f32;

/// How many times its own sensitivity a comparison accepts. A candidate that computes the
/// same function in another order (a product reassociated, a factor moved) rounds
/// differently: on an ill-conditioned reference (a softmax of scores of 1e5, products of
/// three scale-30 inputs) the rounding moves the results by about as much as an input
/// perturbation of a few ulps does, far past `tol`, while a candidate computing something
/// else differs by O(1). A comparison accepts `max(tol, CONDITIONING_FACTOR · sensitivity)`
/// and says when it widened `tol`.
pub const CONDITIONING_FACTOR: f64 = 16.0;

/// The inputs with every element of a floating-point tensor multiplied by `1 ± PERTURBATION`
/// (random signs from `seed`); integer and boolean inputs are left alone.
pub fn perturbed(inputs: &[Value], seed: u64) -> Vec<Value> {
    let mut rng = crate::interp::Rng::new(seed ^ 0x5eed_c0de);
    fn walk(v: &Value, rng: &mut crate::interp::Rng) -> Value {
        match v {
            Value::Tensor(t) if t.dtype.is_float() => {
                let mut t = t.clone();
                for tile in &mut t.tiles {
                    let mut data = tile.as_ref().clone();
                    for x in &mut data.data {
                        let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
                        *x *= 1.0 + sign * PERTURBATION;
                    }
                    *tile = std::sync::Arc::new(data);
                }
                Value::Tensor(t)
            }
            Value::Tensor(_) => v.clone(),
            Value::Tuple(vs) => Value::Tuple(vs.iter().map(|x| walk(x, rng)).collect()),
        }
    }
    inputs.iter().map(|v| walk(v, &mut rng)).collect()
}

/// The largest relative error between two runs' results (`reference_error`, so values not
/// finite in `want` ask nothing); infinite when their structure differs.
pub fn results_error(got: &[Value], want: &[Value]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            let (gl, wl) = (g.leaves(), w.leaves());
            if gl.len() != wl.len() {
                return f64::INFINITY;
            }
            gl.iter()
                .zip(&wl)
                .map(|((_, a), (_, b))| reference_error(a, b))
                .fold(0.0, f64::max)
        })
        .fold(0.0, f64::max)
}

/// The tolerance a comparison with a reference of this sensitivity accepts.
pub fn tolerance(tol: f64, sensitivity: f64) -> f64 {
    tol.max(CONDITIONING_FACTOR * sensitivity)
}

/// A tolerance as messages write it: as given (`0.01`), or in scientific form once widened.
pub fn tolerance_text(widened: f64, tol: f64) -> String {
    if widened > tol {
        format!("{widened:.3e}")
    } else {
        tol.to_string()
    }
}

fn reference_key(r: &Function, sizes: &Sizes) -> ReferenceKey {
    let mut s: Vec<(String, u64)> = sizes.0.iter().map(|(k, v)| (k.clone(), *v)).collect();
    s.sort();
    (r.name.clone(), s)
}

/// Both functions take the same inputs (count and types).
fn same_interface(f: &Function, r: &Function) -> Result<(), Vec<Diagnostic>> {
    if f.body.params.len() != r.body.params.len() {
        return Err(vec![Diagnostic::error(
            f.name_span,
            format!(
                "`{}` takes {} inputs but reference `{}` takes {}",
                f.name,
                f.body.params.len(),
                r.name,
                r.body.params.len()
            ),
        )
        .with_note(Some(r.name_span), "reference function")]);
    }
    for (i, (a, b)) in f.body.params.iter().zip(&r.body.params).enumerate() {
        let (ta, tb) = (&f.body.node(*a).annot, &r.body.node(*b).annot);
        if ta != tb {
            let show = |t: &Option<Type>| t.as_ref().map(|t| t.to_string()).unwrap_or_default();
            return Err(vec![Diagnostic::error(
                f.body.node(*a).span,
                format!(
                    "input {i} has type {} but the reference's has {}",
                    show(ta),
                    show(tb)
                ),
            )
            .with_note(Some(r.body.node(*b).span), "reference input")]);
        }
    }
    Ok(())
}

/// Runs `j.f` on the reference's inputs and compares: the relative L2 error per result.
fn compare_results(
    module: &Module,
    j: &Job,
    run: &ReferenceRun,
) -> Result<Vec<f64>, Vec<Diagnostic>> {
    let got = run_function(module, j.f, j.fsizes.clone(), &run.inputs)?;
    let want = &run.want;
    if want.len() != got.len() {
        return Err(vec![Diagnostic::error(
            j.f.name_span,
            format!(
                "`{}` returns {} results but the reference returns {}",
                j.f.name,
                got.len(),
                want.len()
            ),
        )]);
    }
    let mut errs = Vec::new();
    for (g, w) in got.iter().zip(want) {
        let (gl, wl) = (g.leaves(), w.leaves());
        if gl.len() != wl.len() {
            return Err(vec![Diagnostic::error(
                j.f.name_span,
                "result structure differs from the reference",
            )]);
        }
        let e = gl
            .iter()
            .zip(&wl)
            .map(|((_, a), (_, b))| reference_error(a, b))
            .fold(0.0, f64::max);
        errs.push(e);
    }
    Ok(errs)
}

impl CheckPass {
    /// The input scales every function is compared at: `scale`, then `large-scale` unless it
    /// is off or the same.
    fn scales(&self) -> Vec<f32> {
        let mut v = vec![self.options.scale];
        if self.options.large_scale > 0.0 && self.options.large_scale != self.options.scale {
            v.push(self.options.large_scale);
        }
        v
    }

    /// The checked function's sizes, and the reference's: the checked function's are
    /// authoritative (they carry --set overrides).
    fn sizes_of(&self, f: &Function, r: &Function) -> (Sizes, Sizes) {
        let fsizes = self.options.sizes.sizes(f);
        let mut rsizes = self.options.sizes.sizes(r);
        for b in &f.bindings {
            if crate::ir::is_dim_symbol(&b.name) {
                rsizes.0.insert(b.name.clone(), b.value);
            }
        }
        (fsizes, rsizes)
    }
}
