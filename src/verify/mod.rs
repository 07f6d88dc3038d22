//! The verifier: infers and checks every node's type ([`typing`] holds the rules) and the
//! module-level rules, reporting each violation as its own diagnostic at the offending
//! expression. On success every node's `ty` is filled in and [`verify_module`] returns a
//! [`ModuleInfo`], which lowering requires: an unverified function cannot be planned or
//! emitted.

pub mod typing;

use crate::diag::Diagnostic;
use crate::ir::*;
use typing::{annotation_mismatch, infer, resolve_field_name, TypeEnv};

/// What verification established about a module, and what later stages need from it: the
/// reducers its functions' folds name, every one typed. Only the verifier makes one (the
/// field is private), so a stage that takes a `ModuleInfo` only ever sees verified input.
#[derive(Clone, Debug)]
pub struct ModuleInfo {
    reducers: Vec<ReducerDef>,
}

impl ModuleInfo {
    /// The module's reducer definitions, by name.
    pub fn reducer(&self, name: &str) -> Option<&ReducerDef> {
        self.reducers.iter().find(|r| r.name == name)
    }

    pub fn reducers(&self) -> &[ReducerDef] {
        &self.reducers
    }

    /// The info of functions typed by the e-graph analysis of a verified module, whose rules
    /// may have defined reducers (fusion's generated reducers, typed by [`TypeEnv`] when the
    /// rule made them): extraction's candidates are typed this way, not by `verify_module`.
    pub fn of_typed_egraph(env: &TypeEnv) -> ModuleInfo {
        ModuleInfo {
            reducers: env.reducers().to_vec(),
        }
    }
}

pub fn verify_module(m: &mut Module) -> Result<ModuleInfo, Vec<Diagnostic>> {
    let mut diags = Vec::new();
    let reducers = m.reducers.clone();
    // E-graph dumps are callable (a composition calls its saturated subgraphs) wherever they
    // are: they call nothing.
    let mut signatures: Vec<typing::Signature> = m.egraphs.iter().map(dump_signature).collect();
    for f in &mut m.funcs {
        let env = TypeEnv::for_bindings(&reducers, &f.bindings).with_functions(signatures.clone());
        let before = diags.len();
        verify_function(f, &env, &mut diags);
        calls_agree_on_sizes(f, &signatures, &mut diags);
        if diags.len() == before {
            signatures.push(typing::Signature {
                name: f.name.clone(),
                params: f
                    .body
                    .params
                    .iter()
                    .filter_map(|p| f.body.ty(*p).cloned())
                    .collect(),
                results: f
                    .body
                    .results
                    .iter()
                    .filter_map(|r| f.body.ty(*r).cloned())
                    .collect(),
                bindings: f
                    .bindings
                    .iter()
                    .map(|b| (b.name.clone(), b.value))
                    .collect(),
            });
        }
    }
    for g in &m.egraphs {
        let env = TypeEnv::for_bindings(&reducers, &g.bindings);
        verify_egraph(g, &env, &mut diags);
    }
    // One diagnostic per distinct problem: a reducer body error reached from two uses is one.
    let mut seen = std::collections::HashSet::new();
    diags.retain(|d: &Diagnostic| seen.insert((d.span, d.message.clone())));
    if diags.is_empty() {
        Ok(ModuleInfo { reducers })
    } else {
        Err(diags)
    }
}

/// The interface of an e-graph dump: its inputs by position, its roots' types.
fn dump_signature(g: &EGraphDump) -> typing::Signature {
    let mut params: Vec<(u32, Type)> = Vec::new();
    for c in &g.classes {
        for n in &c.nodes {
            if let Some(pos) = n.input {
                if !params.iter().any(|(p, _)| *p == pos) {
                    params.push((pos, c.ty.clone()));
                }
            }
        }
    }
    params.sort_by_key(|(p, _)| *p);
    let ty = |id: u32| g.classes.iter().find(|c| c.id == id).map(|c| c.ty.clone());
    typing::Signature {
        name: g.name.clone(),
        params: params.into_iter().map(|(_, t)| t).collect(),
        results: g.roots.iter().filter_map(|r| ty(*r)).collect(),
        bindings: g
            .bindings
            .iter()
            .map(|b| (b.name.clone(), b.value))
            .collect(),
    }
}

/// A call's callee must see the sizes its caller has: each size both name has one value.
fn calls_agree_on_sizes(f: &Function, sigs: &[typing::Signature], diags: &mut Vec<Diagnostic>) {
    for n in &f.body.nodes {
        let ExprKind::Call(g, _) = &n.kind else {
            continue;
        };
        let Some(sig) = sigs.iter().find(|s| s.name == *g) else {
            continue;
        };
        for (name, value) in &sig.bindings {
            if let Some(b) = f.bindings.iter().find(|b| b.name == *name) {
                if b.value != *value {
                    diags.push(
                        Diagnostic::error(
                            n.span,
                            format!(
                                "`{g}` has {name} = {value}, but `{}` has {name} = {}",
                                f.name, b.value
                            ),
                        )
                        .with_help(
                            "a callee and its callers give each size they share the same value",
                        ),
                    );
                }
            }
        }
    }
}

fn verify_function(f: &mut Function, env: &TypeEnv, diags: &mut Vec<Diagnostic>) {
    let body = &mut f.body;
    for n in &mut body.nodes {
        n.ty = None;
    }
    let mut failed = vec![false; body.nodes.len()];
    for id in body.ids() {
        let ops = body.node(id).kind.operands();
        if ops.iter().any(|o| failed[o.index()]) {
            failed[id.index()] = true; // already reported at the operand
            continue;
        }
        let n = body.node(id);
        let op_types: Vec<&Type> = ops.iter().filter_map(|o| body.ty(*o)).collect();
        let result = resolve_field_name(body, &n.kind, env).and_then(|resolved| {
            let t = infer(
                resolved.as_ref().unwrap_or(&n.kind),
                &op_types,
                n.annot.as_ref(),
                env,
            )?;
            match &n.annot {
                Some(a) if !n.kind.needs_annotation() && a != &t => Err(annotation_mismatch(a, &t)),
                _ => Ok(t),
            }
        });
        match result {
            Ok(t) => body.node_mut(id).ty = Some(t),
            Err(e) => {
                let at = n.span;
                let mut d = e.into_diagnostic(at);
                if d.span != Some(at) {
                    d = d.with_note(Some(at), "reducer used here");
                }
                diags.push(d);
                failed[id.index()] = true;
            }
        }
    }
    slice_ranges(f, diags);
    schedule_entries(f, diags);
    let body = &f.body;
    for r in &body.results {
        if let Some(t) = body.ty(*r) {
            if has_parallel_state(t) {
                let n = body.node(*r);
                diags.push(
                    Diagnostic::error(n.span, format!("function result has parallel state: {t}"))
                        .with_help("results live in global memory: join tiles with combination[…] or fold them with reduce … parallel=")
                        .with_note(Some(body.results_span), "returned here"),
                );
            }
        }
    }
}

/// A `schedule(…)`: block sizes of axes the function splits (powers of two up to 1024),
/// `num_warps` (1, 2, 4, 8 or 16) and `num_stages` (1 to 8), the latter two also per kernel
/// (`k1_num_warps`).
fn schedule_entries(f: &Function, diags: &mut Vec<Diagnostic>) {
    let Some(entries) = &f.schedule else { return };
    let split: std::collections::BTreeSet<&str> = f
        .body
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            ExprKind::Partition(_, a, _) => Some(a.as_str()),
            _ => None,
        })
        .collect();
    for e in entries {
        // `k<i>_num_warps`, `k<i>_num_stages`: kernel i's own (`tune`).
        let name =
            crate::lower::plan::per_kernel_entry(&e.name).map_or(e.name.as_str(), |(_, n)| n);
        let (ok, expected) = match name {
            "num_warps" => (
                matches!(e.value, 1 | 2 | 4 | 8 | 16),
                "1, 2, 4, 8 or 16".to_string(),
            ),
            "num_stages" => ((1..=8).contains(&e.value), "1 to 8".to_string()),
            a if split.contains(a) => (
                e.value.is_power_of_two() && e.value <= 1024,
                "a power of two up to 1024".to_string(),
            ),
            a => {
                let known: Vec<&str> = split.iter().copied().collect();
                let help = if known.is_empty() {
                    "this function splits no axis: only `num_warps` and `num_stages` apply".into()
                } else {
                    format!(
                        "block sizes are given for the axes the function partitions ({}), besides `num_warps` and `num_stages`",
                        known.join(", ")
                    )
                };
                diags.push(
                    Diagnostic::error(
                        e.span,
                        format!("schedule names `{a}`, which is no axis the function splits"),
                    )
                    .with_label("unknown schedule parameter")
                    .with_help(help),
                );
                continue;
            }
        };
        if !ok {
            diags.push(
                Diagnostic::error(
                    e.span,
                    format!("`{}` = {} is out of range", e.name, e.value),
                )
                .with_label("this value")
                .with_help(format!("`{}` takes {expected}", e.name)),
            );
        }
    }
}

/// Slice bounds within the sliced dimension at the function's sizes. Typing is symbolic
/// (`slice[1,0,24]` of a `D` dimension types for every `D`); here the `where` sizes, when
/// every one the slice names is bound, must also hold it.
fn slice_ranges(f: &Function, diags: &mut Vec<Diagnostic>) {
    let size = |s: &str| f.binding(s);
    for n in &f.body.nodes {
        let ExprKind::Slice(d, start, end, x) = &n.kind else {
            continue;
        };
        if n.ty.is_none() {
            continue; // its typing error is reported
        }
        let Some(Type::Tensor(t)) = f.body.ty(*x) else {
            continue;
        };
        let Ok(i) = resolve_dim(&t.shape, d) else {
            continue;
        };
        let (Ok(s), Ok(e), Ok(len)) = (start.eval(&size), end.eval(&size), t.shape[i].eval(&size))
        else {
            continue;
        };
        if s >= e || e > len {
            let sizes: Vec<String> = [start, end, &t.shape[i]]
                .iter()
                .filter_map(|dim| match &dim.base {
                    DimBase::Sym(sym) => Some(format!("{sym} = {}", size(sym).unwrap_or(0))),
                    _ => None,
                })
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            diags.push(
                Diagnostic::error(
                    n.span,
                    format!(
                        "slice [{start}, {end}){} is out of range for dimension {} of size {len}",
                        if start.to_string() == s.to_string() && end.to_string() == e.to_string() {
                            String::new()
                        } else {
                            format!(", [{s}, {e}) at these sizes,")
                        },
                        t.shape[i]
                    ),
                )
                .with_help(if sizes.is_empty() {
                    "the end is exclusive and at most the dimension's size".to_string()
                } else {
                    format!(
                        "at {}; the end is exclusive and at most the dimension's size",
                        sizes.join(", ")
                    )
                }),
            );
        }
    }
}

pub fn has_parallel_state(t: &Type) -> bool {
    match t {
        Type::Tensor(t) => !t.par.is_empty(),
        Type::Tuple(fs) => fs.iter().any(has_parallel_state),
    }
}

/// Every e-node of a dump must have its e-class's type.
fn verify_egraph(g: &EGraphDump, env: &TypeEnv, diags: &mut Vec<Diagnostic>) {
    let types: std::collections::HashMap<u32, &Type> =
        g.classes.iter().map(|c| (c.id, &c.ty)).collect();
    for c in &g.classes {
        for n in &c.nodes {
            let ops: Option<Vec<&Type>> =
                n.children.iter().map(|k| types.get(k).copied()).collect();
            let Some(ops) = ops else { continue }; // reported by the parser
            match infer(&n.kind, &ops, Some(&c.ty), env) {
                Ok(t) if t == c.ty => {}
                Ok(t) => diags.push(
                    Diagnostic::error(
                        n.span,
                        format!(
                            "e-node has type {t}, but its e-class %{} has type {}",
                            c.id, c.ty
                        ),
                    )
                    .with_note(Some(c.span), "e-class declared here"),
                ),
                Err(e) => diags.push(e.into_diagnostic(n.span)),
            }
        }
    }
    // Inputs are the function's arguments: one type per position, positions 0..n.
    let mut inputs: std::collections::BTreeMap<u32, (&Type, crate::diag::Span)> =
        Default::default();
    for c in &g.classes {
        for n in &c.nodes {
            let Some(pos) = n.input else { continue };
            match inputs.get(&pos) {
                Some((t, first)) if **t != c.ty => diags.push(
                    Diagnostic::error(
                        n.span,
                        format!("input {pos} has type {}, but elsewhere type {t}", c.ty),
                    )
                    .with_note(Some(*first), "first typed here")
                    .with_help("an input is one argument of the function: give it one type"),
                ),
                Some(_) => {}
                None => {
                    inputs.insert(pos, (&c.ty, n.span));
                }
            }
        }
    }
    for (i, (pos, (_, span))) in inputs.iter().enumerate() {
        if *pos as usize != i {
            diags.push(
                Diagnostic::error(*span, format!("input {pos} is used, but input {i} is not"))
                    .with_help("inputs are the function's arguments, numbered from 0 without gaps"),
            );
            break;
        }
    }
    // Every class needs a finite term: an e-node whose operand classes have one in turn.
    let index: std::collections::HashMap<u32, usize> = g
        .classes
        .iter()
        .enumerate()
        .map(|(i, c)| (c.id, i))
        .collect();
    let operands: Vec<Vec<Vec<usize>>> = g
        .classes
        .iter()
        .map(|c| {
            c.nodes
                .iter()
                .map(|n| {
                    // An undefined operand (reported by the parser) is past the last class.
                    let missing = g.classes.len();
                    n.children
                        .iter()
                        .map(|k| index.get(k).copied().unwrap_or(missing))
                        .collect()
                })
                .collect()
        })
        .collect();
    let finite = crate::ir::finite::bottom_up(&operands).finite;
    if let Some(c) = g
        .classes
        .iter()
        .zip(&finite)
        .find(|(_, f)| !**f)
        .map(|(c, _)| c)
    {
        diags.push(
            Diagnostic::error(c.span, format!("e-class %{} has no finite term", c.id))
                .with_help("every e-node of it uses the class itself, directly or through other classes: give it an e-node that bottoms out in inputs or constants"),
        );
    }
    // A root is a result of the function the e-graph stands for: the same rule holds.
    for r in &g.roots {
        let Some(t) = types.get(r).filter(|t| has_parallel_state(t)) else {
            continue;
        };
        let class_span = index.get(r).map(|i| g.classes[*i].span);
        diags.push(
            Diagnostic::error(
                g.roots_span,
                format!("e-graph root %{r} has parallel state: {t}"),
            )
            .with_help(
                "roots are results and live in global memory: a root class must be tensor-level",
            )
            .with_note(class_span, "e-class declared here"),
        );
    }
}
