//! Early compaction is sound: on e-graphs small enough to enumerate fully, extraction with
//! early compaction returns exactly one representative of every ≈-class that enumerating all
//! candidates finds (`compaction=after`), and no two of its candidates are ≈; `none` finds
//! the same classes too.

use efopt::egraph::extract::{canonical_text, Compaction, ExtractGraph, ExtractStop, Extractor};
use efopt::egraph::rules::all_rules;
use efopt::egraph::runner::Runner;
use efopt::egraph::TypedEGraph;
use std::collections::BTreeSet;
use std::path::Path;

fn classes(x: &ExtractGraph, mode: Compaction) -> (Vec<String>, usize) {
    let report = Extractor::default()
        .with_compaction(mode)
        .with_max_candidates(1_000_000)
        .run(x);
    assert_eq!(report.stop, ExtractStop::Exhausted, "{mode:?} must finish");
    let forms = report
        .candidates
        .iter()
        .map(|c| canonical_text(x, &c.choice))
        .collect();
    (forms, report.expanded)
}

#[test]
fn early_compaction_keeps_one_representative_of_every_class() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // (example, saturation iteration limit, also compare `none`): the small ones saturate; nGPT
    // cut at four iterations is a medium-size e-graph (63 classes, about 1,900 ≈-classes)
    // that full enumeration still finishes.
    for (name, iterations, with_none) in [
        ("rowsum", 30, true),
        ("rowsum_tiled", 30, true),
        ("matmul_exp", 30, true),
        ("ngpt", 4, false),
    ] {
        let text = std::fs::read_to_string(root.join(format!("examples/{name}.ef"))).unwrap();
        let mut m = efopt::parse::parse_module(&text, 0).expect("parses");
        efopt::passes::verify::verify_module(&mut m).expect("verifies");
        let mut g = TypedEGraph::from_function(&m.funcs[0], &m.reducers).expect("e-graph");
        Runner::default()
            .with_iter_limit(iterations)
            .run(&mut g, &all_rules());
        let x = ExtractGraph::new(&g).expect("extractable");
        let (early, early_states) = classes(&x, Compaction::Early);
        let (after, after_states) = classes(&x, Compaction::After);
        let early_set: BTreeSet<&String> = early.iter().collect();
        let after_set: BTreeSet<&String> = after.iter().collect();
        assert_eq!(
            early_set.len(),
            early.len(),
            "{name}: early output has ≈ duplicates"
        );
        assert_eq!(
            after_set.len(),
            after.len(),
            "{name}: after output has ≈ duplicates"
        );
        let missing: Vec<&&String> = after_set.difference(&early_set).collect();
        assert!(
            missing.is_empty() && early_set.len() == after_set.len(),
            "{name}: early compaction misses {} classes, e.g.\n{}",
            missing.len(),
            missing.first().map(|s| s.as_str()).unwrap_or("")
        );
        if with_none {
            let (none, _) = classes(&x, Compaction::None);
            let none_set: BTreeSet<&String> = none.iter().collect();
            assert_eq!(none_set, after_set, "{name}: none finds different classes");
            assert!(none.len() >= after.len());
        }
        assert!(!early.is_empty(), "{name}: no candidates");
        assert!(
            early_states <= after_states,
            "{name}: early expanded {early_states} states, after {after_states}"
        );
    }
}
