//! `lower`: every function of the module (the extracted candidates) to one Python module of
//! Triton kernels and host functions. `triton-check`: runs that module under the Triton CPU
//! interpreter on the reference interpreter's inputs, compares outputs, and optionally
//! compiles every kernel for GPU targets.

use super::{OptionInfo, OptionKind, Pass, PassContext, PassInfo};
use crate::backend::triton::{emit_module, TritonOptions};
use crate::diag::Diagnostic;
use crate::interp::{random_inputs, Interpreter, Sizes};
use crate::ir::{Function, Module, NodeId, Type};
use crate::lower::{cost, plan, KernelPlan};
use crate::verify::ModuleInfo;
use std::fmt::Write as _;
use std::time::Instant;

pub fn lower_info() -> PassInfo {
    const OPTIONS: &[OptionInfo] = &[
        OptionInfo {
            name: "interpret",
            kind: OptionKind::Bool,
            default: "false",
            help: "f32 matrix-product operands, for the Triton CPU interpreter (its bf16 dot is wrong)",
        },
        OptionInfo {
            name: "dot-bf16",
            kind: OptionKind::Bool,
            default: "false",
            help: "bf16 matrix-product operands even where the program has f32 ones (faster tensor cores, bf16 rounding)",
        },
    ];
    PassInfo {
        name: "lower",
        emits_code: true,
        summary: "Emit Triton kernels and a host function per function (the output becomes Python)",
        options: OPTIONS,
        create: |info, opts| {
            Box::new(LowerPass {
                opts: TritonOptions {
                    interpret: opts.get(info, "interpret") == "true",
                    dot_bf16: opts.get(info, "dot-bf16") == "true",
                },
            })
        },
    }
}

pub fn triton_check_info() -> PassInfo {
    const OPTIONS: &[OptionInfo] = &[
        OptionInfo {
            name: "compile",
            kind: OptionKind::List(&["sm_90", "sm_80"]),
            default: "",
            help: "also compile every kernel for these GPU targets (no GPU needed)",
        },
        OptionInfo {
            name: "blocks",
            kind: OptionKind::PowersOfTwo,
            default: "16,32",
            help: "block sizes to run each candidate with, powers of two as Triton requires (every axis gets the same size)",
        },
        super::check::SAMPLE_OPTION,
        super::check::TOL_OPTION,
        OptionInfo {
            name: "python",
            kind: OptionKind::Path,
            default: "",
            help: "Python with triton and numpy (default: $EFOPT_PYTHON, else the checkout's .venv/bin/python)",
        },
    ];
    PassInfo {
        name: "triton-check",
        emits_code: false,
        summary: "Run the lowered Triton code under the CPU interpreter and compare with the reference interpreter",
        options: OPTIONS,
        create: |info, opts| {
            Box::new(TritonCheckPass {
                compile: opts
                    .get(info, "compile")
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
                blocks: opts
                    .get(info, "blocks")
                    .split(',')
                    .filter_map(|s| s.trim().parse().ok())
                    .collect(),
                sample: opts.get(info, "sample").parse().unwrap_or(0),
                tol: opts.get(info, "tol").parse().unwrap_or(0.01),
                python: Some(opts.get(info, "python").to_string()).filter(|s| !s.is_empty()),
            })
        },
    }
}

fn lowering_error(f: &Function, node: NodeId, message: String) -> Diagnostic {
    let span = f
        .body
        .nodes
        .get(node.index())
        .map(|n| n.span)
        .unwrap_or(f.name_span);
    // Extracted candidates have no source text to point into: name the expression too.
    let mut expr = crate::ir::print::print_expr(&f.body, node);
    if expr.chars().count() > 100 {
        expr = expr.chars().take(97).collect::<String>() + "...";
    }
    let at = if expr.is_empty() {
        String::new()
    } else {
        format!(" (at `{expr}`)")
    };
    Diagnostic::error(span, format!("cannot lower `{}`: {message}{at}", f.name))
        .with_label("this value")
        .with_help("extract{max-kernels=…} or another candidate may avoid the construct; see docs/cli.md (lower)")
}

/// The plans of the functions that lower; each other one gets a warning naming the construct
/// it cannot lower yet. Returns them and how many were skipped.
fn planned<'m>(
    info: &'m ModuleInfo,
    funcs: Vec<&'m Function>,
    cx: &mut PassContext,
) -> (Vec<KernelPlan<'m>>, usize) {
    let mut ok = Vec::new();
    let mut skipped = 0;
    for f in funcs {
        match plan(info, f) {
            Ok(p) => ok.push(p),
            Err(refusal) => {
                let mut d = lowering_error(f, refusal.node, refusal.reason);
                d.severity = crate::diag::Severity::Warning;
                cx.diagnostics.push(d);
                skipped += 1;
            }
        }
    }
    (ok, skipped)
}

/// A plan the backend could not write: a bug in the plan, reported at the node.
fn unwritten(module: &Module, node: NodeId, message: String, name: String) -> Vec<Diagnostic> {
    let f = module.funcs.iter().find(|f| f.name == name);
    vec![match f {
        Some(f) => lowering_error(f, node, message),
        None => Diagnostic::global(crate::diag::Severity::Error, message),
    }]
}

struct LowerPass {
    opts: TritonOptions,
}

impl Pass for LowerPass {
    fn name(&self) -> &'static str {
        "lower"
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        let opts = self.opts;
        // Lowering takes verified functions only: the verifier's info is its ticket.
        let info = crate::verify::verify_module(module)?;
        let module: &Module = module;
        let (plans, _) = planned(&info, module.funcs.iter().collect(), cx);
        if plans.is_empty() {
            return Err(vec![Diagnostic::global(
                crate::diag::Severity::Error,
                "lower: no function could be lowered",
            )]);
        }
        let (source, _) = emit_module(&plans, opts)
            .map_err(|(node, message, name)| unwritten(module, node, message, name))?;
        let mut per = Vec::new();
        for p in &plans {
            let f = p.function;
            {
                let c = cost(f, &p.graph);
                cx.report.push(format!(
                    "// lower @{}: {} kernel(s), {} bytes read, {} bytes written, {} flops",
                    f.name, c.kernels, c.bytes_read, c.bytes_written, c.flops
                ));
                per.push(serde_json::json!({ "function": f.name, "cost": c }));
            }
        }
        cx.counters.insert("candidates".into(), per.into());
        cx.emitted = Some(source);
        Ok(())
    }
}

struct TritonCheckPass {
    compile: Vec<String>,
    blocks: Vec<u64>,
    sample: usize,
    tol: f64,
    python: Option<String>,
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
        "triton-check"
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
            for (i, v) in outputs.iter().enumerate() {
                let Some(t) = v.dense() else {
                    return Err(fail(format!(
                        "@{}: a tuple-valued result cannot be checked",
                        f.name
                    )));
                };
                let file = format!("f{fi}_out{i}.f32");
                write_f32(&dir.join(&file), &t.data).map_err(|e| fail(e.to_string()))?;
                outs.push(serde_json::json!({"file": file, "shape": t.shape}));
            }
            let host = hosts.get(fi).cloned().unwrap_or_default();
            let schedules: Vec<serde_json::Value> = self
                .blocks
                .iter()
                .map(|b| {
                    let mut m = serde_json::Map::new();
                    for a in chosen_plans[fi].axis_dims().keys() {
                        m.insert(format!("BLOCK_{a}"), (*b).into());
                    }
                    serde_json::Value::Object(m)
                })
                .collect();
            functions.push(serde_json::json!({
                "name": host, "ir_name": f.name, "schedules": schedules, "inputs": ins, "outputs": outs
            }));
        }
        let manifest = serde_json::json!({
            "module": "cands.py", "tol": self.tol, "compile": self.compile, "functions": functions
        });
        std::fs::write(dir.join("manifest.json"), manifest.to_string())
            .map_err(|e| fail(e.to_string()))?;
        // The runner script and the venv `scripts/setup-venv.sh` makes live in the checkout
        // efopt was built from.
        let checkout = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let python = self
            .python
            .clone()
            .or_else(|| std::env::var("EFOPT_PYTHON").ok())
            .unwrap_or_else(|| checkout.join(".venv/bin/python").display().to_string());
        let script = checkout.join("python/efopt_triton.py");
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
