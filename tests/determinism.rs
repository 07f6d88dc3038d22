//! Output repeats exactly across processes: e-graph maps hash by content (no random seeds,
//! no addresses), so two runs of the same pipeline print the same e-graph and candidates.

use std::process::Command;

fn run(passes: &str, example: &str) -> String {
    let path = format!("{}/examples/{example}.ef", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_efopt"))
        .arg(format!("--passes={passes}"))
        .arg(&path)
        .output()
        .expect("efopt runs");
    assert!(out.status.success(), "{passes} on {example} failed");
    // The pass summaries carry wall-clock times: everything else must match.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with("// saturate") && !l.starts_with("// extract"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `examples/NAME.ef`, verified, and its first function's e-graph saturated with every rule.
fn saturated(example: &str) -> (efopt::ir::Module, efopt::egraph::TypedEGraph) {
    use efopt::egraph::rules::all_rules;
    use efopt::egraph::runner::Runner;
    let path = format!("{}/examples/{example}.ef", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("example");
    let mut m = efopt::parse::parse_module(&text, 0).expect("parses");
    efopt::verify::verify_module(&mut m).expect("verifies");
    let mut g =
        efopt::egraph::TypedEGraph::from_function(&m.funcs[0], &m.reducers).expect("e-graph");
    Runner::default().run(&mut g, &all_rules());
    (m, g)
}

#[test]
fn two_processes_print_the_same_egraph_and_candidates() {
    for (passes, example) in [
        ("saturate", "mha_decode"),
        ("saturate", "layernorm_gemm"),
        ("saturate,extract{max-candidates=50}", "attention_m0"),
    ] {
        let first = run(passes, example);
        assert!(first.lines().count() > 10, "{example}: no output");
        assert!(
            first == run(passes, example),
            "{passes} on {example}: the second run printed something else"
        );
    }
}

/// The e-graph a saturated dump stands for does not depend on the order its classes are
/// written in (which decides egg's ids): re-saturating the dump with its classes in reverse
/// order adds nothing. Product fusion once built the mirrored product of two reductions
/// whose ids came out the other way round (the row statistic's sums: 24 classes became 30).
#[test]
fn resaturating_a_dump_written_in_another_class_order_adds_nothing() {
    use efopt::egraph::rules::all_rules;
    use efopt::egraph::runner::Runner;
    use efopt::egraph::TypedEGraph;
    for example in ["rmsnorm_gemm", "layernorm_gemm", "rowsum_tiled"] {
        let (_, g) = saturated(example);
        let size = |g: &TypedEGraph| {
            (
                g.egraph.number_of_classes(),
                g.egraph.total_number_of_nodes(),
            )
        };
        let mut dump = g.to_dump();
        dump.classes.reverse();
        let reducers = g.egraph.analysis.env.reducers().to_vec();
        let mut again = TypedEGraph::from_dump(&dump, &reducers).expect("loads");
        assert_eq!(
            size(&again),
            size(&g),
            "{example}: loading changed the e-graph"
        );
        Runner::default().run(&mut again, &all_rules());
        assert_eq!(
            size(&again),
            size(&g),
            "{example}: re-saturating added terms"
        );
    }
}

/// A dump names the reducers saturation made (product fusion); rebuilt without their
/// definitions it is refused, not loaded as some other e-graph.
#[test]
fn a_dump_rebuilt_without_its_reducers_is_refused() {
    use efopt::egraph::TypedEGraph;
    let (m, g) = saturated("rmsnorm_gemm");
    let dump = g.to_dump();
    let made: Vec<_> = g.made_reducers(&m.reducers).cloned().collect();
    assert!(!made.is_empty(), "saturation made no reducer");
    let err = TypedEGraph::from_dump(&dump, &m.reducers)
        .err()
        .expect("refused without the reducers saturation made");
    assert!(
        err.contains("unknown reducer") && err.contains(made[0].name.as_str()),
        "{err}"
    );
    let all: Vec<_> = m.reducers.iter().chain(&made).cloned().collect();
    let again = TypedEGraph::from_dump(&dump, &all).expect("loads with them");
    assert_eq!(
        again.egraph.number_of_classes(),
        g.egraph.number_of_classes()
    );
}
