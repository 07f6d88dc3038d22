//! `expect-contains{program=FILE}`: fails unless each e-graph's root classes represent the
//! given program, up to renaming of parallel axes (consistently, one-to-one) and of user
//! reducers with the same definition.

use super::options::{pass_options, OptionKind, OptionSpans};
use super::{NamedPass, Pass, PassContext};
use crate::diag::{Diagnostic, Severity};
use crate::egraph::{ENode, Op, TypedEGraph};
use crate::ir::print::{print_reducer, PrintOptions};
use crate::ir::*;
use egg::Id;

#[derive(Clone, Debug, Default)]
pub struct ContainsOptions {
    /// `program`: the file of the program every e-graph must represent.
    pub program: Option<String>,
}

pass_options!(ContainsOptions {
    "program" => program: OptionKind::Path,
        "the program every e-graph must represent (one function, or one of the same name)";
});

pub struct ContainsPass {
    program: String,
    program_span: Option<crate::diag::Span>,
}

impl NamedPass for ContainsPass {
    const NAME: &'static str = "expect-contains";
    type Options = ContainsOptions;

    fn summary() -> String {
        "Fail unless the e-graph's result classes represent the given program (up to axis and reducer renaming)".into()
    }

    fn with_options(options: ContainsOptions, spans: OptionSpans) -> ContainsPass {
        ContainsPass {
            // Unset, no file is read: the error names the empty path.
            program: options.program.unwrap_or_default(),
            program_span: spans.get("program"),
        }
    }
}

/// Matching state: the axis renaming (program → e-graph) and a step budget.
struct Matcher<'a> {
    g: &'a TypedEGraph,
    body: &'a Body,
    prog_reducers: &'a [ReducerDef],
    graph_reducers: &'a [ReducerDef],
    axes: Vec<(String, String)>,
    steps: usize,
    /// Answers by (class, program node, axis map at the call): `represents` is a function of
    /// these, so a program that shares a value (a DAG) is matched once per sharing, not once
    /// per path. A success stores the axis map it left.
    memo: Memo,
}

type Memo =
    rustc_hash::FxHashMap<(Id, NodeId, Vec<(String, String)>), Option<Vec<(String, String)>>>;

const STEP_BUDGET: usize = 2_000_000;

impl<'a> Matcher<'a> {
    fn new(
        g: &'a TypedEGraph,
        body: &'a Body,
        prog_reducers: &'a [ReducerDef],
        graph_reducers: &'a [ReducerDef],
    ) -> Matcher<'a> {
        Matcher {
            g,
            body,
            prog_reducers,
            graph_reducers,
            axes: Vec::new(),
            steps: 0,
            memo: Memo::default(),
        }
    }

    fn map_axis(&mut self, prog: &str, graph: &str) -> bool {
        if let Some((_, g)) = self.axes.iter().find(|(p, _)| p == prog) {
            return g == graph;
        }
        if self.axes.iter().any(|(_, g)| g == graph) {
            return false;
        }
        self.axes.push((prog.to_string(), graph.to_string()));
        true
    }

    fn same_reducer(&self, a: &ReducerRef, b: &ReducerRef) -> bool {
        match (a, b) {
            (ReducerRef::Builtin(x), ReducerRef::Builtin(y)) => x == y,
            (ReducerRef::User(x), ReducerRef::User(y)) => {
                let def = |rs: &[ReducerDef], n: &str| {
                    rs.iter().find(|r| r.name == n).map(canonical_reducer)
                };
                x == y
                    || (def(self.prog_reducers, x).is_some()
                        && def(self.prog_reducers, x) == def(self.graph_reducers, y))
            }
            _ => false,
        }
    }

    /// Whether the ops agree, extending the axis map as needed.
    fn ops_match(&mut self, p: &Op, g: &Op) -> bool {
        match (p, g) {
            (Op::Partition(d1, a1), Op::Partition(d2, a2))
            | (Op::Combination(d1, a1), Op::Combination(d2, a2)) => {
                d1 == d2
                    && std::mem::discriminant(p) == std::mem::discriminant(g)
                    && self.map_axis(a1, a2)
            }
            (Op::Replicate(a1), Op::Replicate(a2)) | (Op::Collection(a1), Op::Collection(a2)) => {
                std::mem::discriminant(p) == std::mem::discriminant(g) && self.map_axis(a1, a2)
            }
            (
                Op::ReduceParallel {
                    axis: a1,
                    reducer: r1,
                },
                Op::ReduceParallel {
                    axis: a2,
                    reducer: r2,
                },
            ) => self.same_reducer(r1, r2) && self.map_axis(a1, a2),
            (
                Op::ReduceAxis {
                    dim: d1,
                    reducer: r1,
                    keep_dims: k1,
                },
                Op::ReduceAxis {
                    dim: d2,
                    reducer: r2,
                    keep_dims: k2,
                },
            ) => d1 == d2 && k1 == k2 && self.same_reducer(r1, r2),
            _ => p == g,
        }
    }

    /// Whether the e-graph's roots represent the program's results: the axis renaming
    /// under which they do.
    fn roots(&mut self, prog: &[ENode]) -> Option<Vec<(String, String)>> {
        let found = self.body.results.len() == self.g.roots.len()
            && self
                .body
                .results
                .iter()
                .zip(&self.g.roots)
                .all(|(r, root)| self.represents(*root, *r, prog));
        found.then(|| self.axes.clone())
    }

    fn represents(&mut self, class: Id, node: NodeId, prog: &[ENode]) -> bool {
        let class = self.g.egraph.find(class);
        let key = (class, node, self.axes.clone());
        if let Some(answer) = self.memo.get(&key) {
            return match answer {
                Some(axes) => {
                    self.axes.clone_from(axes);
                    true
                }
                None => false,
            };
        }
        let found = self.search(class, node, prog);
        // An answer cut short by the budget is not one.
        if self.steps <= STEP_BUDGET {
            self.memo.insert(key, found.then(|| self.axes.clone()));
        }
        found
    }

    fn search(&mut self, class: Id, node: NodeId, prog: &[ENode]) -> bool {
        self.steps += 1;
        if self.steps > STEP_BUDGET {
            return false;
        }
        let want = &prog[node.index()];
        let candidates: Vec<ENode> = self.g.egraph[class].nodes.clone();
        for cand in candidates {
            if cand.children.len() != want.children.len() {
                continue;
            }
            let saved = self.axes.len();
            if self.ops_match(&want.op, &cand.op) {
                let kids: Vec<NodeId> = self.body.node(node).kind.operands();
                if kids
                    .iter()
                    .zip(&cand.children)
                    .all(|(k, c)| self.represents(*c, *k, prog))
                {
                    return true;
                }
            }
            self.axes.truncate(saved);
        }
        false
    }
}

/// A reducer's definition up to renaming: parameters renamed by position and every
/// intermediate expanded into one expression tree (so sharing does not matter).
fn canonical_reducer(r: &ReducerDef) -> String {
    let mut tree = Body::default();
    let mut map: Vec<Option<NodeId>> = vec![None; r.body.nodes.len()];
    fn copy(r: &ReducerDef, id: NodeId, tree: &mut Body, map: &mut Vec<Option<NodeId>>) -> NodeId {
        let n = r.body.node(id);
        if n.kind == ExprKind::Param {
            if let Some(m) = map[id.index()] {
                return m;
            }
        }
        let ops: Vec<NodeId> = n
            .kind
            .operands()
            .iter()
            .map(|o| copy(r, *o, tree, map))
            .collect();
        let new = tree.push(Node {
            kind: n.kind.with_operands(&ops),
            name: None,
            annot: n.annot.clone(),
            span: n.span,
            ty: None,
        });
        if n.kind == ExprKind::Param {
            map[id.index()] = Some(new);
        }
        new
    }
    for (i, p) in r.body.params.iter().enumerate() {
        let id = tree.push(Node {
            kind: ExprKind::Param,
            name: Some(format!("p{i}")),
            annot: None,
            span: Default::default(),
            ty: None,
        });
        tree.params.push(id);
        map[p.index()] = Some(id);
    }
    let results: Vec<NodeId> = r
        .body
        .results
        .iter()
        .map(|x| copy(r, *x, &mut tree, &mut map))
        .collect();
    tree.results = results;
    let def = ReducerDef {
        name: String::new(),
        name_span: Default::default(),
        state: (0..r.state.len()).map(|i| format!("p{i}")).collect(),
        item: (r.state.len()..r.state.len() + r.item.len())
            .map(|i| format!("p{i}"))
            .collect(),
        init: r.init.clone(),
        body: tree,
    };
    print_reducer(&def, PrintOptions::default())
}

/// Whether the root classes of `g` (whose reducers are `graph_reducers`) represent function
/// `f` (of a module with reducers `prog_reducers`), as `expect-contains` decides it: the
/// renaming of parallel axes (program axis, e-graph axis) under which they do.
pub fn represents(
    g: &TypedEGraph,
    graph_reducers: &[ReducerDef],
    f: &Function,
    prog_reducers: &[ReducerDef],
) -> Result<Option<Vec<(String, String)>>, String> {
    let enodes = program_enodes(f, prog_reducers)?;
    Ok(Matcher::new(g, &f.body, prog_reducers, graph_reducers).roots(&enodes))
}

/// The program's nodes as e-nodes (children unused; program operands drive the walk).
fn program_enodes(f: &Function, reducers: &[ReducerDef]) -> Result<Vec<ENode>, String> {
    let body = &f.body;
    let env = crate::verify::typing::TypeEnv::new(reducers);
    let mut out = Vec::new();
    for id in body.ids() {
        let n = body.node(id);
        let ops = n.kind.operands();
        let types: Vec<&Type> = ops.iter().filter_map(|o| body.ty(*o)).collect();
        let pos = body.params.iter().position(|p| *p == id).map(|p| p as u32);
        let mut node = n.clone();
        if let Some(k) =
            crate::verify::typing::resolve_field_name(body, &n.kind, &env).map_err(|e| e.message)?
        {
            node.kind = k;
        }
        out.push(ENode::from_node(
            &node,
            pos,
            ops.iter().map(|_| Id::from(0usize)).collect(),
            &types,
        )?);
    }
    Ok(out)
}

impl Pass for ContainsPass {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        let path = super::options::option_input_path(&self.program, &cx.base_dir);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            vec![super::options::option_error(
                self.program_span,
                format!("expect-contains: cannot read `{}`: {e}", path.display()),
                super::options::OPTION_PATH_HELP,
            )]
        })?;
        let id = cx.sources.add(path.display().to_string(), text.clone());
        let mut prog = crate::parse::parse_module(&text, id)?;
        crate::verify::verify_module(&mut prog)?;
        if module.egraphs.is_empty() {
            return Err(vec![Diagnostic::global(
                Severity::Error,
                "expect-contains needs e-graphs: run `saturate` first",
            )]);
        }
        let mut errors = Vec::new();
        for dump in &module.egraphs {
            let g = TypedEGraph::from_dump(dump, &module.reducers).map_err(|e| {
                vec![Diagnostic::error(
                    dump.name_span,
                    format!("cannot rebuild the e-graph: {e}"),
                )]
            })?;
            let f = prog
                .funcs
                .iter()
                .find(|f| f.name == dump.name)
                .or_else(|| (prog.funcs.len() == 1).then(|| &prog.funcs[0]));
            let Some(f) = f else {
                errors.push(Diagnostic::error(
                    dump.name_span,
                    format!("`{}` has no function of that name", path.display()),
                ));
                continue;
            };
            let enodes = program_enodes(f, &prog.reducers)
                .map_err(|e| vec![Diagnostic::error(f.name_span, e)])?;
            let mut m = Matcher::new(&g, &f.body, &prog.reducers, &module.reducers);
            if let Some(axes) = m.roots(&enodes) {
                let renames: Vec<String> = axes
                    .iter()
                    .filter(|(p, g)| p != g)
                    .map(|(p, g)| format!("{p}→{g}"))
                    .collect();
                let renamed = if renames.is_empty() {
                    String::new()
                } else {
                    format!(" (axes {})", renames.join(", "))
                };
                cx.report.push(format!(
                    "// expect-contains @{}: found @{}{renamed}",
                    dump.name, f.name
                ));
                continue;
            }
            let budget = if m.steps > STEP_BUDGET {
                " (search budget exhausted)"
            } else {
                ""
            };
            // Point at the first statement no e-class represents on its own.
            // Each probe starts from no axis renaming; probes share their answers. A class
            // that represents a statement has an e-node whose first operand's class represents
            // that operand (under a renaming that extends none), so only parents of those are
            // probed.
            let mut culprit = None;
            let all: Vec<Id> = g.egraph.classes().map(|c| c.id).collect();
            let mut probe = Matcher::new(&g, &f.body, &prog.reducers, &module.reducers);
            let mut reps: Vec<Vec<Id>> = vec![Vec::new(); f.body.nodes.len()];
            for id in f.body.ids() {
                let candidates = match f.body.node(id).kind.operands().first() {
                    None => all.clone(),
                    Some(first) => {
                        let mut parents: Vec<Id> = reps[first.index()]
                            .iter()
                            .flat_map(|c| g.egraph[*c].parents())
                            .map(|p| g.egraph.find(p))
                            .collect();
                        parents.sort_unstable();
                        parents.dedup();
                        parents
                    }
                };
                let found: Vec<Id> = candidates
                    .into_iter()
                    .filter(|c| {
                        probe.axes.clear();
                        probe.steps = 0;
                        probe.represents(*c, id, &enodes)
                    })
                    .collect();
                if found.is_empty() {
                    culprit = Some(id);
                    break;
                }
                reps[id.index()] = found;
            }
            let mut d = Diagnostic::error(
                dump.name_span,
                format!(
                    "the e-graph `{}` does not contain `{}`{budget}",
                    dump.name, f.name
                ),
            );
            if let Some(c) = culprit {
                d = d.with_note(
                    Some(f.body.node(c).span),
                    "no e-class represents this expression",
                );
            }
            errors.push(d.with_help(
                "saturate with more iterations, or check which rule should derive this form",
            ));
        }
        cx.counters
            .insert("egraphs_checked".into(), module.egraphs.len().into());
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}
