//! The exit codes of the `efopt` command, which the lit harness's `not` does not tell apart:
//! 0 for success, `--help`, `--version` and `--list-passes`; 1 for an error in the input or
//! the pipeline; 2 for a usage error (clap's message).

use std::process::Command;

fn efopt(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_efopt"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("efopt runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_version_and_listings_exit_0_on_standard_output() {
    for (args, first) in [
        (&["--help"][..], "efopt — tensor-program superoptimizer"),
        (&["-h"], "efopt — tensor-program superoptimizer"),
        (&["--version"], "efopt "),
        (&["-V"], "efopt "),
        (&["--list-passes"], "Available passes:"),
        (&["--list-rules"], ""),
    ] {
        let (code, stdout, stderr) = efopt(args);
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        assert!(stdout.starts_with(first), "{args:?}: {stdout}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["--bogus", "examples/lora.ef"][..],
        &["--set", "K", "examples/lora.ef"],
        &["--seed", "x", "examples/lora.ef"],
        &["--color=sometimes", "examples/lora.ef"],
        &["--stats=xml", "examples/lora.ef"],
        &["--verify-each=maybe", "examples/lora.ef"],
        &["--print-ir-after=nope", "examples/lora.ef"],
        &["examples/lora.ef", "examples/rowsum.ef"],
        &["examples/lora.ef", "-o"],
    ] {
        let (code, stdout, stderr) = efopt(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    }
}

#[test]
fn input_and_pipeline_errors_exit_1() {
    for args in [
        &["--passes=verfy", "examples/lora.ef"][..],
        &["--passes=check{tol=abc}", "examples/lora.ef"],
        &["does-not-exist.ef"],
        &[
            "--passes=check{against=does-not-exist.ef}",
            "examples/lora.ef",
        ],
    ] {
        let (code, _, stderr) = efopt(args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
    }
}
