//! Soundness of every equality rule: for each rule, instances are collected from the bundled
//! examples (shrunk to small sizes) and from tests/rules/*.ef, after a few rounds of
//! saturation so that tiled forms exist to match. Each instance — the matched e-node and the
//! term the rule proposes — is turned into two programs (operands extracted from the e-graph)
//! and both are evaluated in the reference interpreter on the same random inputs, at unit
//! and at large magnitude. Values compare tile by tile (relative L2 ≤ 0.01). A rule with no
//! passing instance fails the test.

use efopt::egraph::graph::TypeAnalysis;
use efopt::egraph::rules::{all_rules, Out, Term};
use efopt::egraph::runner::Runner;
use efopt::egraph::{ENode, Op, TypedEGraph};
use efopt::interp::{random_inputs, relative_l2, Interpreter, Sizes, Value};
use efopt::ir::*;
use efopt::verify::typing::{type_body, TypeEnv};
use egg::{AstSize, Extractor, Id, RecExpr};
use std::collections::HashMap;
use std::path::Path;

use crate::common;

const MAX_INSTANCES_PER_RULE: usize = 12;

/// How an instance program is sized: every dimension capped, or random dimensions and a
/// random floating-point storage dtype (seeded).
#[derive(Clone, Copy)]
enum Variant {
    Capped(u64),
    Random(u64),
}

impl Variant {
    fn kind(self) -> usize {
        match self {
            Variant::Capped(_) => 0,
            Variant::Random(_) => 1,
        }
    }
}

/// A seeded draw, for the random shapes.
fn mix(seed: u64) -> u64 {
    efopt::interp::Rng::new(seed).next_u64()
}

/// The program at `path` sized by `variant`; `None` when a random shape does not verify (e.g.
/// a reshape whose sizes no longer agree) after a few draws.
fn load(path: &Path, variant: Variant) -> Option<Module> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let draws = match variant {
        Variant::Capped(_) => 1,
        Variant::Random(_) => 6,
    };
    for draw in 0..draws {
        let text = match variant {
            Variant::Capped(_) => text.clone(),
            Variant::Random(seed) => {
                let dtype = ["bf16", "f16", "f32"][(mix(seed ^ 0xd7) % 3) as usize];
                text.replace("bf16", dtype)
            }
        };
        let mut m = efopt::parse::parse_module(&text, 0)
            .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        // Small sizes keep interpretation fast and keep the default extents (divisors ≤ 4)
        // useful.
        for f in &mut m.funcs {
            for (i, b) in f.bindings.iter_mut().enumerate() {
                // A derived size follows its factors (resolved below).
                if !is_dim_symbol(&b.name) || b.def.is_some() {
                    continue;
                }
                match variant {
                    Variant::Capped(cap) => b.value = b.value.min(cap),
                    Variant::Random(seed) => {
                        b.value = 1 + mix(seed ^ (draw << 32) ^ i as u64) % 12;
                    }
                }
            }
        }
        let resolved = m
            .funcs
            .iter_mut()
            .all(|f| efopt::ir::sizes::resolve_bindings(&mut f.bindings).is_ok());
        if !resolved {
            continue; // a random draw made a derived size non-positive
        }
        match efopt::verify::verify_module(&mut m) {
            Ok(_) => return Some(m),
            Err(e) if matches!(variant, Variant::Capped(_)) => {
                panic!("{}: {e:?}", path.display())
            }
            Err(_) => continue,
        }
    }
    None
}

/// The pointwise operator a propagation instance moves a view through: the proposal's root
/// (views moved in) or its operand (views moved out).
fn pointwise_operator(t: &Term) -> Option<String> {
    let name = |op: &Op| match op {
        Op::Unary(u) => UNARY_OPS
            .iter()
            .find(|(_, v)| v == u)
            .map(|(n, _)| n.to_string()),
        Op::Binary(b) => BINARY_OPS
            .iter()
            .find(|(_, v)| v == b)
            .map(|(n, _)| n.to_string()),
        Op::Select => Some("select".into()),
        Op::Cast(_) => Some("cast".into()),
        _ => None,
    };
    let Term::Node(op, kids) = t else { return None };
    name(op).or_else(|| match kids.first() {
        Some(Term::Node(op, _)) => name(op),
        _ => None,
    })
}

/// Builds a body evaluating `root`: the function's inputs first (in order), then the nodes.
struct BodyBuilder<'a> {
    g: &'a TypedEGraph,
    extractor: &'a Extractor<'a, AstSize, ENode, TypeAnalysis>,
    body: Body,
    memo: HashMap<Id, NodeId>,
}

fn main_inputs(f: &Function) -> Vec<TensorType> {
    f.body
        .params
        .iter()
        .map(|p| match f.body.node(*p).annot.clone() {
            Some(Type::Tensor(t)) => t,
            _ => panic!("input without tensor type"),
        })
        .collect()
}

fn node_of(body: &mut Body, enode: &ENode, children: Vec<NodeId>) -> NodeId {
    let kind = enode.to_expr_kind().with_operands(&children);
    body.push(Node {
        kind,
        name: None,
        annot: enode.leaf_type(),
        span: Default::default(),
        ty: None,
    })
}

impl BodyBuilder<'_> {
    fn class(&mut self, id: Id) -> NodeId {
        let id = self.g.egraph.find(id);
        if let Some(n) = self.memo.get(&id) {
            return *n;
        }
        let expr: RecExpr<ENode> = self.extractor.find_best(id).1;
        let mut ids: Vec<NodeId> = Vec::new();
        for n in expr.as_ref() {
            let kids: Vec<NodeId> = n.children.iter().map(|c| ids[usize::from(*c)]).collect();
            let nid = match &n.op {
                Op::Input(pos, _) => NodeId(*pos),
                _ => node_of(&mut self.body, n, kids),
            };
            ids.push(nid);
        }
        let root = *ids.last().expect("non-empty extraction");
        self.memo.insert(id, root);
        root
    }

    fn term(&mut self, t: &Term) -> NodeId {
        match t {
            Term::Class(id) => self.class(*id),
            Term::Node(op, kids) => {
                let kids: Vec<NodeId> = kids.iter().map(|k| self.term(k)).collect();
                node_of(&mut self.body, &ENode::new(op.clone(), vec![]), kids)
            }
        }
    }
}

/// One set of axis extents for everything in the e-graph, so both sides of an instance tile
/// the same axes the same way.
fn egraph_sizes(g: &TypedEGraph, f: &Function) -> Sizes {
    let bound = Sizes(
        f.bindings
            .iter()
            .map(|b| (b.name.clone(), b.value))
            .collect(),
    );
    let mut views = Vec::new();
    for c in g.egraph.classes() {
        for n in &c.nodes {
            let axis = match &n.op {
                Op::Partition(d, a) => {
                    let size = match g.egraph[n.children[0]].data.as_ref() {
                        Some(Type::Tensor(t)) => t.shape[*d].eval(&|s| bound.get(s)).ok(),
                        _ => None,
                    };
                    views.push((a.to_string(), size));
                    continue;
                }
                Op::Replicate(a) | Op::Combination(_, a) | Op::Collection(a) => a,
                Op::ReduceParallel { axis, .. } => axis,
                _ => continue,
            };
            views.push((axis.to_string(), None));
        }
    }
    bound.with_default_extents(&views, 4)
}

fn evaluate(
    module: &Module,
    f: &Function,
    sizes: &Sizes,
    body: Body,
    inputs: &[Value],
) -> Result<Value, String> {
    let env = TypeEnv::for_bindings(&module.reducers, &f.bindings);
    let types = type_body(&body, &[], &env).map_err(|(_, e)| e.message)?;
    let mut body = body;
    for (n, t) in body.nodes.iter_mut().zip(types) {
        n.ty = Some(t);
    }
    let func = Function {
        name: f.name.clone(),
        name_span: f.name_span,
        bindings: f.bindings.clone(),
        body,
        comment: None,
        schedule: None,
    };
    let interp = Interpreter::new(module, sizes.clone());
    interp
        .run(&func, inputs)
        .map_err(|e| e.message)?
        .into_iter()
        .next()
        .ok_or_else(|| "no result".into())
}

/// Largest relative L2 error between two values, tile by tile.
/// True when every element of every tile is finite.
fn all_finite(v: &Value) -> bool {
    match v {
        Value::Tensor(x) => x.tiles.iter().all(|t| t.data.iter().all(|e| e.is_finite())),
        Value::Tuple(xs) => xs.iter().all(all_finite),
    }
}

fn compare(a: &Value, b: &Value) -> f64 {
    match (a, b) {
        (Value::Tensor(x), Value::Tensor(y)) => {
            if x.axes != y.axes || x.tiles.len() != y.tiles.len() {
                return f64::INFINITY;
            }
            x.tiles
                .iter()
                .zip(&y.tiles)
                .map(|(p, q)| relative_l2(p, q))
                .fold(0.0, f64::max)
        }
        (Value::Tuple(xs), Value::Tuple(ys)) if xs.len() == ys.len() => xs
            .iter()
            .zip(ys)
            .map(|(p, q)| compare(p, q))
            .fold(0.0, f64::max),
        _ => f64::INFINITY,
    }
}

#[test]
fn every_rule_is_sound_on_instances() {
    let files = common::example_and_rule_programs();
    let rules = all_rules();
    // Passing instances per rule, from capped and from random-shape programs.
    let mut passed: HashMap<&str, [usize; 2]> = rules.iter().map(|r| (r.name, [0, 0])).collect();
    // Passing instances of each pointwise propagation rule per operator.
    let mut per_operator: HashMap<(&str, String), usize> = HashMap::new();
    let mut failures = Vec::new();
    // Three size settings, so instances see different shapes, tile extents and dtypes.
    let variants = files.iter().enumerate().flat_map(|(i, p)| {
        [
            (p, Variant::Capped(16)),
            (p, Variant::Capped(8)),
            (p, Variant::Random(mix(i as u64 + 1))),
        ]
    });
    let mut random_programs = 0;
    for (path, variant) in variants {
        let Some(module) = load(path, variant) else {
            continue;
        };
        random_programs += variant.kind();
        for f in &module.funcs {
            let mut g = TypedEGraph::from_function(f, &module.reducers).expect("e-graph");
            // A program may ask for deeper saturation with `// soundness-iterations: N`.
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let iterations = text
                .lines()
                .find_map(|l| l.strip_prefix("// soundness-iterations: "))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(3);
            let report = Runner::default()
                .with_iter_limit(iterations)
                .with_node_limit(4000 * iterations)
                .run(&mut g, &rules);
            assert!(
                report.bugs.is_empty(),
                "{}: rule bugs {:?}",
                path.display(),
                report.bugs
            );
            // Late rules (`refine-result`) propose only once the others have saturated;
            // here every rule is asked of the e-graph as it stands.
            g.egraph.analysis.late = true;
            let extractor = Extractor::new(&g.egraph, AstSize);
            // Reducers made by fusion rules are part of the module the instances run in.
            let mut module = module.clone();
            module.reducers = g.egraph.analysis.env.reducers().to_vec();
            let sizes = egraph_sizes(&g, f);
            let inputs_unit =
                random_inputs(f, &sizes, 7 + variant.kind() as u64 * 10, 1.0).expect("inputs");
            let inputs_large =
                random_inputs(f, &sizes, 8 + variant.kind() as u64 * 10, 30.0).expect("inputs");
            let mut classes: Vec<Id> = g.egraph.classes().map(|c| c.id).collect();
            classes.sort();
            for rule in &rules {
                for &c in &classes {
                    let pointwise_rule =
                        rule.name.starts_with("pointwise-") || rule.name == "transpose-pointwise";
                    if passed[rule.name][variant.kind()] >= MAX_INSTANCES_PER_RULE
                        && !pointwise_rule
                    {
                        break;
                    }
                    for n in g.egraph[c].nodes.clone() {
                        let mut out = Out::default();
                        (rule.find)(&g.egraph, c, &n, &mut out);
                        for r in &out.reducers {
                            if module.reducers.iter().all(|m| m.name != r.name) {
                                module.reducers.push(r.clone());
                            }
                        }
                        for (target, t) in out.proposals.into_iter().take(3) {
                            let operator = pointwise_operator(&t);
                            // Pointwise rules: up to the cap per rule, then only operators
                            // without an instance yet.
                            if pointwise_rule
                                && passed[rule.name][variant.kind()] >= MAX_INSTANCES_PER_RULE
                                && operator.as_ref().is_none_or(|o| {
                                    per_operator.contains_key(&(rule.name, o.clone()))
                                })
                            {
                                continue;
                            }
                            let mut lhs = BodyBuilder {
                                g: &g,
                                extractor: &extractor,
                                body: Body::default(),
                                memo: HashMap::new(),
                            };
                            let mut rhs = BodyBuilder {
                                g: &g,
                                extractor: &extractor,
                                body: Body::default(),
                                memo: HashMap::new(),
                            };
                            for b in [&mut lhs.body, &mut rhs.body] {
                                for (i, t) in main_inputs(f).into_iter().enumerate() {
                                    let id = b.push(Node {
                                        kind: ExprKind::Input,
                                        name: Some(format!("in{i}")),
                                        annot: Some(Type::Tensor(t)),
                                        span: Default::default(),
                                        ty: None,
                                    });
                                    b.params.push(id);
                                }
                            }
                            // The matched e-node, or the class the rule named.
                            let l = match target {
                                Some(other) => lhs.class(other),
                                None => {
                                    let kids: Vec<NodeId> =
                                        n.children.iter().map(|k| lhs.class(*k)).collect();
                                    match &n.op {
                                        Op::Input(pos, _) => NodeId(*pos),
                                        _ => node_of(&mut lhs.body, &n, kids),
                                    }
                                }
                            };
                            lhs.body.results.push(l);
                            let r = rhs.term(&t);
                            rhs.body.results.push(r);
                            let (lb, rb) = (lhs.body, rhs.body);
                            let mut ok = true;
                            let mut compared = 0;
                            for inputs in [&inputs_unit, &inputs_large] {
                                let a = evaluate(&module, f, &sizes, lb.clone(), inputs);
                                let b = evaluate(&module, f, &sizes, rb.clone(), inputs);
                                match (a, b) {
                                    // A reference that overflowed asks nothing (as in
                                    // `check`): no identity holds in f32 past its range.
                                    (Ok(a), Ok(_)) if !all_finite(&a) => {}
                                    (Ok(a), Ok(b)) => {
                                        compared += 1;
                                        let e = compare(&a, &b);
                                        if e > 0.01 {
                                            if std::env::var_os("EFOPT_DEBUG_RULES").is_some() {
                                                eprintln!("{}: lhs {a:?}\nrhs {b:?}\nlhs body {:?}\nrhs body {:?}", rule.name, lb.nodes.iter().map(|n| &n.kind).collect::<Vec<_>>(), rb.nodes.iter().map(|n| &n.kind).collect::<Vec<_>>());
                                            }
                                            ok = false;
                                            failures.push(format!(
                                                "{} at {} ({}, {}): relative L2 {e}",
                                                rule.name,
                                                path.display(),
                                                ["capped", "random shape"][variant.kind()],
                                                f.name
                                            ));
                                        }
                                    }
                                    (a, b) => {
                                        ok = false;
                                        failures.push(format!(
                                            "{} at {}: evaluation failed: {:?} / {:?}",
                                            rule.name,
                                            path.display(),
                                            a.err(),
                                            b.err()
                                        ));
                                    }
                                }
                            }
                            if ok && compared > 0 {
                                passed.get_mut(rule.name).expect("rule")[variant.kind()] += 1;
                                if let Some(o) = operator.filter(|_| pointwise_rule) {
                                    *per_operator.entry((rule.name, o)).or_default() += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "unsound rule instances:\n{}",
        failures.join("\n")
    );
    for r in &rules {
        let [capped, random] = passed[r.name];
        eprintln!(
            "{:<32} {capped:>3} capped, {random:>3} random-shape instances",
            r.name
        );
    }
    eprintln!("{random_programs} random-shape programs");
    let untested: Vec<&str> = rules
        .iter()
        .map(|r| r.name)
        .filter(|n| passed[n][0] + passed[n][1] == 0)
        .collect();
    assert!(
        untested.is_empty(),
        "rules without a passing instance: {untested:?}"
    );
    assert!(
        random_programs * 2 >= files.len(),
        "only {random_programs} of {} programs verified with random shapes",
        files.len()
    );
    // Every pointwise operator through every pointwise propagation rule (the paper counts
    // these as one rule per operator).
    let operators: Vec<String> = UNARY_OPS
        .iter()
        .map(|(n, _)| n.to_string())
        .chain(BINARY_OPS.iter().map(|(n, _)| n.to_string()))
        .chain(["select".to_string(), "cast".to_string()])
        .collect();
    let mut missing = Vec::new();
    for rule in [
        "pointwise-partition-in",
        "pointwise-replicate-in",
        "pointwise-replicate-out",
        "pointwise-combination-out",
        "transpose-pointwise",
    ] {
        for o in &operators {
            if !per_operator.contains_key(&(rule, o.clone())) {
                missing.push(format!("{rule} × {o}"));
            }
        }
    }
    eprintln!(
        "pointwise propagation instances: {} rule × operator pairs",
        per_operator.len()
    );
    assert!(
        missing.is_empty(),
        "pointwise propagation without a passing instance per operator: {missing:?}"
    );
    let no_random: Vec<&str> = rules
        .iter()
        .map(|r| r.name)
        .filter(|n| passed[n][1] == 0)
        .collect();
    assert!(
        no_random.is_empty(),
        "rules without a passing random-shape instance: {no_random:?}"
    );
}
