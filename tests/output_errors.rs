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
