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
