//! Runs parsed RUN-line pipelines: builtins and FileCheck in-process, every
//! other program spawned directly.
//!
//! Commands of a pipeline run one after another, each fed the previous one's
//! complete stdout. That is simpler than real pipes and behaves the same for
//! programs that terminate on their own.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use litcheck_filecheck::litcheck::diagnostics::{
    DefaultSourceManager, Diagnostic, FileName, Report, SourceLanguage,
};
use litcheck_filecheck::litcheck::reporting::NarratableReportHandler;
use litcheck_filecheck::litcheck::Symbol;
use litcheck_filecheck::{Config, Options, Test};

use super::shell::{Command, FileTarget};

/// What every command of one test file shares.
pub struct Context<'a> {
    /// Working directory of spawned programs and base of relative paths.
    pub cwd: &'a Path,
    /// Replaces a program named `efopt`.
    pub efopt: &'a Path,
    /// Scratch file used to interleave stdout and stderr for `2>&1`.
    pub merge_file: PathBuf,
}

#[derive(Debug)]
pub enum Status {
    Exited(i32),
    /// Killed by a signal; holds the platform's description of the status.
    Killed(String),
    /// The harness could not run the command (spawn failure, unreadable
    /// redirect, bad FileCheck usage). Always a failure, even under `not`.
    Error(String),
}

#[derive(Debug)]
pub struct Outcome {
    pub status: Status,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// FileCheck only: its input, and its rendered diagnostic on failure.
    pub filecheck: Option<(Vec<u8>, Option<String>)>,
}

impl Outcome {
    fn exited(code: i32, stdout: Vec<u8>, stderr: Vec<u8>) -> Self {
        Self {
            status: Status::Exited(code),
            stdout,
            stderr,
            filecheck: None,
        }
    }

    fn error(message: String) -> Self {
        Self {
            status: Status::Error(message),
            stdout: Vec::new(),
            stderr: Vec::new(),
            filecheck: None,
        }
    }
}

pub struct CommandResult<'a> {
    pub command: &'a Command,
    pub outcome: Outcome,
    /// `Err(reason)` when the command did not behave as the line demands.
    pub verdict: Result<(), String>,
}

/// Runs a pipeline to completion; every command runs even if an earlier one
/// failed, since the later ones' output often explains the failure.
pub fn run_pipeline<'a>(pipeline: &'a [Command], ctx: &Context<'_>) -> Vec<CommandResult<'a>> {
    let mut piped = Vec::new();
    let mut results = Vec::with_capacity(pipeline.len());
    for command in pipeline {
        let outcome = run_with_redirects(command, std::mem::take(&mut piped), ctx);
        let outcome = match outcome {
            Ok((outcome, next)) => {
                piped = next;
                outcome
            }
            Err(message) => Outcome::error(message),
        };
        let verdict = verdict(&outcome, command.negate);
        results.push(CommandResult {
            command,
            outcome,
            verdict,
        });
    }
    results
}

fn verdict(outcome: &Outcome, negate: bool) -> Result<(), String> {
    match outcome.status {
        Status::Exited(0) if !negate => Ok(()),
        Status::Exited(0) => Err("exit code 0, but `not` requires a failure".to_owned()),
        // Rust panics exit with 101; a panic is a bug even where failure is expected.
        Status::Exited(101) => Err("exit code 101: it panicked".to_owned()),
        Status::Exited(_) if negate => Ok(()),
        Status::Exited(_) if matches!(outcome.filecheck, Some((_, Some(_)))) => {
            Err("FileCheck: the checks did not match".to_owned())
        }
        Status::Exited(code) => Err(format!("exit code {code}")),
        Status::Killed(ref how) => Err(format!("killed ({how})")),
        Status::Error(ref message) => Err(message.clone()),
    }
}

/// Runs one command; returns its outcome and what it passes down the pipe.
fn run_with_redirects(
    cmd: &Command,
    piped: Vec<u8>,
    ctx: &Context<'_>,
) -> Result<(Outcome, Vec<u8>), String> {
    let input = match &cmd.stdin {
        Some(path) => {
            let path = resolve(ctx.cwd, path);
            fs::read(&path).map_err(|e| format!("cannot read `< {}`: {e}", path.display()))?
        }
        None => piped,
    };
    let outcome = run_command(cmd, input, ctx);
    if let Some(target) = &cmd.stderr {
        write_target(ctx.cwd, target, &outcome.stderr)?;
    }
    let next = match &cmd.stdout {
        Some(target) => {
            write_target(ctx.cwd, target, &outcome.stdout)?;
            Vec::new()
        }
        None => outcome.stdout.clone(),
    };
    Ok((outcome, next))
}

fn write_target(cwd: &Path, target: &FileTarget, bytes: &[u8]) -> Result<(), String> {
    let path = resolve(cwd, &target.path);
    let result = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(target.append)
        .truncate(!target.append)
        .open(&path)
        .and_then(|mut file| file.write_all(bytes));
    result.map_err(|e| format!("cannot write to `{}`: {e}", path.display()))
}

fn resolve(cwd: &Path, path: &str) -> PathBuf {
    cwd.join(path)
}

fn run_command(cmd: &Command, input: Vec<u8>, ctx: &Context<'_>) -> Outcome {
    let (program, args) = match cmd.argv.split_first() {
        Some(split) => split,
        None => return Outcome::error("empty command".to_owned()),
    };
    let mut outcome = match program.as_str() {
        "FileCheck" => filecheck(args, &input, ctx.cwd),
        name => match builtin(name, args, &input, ctx.cwd) {
            Some(outcome) => outcome,
            None => return spawn(cmd, input, ctx),
        },
    };
    if cmd.merge_stderr {
        let stderr = std::mem::take(&mut outcome.stderr);
        outcome.stdout.extend(stderr);
    }
    outcome
}

/// Tiny in-process stand-ins for coreutils, so tests need no shell tools.
fn builtin(name: &str, args: &[String], input: &[u8], cwd: &Path) -> Option<Outcome> {
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let mut code = 0;
    match name {
        "true" => {}
        "false" => code = 1,
        "echo" => {
            let (newline, words) = match args.split_first() {
                Some((flag, rest)) if flag == "-n" => (false, rest),
                _ => (true, args),
            };
            stdout.extend_from_slice(words.join(" ").as_bytes());
            if newline {
                stdout.push(b'\n');
            }
        }
        "cat" => {
            if args.is_empty() {
                stdout.extend_from_slice(input);
            }
            for arg in args {
                if arg == "-" {
                    stdout.extend_from_slice(input);
                    continue;
                }
                match fs::read(resolve(cwd, arg)) {
                    Ok(bytes) => stdout.extend(bytes),
                    Err(e) => {
                        code = 1;
                        stderr.extend_from_slice(format!("cat: {arg}: {e}\n").as_bytes());
                    }
                }
            }
        }
        "rm" | "mkdir" => {
            let (flags, paths): (Vec<&String>, Vec<&String>) =
                args.iter().partition(|a| a.starts_with('-') && a.len() > 1);
            let has = |c: char| flags.iter().any(|f| f.contains(c));
            for path in paths {
                let full = resolve(cwd, path);
                let result = if name == "mkdir" {
                    if has('p') {
                        fs::create_dir_all(&full)
                    } else {
                        fs::create_dir(&full)
                    }
                } else {
                    let result = match fs::symlink_metadata(&full) {
                        Ok(meta) if meta.is_dir() && (has('r') || has('R')) => {
                            fs::remove_dir_all(&full)
                        }
                        Ok(_) => fs::remove_file(&full),
                        Err(e) => Err(e),
                    };
                    match result {
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound && has('f') => Ok(()),
                        other => other,
                    }
                };
                if let Err(e) = result {
                    code = 1;
                    stderr.extend_from_slice(format!("{name}: {path}: {e}\n").as_bytes());
                }
            }
        }
        _ => return None,
    }
    Some(Outcome::exited(code, stdout, stderr))
}

fn spawn(cmd: &Command, input: Vec<u8>, ctx: &Context<'_>) -> Outcome {
    let Some((program, args)) = cmd.argv.split_first() else {
        return Outcome::error("empty command".to_owned());
    };
    let program = if program == "efopt" {
        ctx.efopt.to_path_buf()
    } else if program.contains('/') {
        // std resolves relative program paths against our own cwd, not the child's.
        resolve(ctx.cwd, program)
    } else {
        PathBuf::from(program)
    };
    let mut child = std::process::Command::new(&program);
    child
        .args(args)
        .current_dir(ctx.cwd)
        // Diagnostics are matched as plain text; a test may still override this.
        .env("NO_COLOR", "1")
        // A candidate `extract` drops as wrong is a bug: it fails the test (a test about the
        // net itself sets `env EFOPT_WRONG_CANDIDATES=warn`).
        .env("EFOPT_WRONG_CANDIDATES", "error")
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped());

    // For `2>&1`, give the child one file as both stdout and stderr so their
    // interleaving is preserved, as with a shell.
    let merged = if cmd.merge_stderr {
        match fs::File::create(&ctx.merge_file).and_then(|f| Ok((f.try_clone()?, f))) {
            Ok((out, err)) => {
                child.stdout(out).stderr(err);
                true
            }
            Err(e) => {
                let path = ctx.merge_file.display();
                return Outcome::error(format!("cannot create `{path}` for 2>&1: {e}"));
            }
        }
    } else {
        child.stdout(Stdio::piped()).stderr(Stdio::piped());
        false
    };

    let mut child = match child.spawn() {
        Ok(child) => child,
        Err(e) => return Outcome::error(format!("cannot run `{}`: {e}", program.display())),
    };
    // Feed stdin from a thread: a child that writes a lot before reading
    // would otherwise deadlock against us. Write errors (EPIPE from a child
    // that ignores its input) are irrelevant.
    let stdin = child.stdin.take();
    let writer = std::thread::spawn(move || {
        if let Some(mut stdin) = stdin {
            let _ = stdin.write_all(&input);
        }
    });
    let output = child.wait_with_output();
    let _ = writer.join();
    let output = match output {
        Ok(output) => output,
        Err(e) => return Outcome::error(format!("waiting for `{}`: {e}", program.display())),
    };

    let stdout = if merged {
        let bytes = fs::read(&ctx.merge_file);
        let _ = fs::remove_file(&ctx.merge_file);
        match bytes {
            Ok(bytes) => bytes,
            Err(e) => return Outcome::error(format!("cannot read back 2>&1 output: {e}")),
        }
    } else {
        output.stdout
    };
    let status = match output.status.code() {
        Some(code) => Status::Exited(code),
        None => Status::Killed(output.status.to_string()),
    };
    Outcome {
        status,
        stdout,
        stderr: output.stderr,
        filecheck: None,
    }
}

/// In-process FileCheck via litcheck. Exits 1 on a mismatch, so `not FileCheck`
/// works; bad usage is a harness error.
fn filecheck(args: &[String], input: &[u8], cwd: &Path) -> Outcome {
    let options = match filecheck_options(args) {
        Ok(options) => options,
        Err(message) => return Outcome::error(format!("FileCheck: {message}")),
    };
    let (options, check_path, input_path) = options;
    let input = match input_path {
        Some(path) => match fs::read(resolve(cwd, &path)) {
            Ok(bytes) => bytes,
            Err(e) => return Outcome::error(format!("FileCheck: cannot read `{path}`: {e}")),
        },
        None => input.to_vec(),
    };
    let check_path = resolve(cwd, &check_path);
    let check_text = match fs::read_to_string(&check_path) {
        Ok(text) => text,
        Err(e) => {
            let path = check_path.display();
            return Outcome::error(format!("FileCheck: cannot read check file `{path}`: {e}"));
        }
    };

    let config = Config {
        source_manager: Arc::new(DefaultSourceManager::default()),
        options,
    };
    let result = config.options.validate().and_then(|()| {
        let manager = config.source_manager();
        let match_file = manager.load(
            SourceLanguage::Unknown,
            FileName::from(check_path.clone()),
            check_text,
        );
        let input_file = manager.load(
            SourceLanguage::Unknown,
            FileName::from("<stdin>"),
            String::from_utf8_lossy(&input).into_owned(),
        );
        Test::new(match_file, &config).verify(input_file)
    });
    let (code, diagnostic) = match result {
        Ok(_) => (0, None),
        Err(report) => (1, Some(render(&report))),
    };
    Outcome {
        filecheck: Some((input, diagnostic)),
        ..Outcome::exited(code, Vec::new(), Vec::new())
    }
}

type FileCheckArgs = (Options, String, Option<String>);

/// Parses the subset of LLVM FileCheck's command line that tests use.
fn filecheck_options(args: &[String]) -> Result<FileCheckArgs, String> {
    let mut options = Options::default();
    let mut check_file = None;
    let mut input_file = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        // LLVM accepts both `-opt` and `--opt`, with `=value` or a separate value.
        let Some(option) = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-').filter(|o| !o.is_empty()))
        else {
            if check_file.replace(arg.clone()).is_some() {
                return Err(format!("more than one check file given (`{arg}`)"));
            }
            continue;
        };
        let (name, inline) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (option, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next().cloned())
                .ok_or_else(|| format!("option `{arg}` needs a value"))
        };
        let prefixes = |value: String| -> Result<Vec<Symbol>, String> {
            value
                .split(',')
                .map(|p| match p {
                    "" => Err(format!("empty prefix in `{arg}`")),
                    p => Ok(Symbol::intern(p)),
                })
                .collect()
        };
        match name {
            "check-prefix" | "check-prefixes" => {
                options.check_prefixes.extend(prefixes(value()?)?);
            }
            "comment-prefixes" => options.comment_prefixes = prefixes(value()?)?,
            "implicit-check-not" => options.implicit_check_not.push(Symbol::intern(value()?)),
            "input-file" => input_file = Some(value()?),
            "match-full-lines" => options.match_full_lines = true,
            "strict-whitespace" => options.strict_whitespace = true,
            "allow-empty" => options.allow_empty = true,
            "allow-unused-prefixes" => options.allow_unused_prefixes = true,
            "ignore-case" => options.ignore_case = true,
            "enable-var-scope" => options.enable_var_scope = true,
            // The harness always reports failures with the searched input.
            "dump-input" | "dump-input-filter" => {
                value()?;
            }
            _ => return Err(format!("unsupported option `{arg}`")),
        }
    }
    let check_file = check_file.ok_or("no check file given (usually `FileCheck %s`)")?;
    Ok((options, check_file, input_file))
}

/// Renders a litcheck report as plain text: the narratable handler never
/// emits colors, and works without miette's `fancy` feature.
fn render(report: &Report) -> String {
    let diagnostic: &dyn Diagnostic = report.as_ref();
    let mut text = String::new();
    if NarratableReportHandler::new()
        .render_report(&mut text, diagnostic)
        .is_err()
    {
        return format!("{report:?}");
    }
    // The narratable format labels every entry's severity; that is noise here.
    text.lines()
        .filter(|line| !line.trim_start().starts_with("Diagnostic severity:"))
        .fold(String::new(), |mut out, line| {
            out.push_str(line);
            out.push('\n');
            out
        })
}
