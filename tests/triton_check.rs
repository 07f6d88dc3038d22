//! Lowered candidates run under the Triton CPU interpreter and match the reference
//! interpreter, with several block sizes (16 does not divide every dimension), and every
//! kernel compiles for sm_90. Needs the venv from `scripts/setup-venv.sh` (the README's test
//! command creates it).

use std::path::Path;
use std::process::Command;

#[test]
fn extracted_candidates_run_and_compile() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-venv.sh first",
        python.display()
    );
    let small = [
        "--set", "B=4", "--set", "H=48", "--set", "F=40", "--set", "N=40", "--set", "R=16",
    ];
    for (name, sized) in [
        ("attention_m0", false),
        ("attention_m2", false),
        ("rowsum", false),
        ("matmul_exp", false),
        ("lora", true),
        ("gated_mlp", true),
        ("rmsnorm_mlp", true),
        ("rmsnorm_gemm", true),
        ("ngpt", true),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_efopt"));
        if sized {
            cmd.args(small);
        }
        let out = cmd
            .arg("--passes=saturate,extract{max-candidates=6},triton-check{compile=sm_90 blocks=16,32}")
            .arg(root.join("examples").join(format!("{name}.ef")))
            .env("EFOPT_PYTHON", &python)
            .output()
            .expect("efopt runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let summary = stdout
            .lines()
            .find(|l| l.starts_with("// triton-check:"))
            .unwrap_or_else(|| panic!("{name}: no triton-check summary\n{stdout}\n{stderr}"));
        assert!(out.status.success(), "{name}: {summary}\n{stderr}");
        assert!(summary.contains(" 0 failed"), "{name}: {summary}");
        assert!(
            !summary.contains(" 0 run(s) ok"),
            "{name}: nothing ran: {summary}"
        );
        assert!(
            !summary.contains(" 0 kernel compilation"),
            "{name}: nothing compiled: {summary}"
        );
    }
}
