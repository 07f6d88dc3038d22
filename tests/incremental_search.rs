//! Incremental (semi-naive) search is an optimisation only: on every example and rule-instance
//! program, saturating with it gives exactly the e-graph that searching every e-node every
//! iteration gives — same e-classes, e-nodes and generated reducers, printed identically.
//! Likewise each rule's root filter (the runner calls a rule only on e-nodes of its root
//! kind) drops no match: on the saturated e-graphs no rule proposes anything elsewhere.

use efopt::egraph::rules::all_rules;
use efopt::egraph::runner::Runner;
use efopt::egraph::TypedEGraph;
use efopt::ir::print::print_egraph;
use std::path::Path;

use crate::common;

fn saturated(path: &Path, incremental: bool) -> (String, usize) {
    let text = std::fs::read_to_string(path).expect("readable");
    let mut m = efopt::parse::parse_module(&text, 0).expect("parses");
    efopt::verify::verify_module(&mut m).expect("verifies");
    let f = &m.funcs[0];
    let mut g = TypedEGraph::from_function(f, &m.reducers).expect("e-graph");
    let report = Runner::default()
        .with_incremental_search(incremental)
        .run(&mut g, &all_rules());
    let mut reducers: Vec<String> = g
        .egraph
        .analysis
        .env
        .reducers()
        .iter()
        .map(|r| r.name.clone())
        .collect();
    reducers.sort();
    let text = format!(
        "{}\nreducers: {reducers:?}\nstop: {}",
        print_egraph(&g.to_dump()),
        report.stop
    );
    (text, report.nodes)
}

#[test]
fn incremental_search_gives_the_same_egraph_as_full_search() {
    let files = common::example_and_rule_programs();
    assert!(files.len() >= 10, "too few programs: {files:?}");
    for f in &files {
        let (full, nodes) = saturated(f, false);
        let (incremental, _) = saturated(f, true);
        assert!(
            full == incremental,
            "{}: incremental search differs from full search",
            f.display()
        );
        assert!(nodes > 0);
    }
}

#[test]
fn no_rule_matches_outside_its_root() {
    let rules = all_rules();
    for f in common::example_and_rule_programs() {
        let text = std::fs::read_to_string(&f).expect("readable");
        let mut m = efopt::parse::parse_module(&text, 0).expect("parses");
        efopt::verify::verify_module(&mut m).expect("verifies");
        let mut g = TypedEGraph::from_function(&m.funcs[0], &m.reducers).expect("e-graph");
        Runner::default().run(&mut g, &rules);
        let eg = &g.egraph;
        for rule in &rules {
            for class in eg.classes() {
                for n in class.nodes.iter().filter(|n| !rule.root.matches(&n.op)) {
                    let mut out = efopt::egraph::rules::Out::default();
                    (rule.find)(eg, class.id, n, &mut out);
                    assert!(
                        out.proposals.is_empty(),
                        "{}: rule {} matches {:?}, outside its root {:?}",
                        f.display(),
                        rule.name,
                        n.op,
                        rule.root
                    );
                }
            }
        }
    }
}

/// The search runs on the thread pool only once an iteration's search was slow; both ways
/// collect proposals in rule order, so the e-graph is the same. Forced either way here (the
/// examples that go parallel by themselves are the slow ones).
#[test]
fn parallel_search_gives_the_same_egraph_as_serial_search() {
    use std::time::Duration;
    let saturate = |path: &Path, after: Duration| {
        let text = std::fs::read_to_string(path).expect("readable");
        let mut m = efopt::parse::parse_module(&text, 0).expect("parses");
        efopt::verify::verify_module(&mut m).expect("verifies");
        let mut g = TypedEGraph::from_function(&m.funcs[0], &m.reducers).expect("e-graph");
        let report = Runner::default()
            .with_parallel_search_after(after)
            .run(&mut g, &all_rules());
        (print_egraph(&g.to_dump()), report.stop)
    };
    let pool = rayon::current_num_threads();
    let files = common::example_and_rule_programs();
    for f in &files {
        let serial = saturate(f, Duration::MAX);
        let parallel = saturate(f, Duration::ZERO);
        assert!(
            serial == parallel,
            "{}: searching on the thread pool ({pool} threads) changes the e-graph",
            f.display()
        );
    }
}

/// The examples rarely need it, so this case isolates it: two operand classes merge (by
/// commutativity, `x * y` = `y * x`) while the e-node above their readers, `p + q`, stays
/// unchanged in an unchanged class. Only revisiting the parents of merged classes lets
/// `distribute-matmul-lhs` see `matmul(A, b) + matmul(A, c)` afterwards.
#[test]
fn an_enode_whose_operands_read_merged_classes_is_searched_again() {
    let text = "func merge_below where M = 4, K = 8, N = 4 {
  x: tensor<MxK, f32> = input
  y: tensor<MxK, f32> = input
  b: tensor<KxN, f32> = input
  c: tensor<KxN, f32> = input
  a1 = x * y
  a2 = y * x
  p = matmul(a1, b)
  q = matmul(a2, c)
  output = p + q
  return output
}
";
    let rules: Vec<_> = all_rules()
        .into_iter()
        .filter(|r| r.name == "commute-multiply" || r.name == "distribute-matmul-lhs")
        .collect();
    assert_eq!(rules.len(), 2);
    let mut m = efopt::parse::parse_module(text, 0).expect("parses");
    efopt::verify::verify_module(&mut m).expect("verifies");
    let saturate = |incremental: bool| {
        let mut g = TypedEGraph::from_function(&m.funcs[0], &m.reducers).expect("e-graph");
        Runner::default()
            .with_incremental_search(incremental)
            .run(&mut g, &rules);
        let matmuls = g
            .egraph
            .classes()
            .flat_map(|c| c.nodes.iter())
            .filter(|n| matches!(n.op, efopt::egraph::Op::MatMul(_)))
            .count();
        (print_egraph(&g.to_dump()), matmuls)
    };
    let (full, full_matmuls) = saturate(false);
    let (incremental, matmuls) = saturate(true);
    // p, q and the distributed matmul(A, b + c).
    assert_eq!(full_matmuls, 3, "full search does not distribute:\n{full}");
    assert_eq!(
        matmuls, 3,
        "incremental search misses the distribution:\n{incremental}"
    );
    assert!(full == incremental);
}
