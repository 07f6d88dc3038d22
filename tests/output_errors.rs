//! Where the output goes wrong: the lit harness captures standard output itself, so these run
//! the `efopt` binary directly.

use std::process::{Command, Stdio};

/// Standard output that cannot be written (a full disk, here `/dev/full`) is an error with
/// exit code 1, not a silent loss of the output.
#[test]
fn a_full_standard_output_is_an_error() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return; // no such device on this system
    };
    let out = Command::new(env!("CARGO_BIN_EXE_efopt"))
        .args(["--passes=verify", "examples/lora.ef"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::from(full))
        .output()
        .expect("efopt runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("error: cannot write to standard output"),
        "stderr: {stderr}"
    );
}

/// A reader that stops early (`efopt … | head`) closes the pipe: that is its choice, so efopt
/// says nothing about it and does not fail.
#[test]
fn a_reader_closing_the_pipe_is_not_an_error() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_efopt"))
        .args(["--passes=saturate", "examples/lora.ef"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("efopt starts");
    // Closed before efopt, still starting up, writes anything: every write fails.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("efopt ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert!(!stderr.contains("cannot write"), "stderr: {stderr}");
}

/// `-o FILE` is replaced only by a run that succeeds: a failed run creates no file (before,
/// an empty one) and leaves an existing one as it was; a run that succeeds replaces it and
/// leaves no temporary file beside it; `-o /dev/null` is written, not replaced.
#[test]
fn a_failed_run_leaves_the_output_file_as_it_was() {
    let dir = std::env::temp_dir().join(format!("efopt-output-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let bad = dir.join("bad.ef");
    std::fs::write(
        &bad,
        "func f {\n  x: tensor<4, f32> = input\n  return y\n}\n",
    )
    .expect("input");
    let run = |input: &str, out: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_efopt"))
            .args(["--passes=verify", input, "-o"])
            .arg(out)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("efopt runs")
    };
    let fresh = dir.join("fresh.ef");
    let out = run(bad.to_str().expect("utf-8 path"), &fresh);
    assert_eq!(out.status.code(), Some(1));
    assert!(!fresh.exists(), "a failed run created {}", fresh.display());

    let kept = dir.join("kept.ef");
    std::fs::write(&kept, "earlier output\n").expect("earlier output");
    let out = run(bad.to_str().expect("utf-8 path"), &kept);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        std::fs::read_to_string(&kept).expect("kept"),
        "earlier output\n"
    );

    let out = run("examples/lora.ef", &kept);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read_to_string(&kept)
        .expect("replaced")
        .starts_with("func lora"));
    let names: Vec<String> = std::fs::read_dir(&dir)
        .expect("listing")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    assert!(
        names.iter().all(|n| !n.contains(".tmp")),
        "left behind: {names:?}"
    );

    if std::path::Path::new("/dev/null").exists() {
        let out = run("examples/lora.ef", std::path::Path::new("/dev/null"));
        assert_eq!(out.status.code(), Some(0));
        let meta = std::fs::metadata("/dev/null").expect("/dev/null");
        assert!(!meta.is_file(), "/dev/null was replaced by a file");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `--split-input-file` each chunk is a run of its own: `-o FILE` holds the output of the
/// chunks that succeeded (exit code 1 still says one failed), and is left as it was only when
/// every chunk failed. (`lit/extract/validity.ef` read a file an earlier run had left.)
#[test]
fn split_input_writes_the_chunks_that_succeed() {
    let dir = std::env::temp_dir().join(format!("efopt-split-output-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let good = "func good {\n  x: tensor<4, f32> = input\n  return exp(x)\n}\n";
    let bad = "func bad {\n  x: tensor<4, f32> = input\n  return y\n}\n";
    let run = |text: &str, name: &str| {
        let input = dir.join(format!("{name}.ef"));
        std::fs::write(&input, text).expect("input");
        let out = dir.join(format!("{name}.out.ef"));
        let status = Command::new(env!("CARGO_BIN_EXE_efopt"))
            .args(["--split-input-file", "--passes=verify", "-o"])
            .arg(&out)
            .arg(&input)
            .output()
            .expect("efopt runs");
        (status.status.code(), std::fs::read_to_string(&out).ok())
    };
    let (code, text) = run(&format!("{good}// -----\n{bad}"), "mixed");
    assert_eq!(code, Some(1));
    let text = text.expect("the good chunk is written");
    assert!(text.contains("func good"), "{text}");
    assert!(!text.contains("func bad"), "{text}");
    let (code, text) = run(&format!("{bad}// -----\n{bad}"), "all_bad");
    assert_eq!(code, Some(1));
    assert_eq!(text, None, "every chunk failed: no file");
    let _ = std::fs::remove_dir_all(&dir);
}
