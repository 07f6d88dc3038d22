//! `triton-check`: runs the lowered module under the Triton CPU interpreter on the reference
//! interpreter's inputs, compares outputs, and optionally compiles every kernel for GPU
//! targets.

use super::check::TOL_HELP;
use super::lower::{planned, unwritten};
use super::options::{pass_options, OptionKind, OptionSpans};
use super::{NamedPass, Pass, PassContext};
use crate::backend::triton::{emit_module, TritonOptions};
use crate::diag::Diagnostic;
use crate::interp::{random_inputs, Interpreter, Sizes};
use crate::ir::{Function, Module, Type};
use crate::lower::KernelPlan;
use std::fmt::Write as _;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct TritonCheckOptions {
    /// `compile`: also compile every kernel for these GPU targets.
    pub compile: Vec<String>,
    /// `blocks`: the block sizes each candidate runs with (every axis gets the same size).
    pub blocks: Vec<u64>,
    /// `sample`: how many functions are checked, a fixed-seed sample when there are more
    /// (0: all).
    pub sample: usize,
    /// `tol`: the largest accepted relative L2 error.
    pub tol: f64,
    /// `python`: the Python with triton and numpy; unset, `$EFOPT_PYTHON`, else the
    /// checkout's `.venv/bin/python`.
    pub python: Option<String>,
}

impl Default for TritonCheckOptions {
    fn default() -> TritonCheckOptions {
        TritonCheckOptions {
            compile: Vec::new(),
            blocks: vec![16, 32],
            sample: 0,
            tol: 0.01,
            python: None,
        }
    }
}

pass_options!(TritonCheckOptions {
    "compile" => compile: OptionKind::List(&["sm_90", "sm_80"]),
        "also compile every kernel for these GPU targets (no GPU needed)";
    "blocks" => blocks: OptionKind::PowersOfTwo,
        "block sizes to run each candidate with, powers of two as Triton requires (every axis gets the same size)";
    "sample" => sample: OptionKind::Int,
        "check a fixed-seed sample of this many functions when there are more (0: check all)";
    "tol" => tol: OptionKind::Float, TOL_HELP;
    "python" => python: OptionKind::Path,
        "Python with triton and numpy (default: $EFOPT_PYTHON, else the checkout's .venv/bin/python)";
});

pub struct TritonCheckPass {
    compile: Vec<String>,
    blocks: Vec<u64>,
    sample: usize,
    tol: f64,
    python: Option<String>,
}

impl NamedPass for TritonCheckPass {
    const NAME: &'static str = "triton-check";
    type Options = TritonCheckOptions;

    fn summary() -> String {
        "Run the lowered Triton code under the CPU interpreter and compare with the reference interpreter".into()
    }

    fn with_options(o: TritonCheckOptions, _: OptionSpans) -> TritonCheckPass {
        TritonCheckPass {
            compile: o.compile,
            blocks: o.blocks,
            sample: o.sample,
            tol: o.tol,
            python: o.python,
        }
    }
}

fn write_f32(path: &std::path::Path, data: &[f32]) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(data.len() * 4);
    for x in data {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, bytes)
}
impl Pass for TritonCheckPass {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        let start = Instant::now();
        let fail = |m: String| vec![Diagnostic::global(crate::diag::Severity::Error, m)];
        // Every function is lowered (each one that cannot be gets a warning); a sample of
        // those that can is run.
        let info = crate::verify::verify_module(module)?;
        let module: &Module = module;
        let (mut lowered, not_lowered) = planned(&info, module.funcs.iter().collect(), cx);
        let lowered_count = lowered.len();
        let mut picked = super::check::sample_indices(lowered.len(), self.sample, cx.seed);
        let chosen_plans: Vec<KernelPlan> = {
            // In sample order (the indices need not be sorted).
            let mut slots: Vec<Option<KernelPlan>> = lowered.drain(..).map(Some).collect();
            picked
                .drain(..)
                .filter_map(|i| slots.get_mut(i).and_then(Option::take))
                .collect()
        };
        let chosen: Vec<&Function> = chosen_plans.iter().map(|p| p.function).collect();
        cx.counters.insert("lowered".into(), lowered_count.into());
        cx.counters.insert("checked".into(), chosen.len().into());
        cx.counters.insert("not_lowered".into(), not_lowered.into());
        let (source, hosts) = emit_module(
            &chosen_plans,
            TritonOptions {
                interpret: true,
                dot_bf16: false,
            },
        )
        .map_err(|(node, message, name)| unwritten(module, node, message, name))?;
        let dir = std::env::temp_dir().join(format!(
            "efopt-triton-check-{}-{}",
            std::process::id(),
            cx.seed
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        std::fs::write(dir.join("cands.py"), &source)
            .map_err(|e| fail(format!("cannot write the module: {e}")))?;
        let mut functions = Vec::new();
        for (fi, f) in chosen.iter().enumerate() {
            let sizes = Sizes::for_function(f, 4);
            let inputs =
                random_inputs(f, &sizes, cx.seed, 1.0).map_err(|e| vec![e.into_diagnostic()])?;
            let outputs = Interpreter::new(module, sizes.clone())
                .run(f, &inputs)
                .map_err(|e| vec![e.into_diagnostic()])?;
            // A program computing in bf16/f16 is compared within twice its own distance from
            // exact arithmetic where that exceeds `tol`: Triton rounds at other points than
            // the interpreter's emulation (an attention entirely in bf16 is 0.0095 from
            // exact; its fused kernel in Triton 0.0143 from the emulation), while a wrong
            // kernel is off by O(1).
            let exact = Interpreter::new(module, sizes.clone())
                .with_exact_floats()
                .run(f, &inputs)
                .map_err(|e| vec![e.into_diagnostic()])?;
            let mut ins = Vec::new();
            for (i, (v, p)) in inputs.iter().zip(&f.body.params).enumerate() {
                let (Some(t), Some(Type::Tensor(ty))) = (v.dense(), f.body.ty(*p)) else {
                    continue;
                };
                let file = format!("f{fi}_in{i}.f32");
                write_f32(&dir.join(&file), &t.data).map_err(|e| fail(e.to_string()))?;
                ins.push(serde_json::json!({"file": file, "shape": t.shape, "dtype": crate::backend::triton::dtype_host(ty.dtype)}));
            }
            let mut outs = Vec::new();
            for (i, (v, x)) in outputs.iter().zip(&exact).enumerate() {
                let Some(t) = v.dense() else {
                    return Err(fail(format!(
                        "@{}: a tuple-valued result cannot be checked",
                        f.name
                    )));
                };
                let file = format!("f{fi}_out{i}.f32");
                write_f32(&dir.join(&file), &t.data).map_err(|e| fail(e.to_string()))?;
                let own = x.dense().map_or(0.0, |x| crate::interp::relative_l2(t, x));
                let tol = if own.is_finite() {
                    self.tol.max(2.0 * own)
                } else {
                    self.tol
                };
                outs.push(serde_json::json!({"file": file, "shape": t.shape, "tol": tol}));
            }
            let host = hosts.get(fi).cloned().unwrap_or_default();
            let mut schedules: Vec<serde_json::Value> = self
                .blocks
                .iter()
                .map(|b| {
                    let mut m = serde_json::Map::new();
                    // A block no wider than its axis (rounded up to a power of two, as
                    // Triton needs, and at least 16): 32 on the batch and head axes of a
                    // 2×2×T×D attention made a 2M-element block, past Triton's 2^20.
                    for (a, d) in chosen_plans[fi].axis_dims() {
                        let extent = match &d {
                            crate::ir::DimBase::Lit(n) => Some(*n),
                            crate::ir::DimBase::Sym(x) | crate::ir::DimBase::Extent(x) => {
                                sizes.get(x.as_str())
                            }
                        };
                        // At least 16, which `tl.dot` needs of its dimensions on sm_90.
                        let block = extent.map_or(*b, |e| (*b).min(e.max(16).next_power_of_two()));
                        m.insert(format!("BLOCK_{a}"), block.into());
                    }
                    serde_json::Value::Object(m)
                })
                .collect();
            // A ranked function also runs with its own schedule (the host function's default).
            if f.schedule.is_some() {
                schedules.insert(0, serde_json::json!({}));
            }
            functions.push(serde_json::json!({
                "name": host, "ir_name": f.name, "schedules": schedules, "inputs": ins, "outputs": outs
            }));
        }
        let manifest = serde_json::json!({
            "module": "cands.py", "tol": self.tol, "compile": self.compile, "functions": functions
        });
        std::fs::write(dir.join("manifest.json"), manifest.to_string())
            .map_err(|e| fail(e.to_string()))?;
        let python = crate::support::python(self.python.clone());
        let script = crate::support::home().join("python/efopt_triton.py");
        let out = std::process::Command::new(&python)
            .arg(&script)
            .arg(dir.join("manifest.json"))
            .output()
            .map_err(|e| {
                vec![Diagnostic::global(
                    crate::diag::Severity::Error,
                    format!("cannot run `{python}`: {e}"),
                )
                .with_help("run scripts/setup-venv.sh, or pass triton-check{python=PATH} / set EFOPT_PYTHON")]
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let (mut passed, mut failed, mut compiled) = (0usize, 0usize, 0u64);
        let mut errors = Vec::new();
        for line in stdout.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if let Some(ok) = v.get("ok").and_then(|o| o.as_bool()) {
                let name = v["function"].as_str().unwrap_or("?");
                let errs = v.get("errors").map(|e| e.to_string()).unwrap_or_default();
                let mut text = format!(
                    "// triton-check {name} schedule {}: {} {errs}",
                    v["schedule"],
                    if ok { "ok" } else { "MISMATCH" }
                );
                if let Some(tols) = v.get("tols") {
                    let _ = write!(
                        text,
                        " (tol {tols}: twice the program's distance from exact arithmetic)"
                    );
                }
                if let Some(ex) = v.get("exception") {
                    let _ = write!(text, " exception: {ex}");
                }
                cx.report.push(text.clone());
                if ok {
                    passed += 1;
                } else {
                    failed += 1;
                    errors.push(text);
                }
            } else if let Some(c) = v.get("compiled").and_then(|c| c.as_u64()) {
                compiled = c;
                if let Some(fs) = v["compile_failures"].as_array() {
                    for fl in fs {
                        errors.push(format!("// compile failure: {fl}"));
                        failed += 1;
                    }
                }
            }
        }
        cx.report.push(format!(
            "// triton-check: {} function(s) lowered, {not_lowered} not lowered, {} checked, {passed} run(s) ok, {failed} failed, {compiled} kernel compilation(s) for [{}], {:.2} s",
            lowered_count,
            chosen.len(),
            self.compile.join(", "),
            start.elapsed().as_secs_f64()
        ));
        cx.counters.insert("runs_ok".into(), passed.into());
        cx.counters.insert("failed".into(), failed.into());
        cx.counters.insert("compiled".into(), compiled.into());
        if passed == 0 && failed == 0 {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
            return Err(fail(format!(
                "the Triton runner produced no results: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )));
        }
        if failed > 0 {
            return Err(vec![Diagnostic::global(
                crate::diag::Severity::Error,
                format!("triton-check: {failed} failure(s):\n{}", errors.join("\n")),
            )]);
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
