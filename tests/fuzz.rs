//! Fuzz and stress tests of the front end, verifier, printer and interpreter.
//!
//! The main test, [`fuzz`], feeds two kinds of input through the library API in-process:
//! - well-formed programs from a small random generator (shapes, dtypes, pointwise ops,
//!   reductions, matmuls, partition/replicate/combination/collection chains, user reducers),
//!   built statement by statement with the verifier as the oracle for what type-checks;
//! - random mutations of those programs and of every `.ef` file in `examples/` and
//!   `tests/lit` (delete, duplicate, swap and replace tokens and lines, rename identifiers,
//!   splice files, truncate, extreme numbers, insert NUL, control and non-ASCII characters);
//!   byte-level mutations (invalid UTF-8, NUL, characters cut in half) go to the binary.
//!
//! Every case is parsed; diagnostics are rendered (without panicking; their spans must start
//! inside the input);
//! whatever parses is printed, re-parsed and printed again (the text must be a fixed point,
//! with and without `--print-types`-style annotations, and must verify exactly when the
//! input does); small verified programs run in the interpreter, and so does their printed
//! form, which must compute bit-identical results; every verified function goes through
//! `lower`'s kernel graph, traffic and Triton emission, which may refuse it but not panic. A fraction of the byte-level mutations
//! also goes through the `efopt` binary, which must exit 0 or 1 (never panic or crash).
//! Any panic, fixed-point violation, or interpreter error on a verified program (other than
//! a size limit) fails the test, printing a shrunken reproducer for each distinct failure.
//!
//! Environment: `EFOPT_FUZZ_SECS=N` runs for N seconds instead of the default fixed number
//! of cases; `EFOPT_FUZZ_SEED=S` sets the seed (default: fixed, or time-based with
//! `EFOPT_FUZZ_SECS`); `EFOPT_FUZZ_OUT=DIR` writes each failure's shrunken reproducer to
//! DIR; `EFOPT_FUZZ_NO_SHRINK=1` reports failures unshrunk; `EFOPT_FUZZ_SHOW=N` prints the
//! first N generated programs.
//!
//! The other tests are stress cases: a 10,000-statement program, a 1,000,000-term sum on one
//! line, 100,000 nested parentheses, and empty, NUL and invalid UTF-8 input to the binary.

use crate::common;

use common::{gen, Rng};
use efopt::diag::{Diagnostic, SourceMap};
use efopt::interp::{random_inputs, Interpreter, Sizes, Value};
use efopt::ir::print::{print_module, PrintOptions};
use efopt::ir::{Module, TensorType, Type};
use efopt::parse::parse_module;
use efopt::verify::verify_module;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, Once};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Panics: caught per stage, with the message and location recorded by a quiet hook.

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(|q| q.get()) {
                let location = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let message = payload_text(info.payload());
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{message} (at {location})")));
            } else {
                previous(info);
            }
        }));
    });
}

/// A failed check, with the input that caused it.
#[derive(Clone, Debug)]
struct Failure {
    kind: String,
    detail: String,
    input: Vec<u8>,
    /// Command-line arguments, for failures of the binary.
    args: Option<Vec<String>>,
}

impl Failure {
    fn new(kind: impl Into<String>, detail: impl Into<String>) -> Failure {
        Failure {
            kind: kind.into(),
            detail: detail.into(),
            input: Vec::new(),
            args: None,
        }
    }

    fn on(mut self, input: &[u8]) -> Failure {
        if self.input.is_empty() {
            self.input = input.to_vec();
        }
        self
    }

    /// What identifies a distinct bug: the kind and the first line of the detail with
    /// numbers blanked out (byte offsets, sizes and line numbers vary between inputs).
    fn signature(&self) -> String {
        // Up to the first `;`: later messages are often cascades of the first.
        let first = self.detail.lines().next().unwrap_or("");
        let first = first.split(';').next().unwrap_or("");
        let mut sig = String::new();
        let mut in_number = false;
        for c in first.chars() {
            if c.is_ascii_digit() {
                if !in_number {
                    sig.push('#');
                }
                in_number = true;
            } else {
                in_number = false;
                sig.push(c);
            }
        }
        format!("{}: {}", self.kind, sig)
    }
}

/// Runs `f`, turning a panic into a [`Failure`] that names `stage`.
fn guarded<T>(stage: &str, f: impl FnOnce() -> T) -> Result<T, Failure> {
    let was_quiet = QUIET.with(|q| q.replace(true));
    LAST_PANIC.with(|p| p.borrow_mut().take());
    let result = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was_quiet));
    result.map_err(|payload| {
        let message = LAST_PANIC
            .with(|p| p.borrow_mut().take())
            .unwrap_or_else(|| payload_text(&*payload));
        Failure::new(format!("panic in {stage}"), message)
    })
}

// ---------------------------------------------------------------------------------------
// The checks applied to every input.

#[derive(Default, Debug, Clone)]
struct Stats {
    cases: u64,
    parsed: u64,
    verified: u64,
    interpreted: u64,
    lowered: u64,
    refused_by_lower: u64,
    generated: u64,
    cli_runs: u64,
    oracle_calls: u64,
}

fn print(m: &Module, types: bool) -> String {
    print_module(m, PrintOptions { types })
}

fn messages(diags: &[Diagnostic]) -> String {
    diags
        .iter()
        .map(|d| d.message.clone())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Renders diagnostics as the binary would, and checks that their spans lie inside the
/// input on character boundaries.
fn render_all(text: &str, diags: &[Diagnostic]) -> Result<(), Failure> {
    for d in diags {
        let spans = d
            .span
            .iter()
            .chain(d.notes.iter().filter_map(|n| n.span.as_ref()));
        for s in spans {
            let (start, end) = (s.start as usize, s.end as usize);
            // The renderer clamps spans to the input and snaps them to character
            // boundaries, so only a span that starts past the end is a wrong location.
            let problem = if start > end {
                Some("a reversed span")
            } else if start > text.len() {
                Some("a span that starts past the end of the input")
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(Failure::new(
                    format!("diagnostic with {problem}"),
                    format!(
                        "span {start}..{end} of an input of {} bytes: {}",
                        text.len(),
                        d.message
                    ),
                ));
            }
        }
    }
    let mut sources = SourceMap::default();
    sources.add("<fuzz>", text.to_string());
    guarded("rendering diagnostics", || {
        let mut out = Vec::new();
        for d in diags {
            sources.render(d, false, &mut out);
        }
        out
    })?;
    Ok(())
}

/// Parses printed text, which must succeed.
fn reparse(printed: &str, what: &str) -> Result<Module, Failure> {
    match guarded("parse_module (printed form)", || parse_module(printed, 0))? {
        Ok(m) => Ok(m),
        Err(diags) => Err(Failure::new(
            "printed form does not parse",
            format!("{what}: {}\n--- printed:\n{printed}", messages(&diags)),
        )),
    }
}

fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}: `{x}` then `{y}`", i + 1);
        }
    }
    format!(
        "{} lines then {} lines",
        a.lines().count(),
        b.lines().count()
    )
}

/// Benign interpreter refusals: sizes, unbound sizes, extents that do not divide.
fn benign_interp_error(message: &str) -> bool {
    [
        "interpreter's limit",
        "overflows",
        "does not divide",
        // A slice whose bounds hold symbolically but not at the sizes run at.
        "is out of range for a dimension",
        "has no size",
        "has no extent",
    ]
    .iter()
    .any(|s| message.contains(s))
}

/// Whether a verified module is small enough to interpret quickly: every typed value under
/// 2^16 elements under the default sizes.
fn small_enough(m: &Module) -> bool {
    for f in &m.funcs {
        if f.bindings.iter().any(|b| b.value > 256) {
            return false;
        }
        let sizes = Sizes::for_function(f, 4);
        for n in &f.body.nodes {
            let mut leaves = Vec::new();
            if let Some(t) = &n.ty {
                tensor_leaves(t, &mut leaves);
            }
            for t in leaves {
                match sizes.eval_shape(&t.shape) {
                    Ok(shape) => {
                        let count = shape
                            .iter()
                            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
                        if count.is_none_or(|c| c > 1 << 16) {
                            return false;
                        }
                    }
                    Err(_) => return false,
                }
            }
        }
    }
    true
}

fn tensor_leaves<'a>(t: &'a Type, out: &mut Vec<&'a TensorType>) {
    match t {
        Type::Tensor(t) => out.push(t),
        Type::Tuple(fs) => fs.iter().for_each(|f| tensor_leaves(f, out)),
    }
}

/// Runs every function of `m` on seeded inputs. `None` when a run is refused for its size.
fn interpret(m: &Module) -> Result<Option<Vec<Vec<Value>>>, Failure> {
    let mut all = Vec::new();
    for f in &m.funcs {
        let sizes = Sizes::for_function(f, 4);
        let inputs = match guarded("random_inputs", || random_inputs(f, &sizes, 7, 1.0))? {
            Ok(inputs) => inputs,
            Err(e) if benign_interp_error(&e.message) => return Ok(None),
            Err(e) => {
                return Err(Failure::new(
                    "random_inputs fails on a verified program",
                    e.message,
                ))
            }
        };
        let result = guarded("the interpreter", || {
            Interpreter::new(m, sizes.clone()).run(f, &inputs)
        })?;
        match result {
            Ok(values) => all.push(values),
            Err(e) if benign_interp_error(&e.message) => return Ok(None),
            Err(e) => {
                return Err(Failure::new(
                    "interpreter error on a verified program",
                    format!("function `{}`: {}", f.name, e.message),
                ))
            }
        }
    }
    Ok(Some(all))
}

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn compare_results(a: &[Vec<Value>], b: &[Vec<Value>]) -> Result<(), String> {
    for (fi, (ra, rb)) in a.iter().zip(b).enumerate() {
        if ra.len() != rb.len() {
            return Err(format!(
                "function {fi}: {} results vs {}",
                ra.len(),
                rb.len()
            ));
        }
        for (ri, (va, vb)) in ra.iter().zip(rb).enumerate() {
            let (la, lb) = (va.leaves(), vb.leaves());
            if la.len() != lb.len() {
                return Err(format!("function {fi} result {ri}: structure differs"));
            }
            for ((da, ta), (db, tb)) in la.iter().zip(&lb) {
                if da != db || ta.shape != tb.shape {
                    return Err(format!(
                        "function {fi} result {ri}: {da} {:?} vs {db} {:?}",
                        ta.shape, tb.shape
                    ));
                }
                if let Some(i) = (0..ta.data.len()).find(|&i| !same_bits(ta.data[i], tb.data[i])) {
                    return Err(format!(
                        "function {fi} result {ri}: element {i} is {} vs {}",
                        ta.data[i], tb.data[i]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The full check of one input text.
fn check_text(text: &str, stats: &mut Stats) -> Result<(), Failure> {
    stats.cases += 1;
    let at = |f: Failure| f.on(text.as_bytes());
    let parsed = guarded("parse_module", || parse_module(text, 0)).map_err(at)?;
    let mut m = match parsed {
        Ok(m) => m,
        Err(diags) => {
            if diags.is_empty() {
                return Err(at(Failure::new(
                    "parse error without a diagnostic",
                    String::new(),
                )));
            }
            return render_all(text, &diags).map_err(at);
        }
    };
    stats.parsed += 1;

    // Printing is a fixed point after one round, also for modules that do not verify.
    let once = guarded("print_module", || print(&m, false)).map_err(at)?;
    let mut again = reparse(&once, "untyped").map_err(at)?;
    let twice = guarded("print_module (printed form)", || print(&again, false)).map_err(at)?;
    if once != twice {
        return Err(at(Failure::new(
            "printing is not a fixed point",
            format!(
                "{}\n--- first print:\n{once}\n--- second print:\n{twice}",
                first_difference(&once, &twice)
            ),
        )));
    }

    let verified = guarded("verify_module", || verify_module(&mut m)).map_err(at)?;
    let again_verified =
        guarded("verify_module (printed form)", || verify_module(&mut again)).map_err(at)?;
    match (&verified, &again_verified) {
        (Err(diags), Err(_)) => return render_all(text, diags).map_err(at),
        (Ok(_), Ok(_)) => {}
        (Ok(_), Err(diags)) => {
            return Err(at(Failure::new(
                "the printed form of a verified module does not verify",
                format!("{}\n--- printed:\n{once}", messages(diags)),
            )))
        }
        (Err(diags), Ok(_)) => {
            return Err(at(Failure::new(
                "the printed form verifies but the input does not",
                format!("{}\n--- printed:\n{once}", messages(diags)),
            )))
        }
    }
    stats.verified += 1;

    // With every inferred type printed, the text still parses, verifies and is a fixed point.
    let typed = guarded("print_module (types)", || print(&m, true)).map_err(at)?;
    let mut typed_again = reparse(&typed, "typed").map_err(at)?;
    if let Err(diags) = guarded("verify_module (typed form)", || {
        verify_module(&mut typed_again)
    })
    .map_err(at)?
    {
        return Err(at(Failure::new(
            "the typed printed form does not verify",
            format!("{}\n--- printed:\n{typed}", messages(&diags)),
        )));
    }
    let typed_twice =
        guarded("print_module (typed form)", || print(&typed_again, true)).map_err(at)?;
    if typed != typed_twice {
        return Err(at(Failure::new(
            "printing with types is not a fixed point",
            format!(
                "{}\n--- first print:\n{typed}\n--- second print:\n{typed_twice}",
                first_difference(&typed, &typed_twice)
            ),
        )));
    }

    // Every verified function goes through the kernel graph, its traffic and the Triton
    // emitter: a refusal is an answer, a panic is a failure.
    for f in &m.funcs {
        guarded("lower (kernel graph and cost)", || {
            efopt::lower::cost(f, &efopt::lower::kernel_graph(f))
        })
        .map_err(at)?;
        let Ok(info) = &verified else { continue };
        let planned = guarded("lower (kernel plan)", || {
            efopt::lower::plan(info, f).map(|p| {
                let schedule = efopt::lower::Schedule::default_for(&p);
                let mut names = efopt::ir::print::Namer::default();
                efopt::backend::triton::emit_function(&p, &schedule, Default::default(), &mut names)
                    .map(|_| ())
                    .map_err(|(_, m)| m)
            })
        })
        .map_err(at)?;
        match planned {
            Ok(Ok(())) => stats.lowered += 1,
            Ok(Err(m)) => {
                return Err(at(Failure::new(
                    "the Triton writer refused a planned function",
                    format!("{m}\n--- {}", f.name),
                )))
            }
            Err(_) => stats.refused_by_lower += 1,
        }
    }

    // Small programs run, and their printed form computes the same values.
    if small_enough(&m) {
        if let Some(want) = interpret(&m).map_err(at)? {
            stats.interpreted += 1;
            if let Some(got) = interpret(&again).map_err(at)? {
                if let Err(e) = compare_results(&want, &got) {
                    return Err(at(Failure::new(
                        "the printed form computes different values",
                        format!("{e}\n--- printed:\n{once}"),
                    )));
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The binary, for byte-level input.

fn efopt_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_efopt"))
}

struct CliOutcome {
    code: Option<i32>,
    stderr: Vec<u8>,
    timed_out: bool,
}

fn run_cli(args: &[String], stdin: &[u8], limit: Duration) -> CliOutcome {
    let mut child = match Command::new(efopt_binary())
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("cannot run {}: {e}", efopt_binary().display()),
    };
    let mut pipe_in = child.stdin.take();
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        if let Some(s) = pipe_in.as_mut() {
            let _ = s.write_all(&input);
        }
        drop(pipe_in);
    });
    let mut pipe_err = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(s) = pipe_err.as_mut() {
            let _ = s.read_to_end(&mut buf);
        }
        buf
    });
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() > limit => {
                timed_out = true;
                let _ = child.kill();
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => break None,
        }
    };
    let _ = writer.join();
    let stderr = reader.join().unwrap_or_default();
    CliOutcome {
        code: status.and_then(|s| s.code()),
        stderr,
        timed_out,
    }
}

/// The binary must finish in time with exit code 0 or 1.
fn check_cli(args: &[String], input: &[u8], stats: &mut Stats) -> Result<(), Failure> {
    stats.cli_runs += 1;
    let out = run_cli(args, input, Duration::from_secs(20));
    let fail = |kind: &str, detail: String| Failure {
        kind: kind.into(),
        detail,
        input: input.to_vec(),
        args: Some(args.to_vec()),
    };
    let tail = || {
        let text = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("at ") && !l.contains("rustc/"))
            .take(6)
            .collect();
        lines.join("\n")
    };
    if out.timed_out {
        return Err(fail("efopt timed out", "no exit within 20 s".into()));
    }
    match out.code {
        Some(0) | Some(1) => Ok(()),
        Some(101) => Err(fail("efopt panicked (exit 101)", tail())),
        Some(c) => Err(fail(
            "efopt exited with an unexpected code",
            format!("{c}: {}", tail()),
        )),
        None => Err(fail("efopt was killed by a signal", tail())),
    }
}

// ---------------------------------------------------------------------------------------
// The program generator (shared: `tests/common/gen.rs`).

/// Generates one well-formed program (it parses and verifies by construction).
fn generate(rng: &mut Rng, stats: &mut Stats, index: u64) -> (String, Vec<Failure>) {
    stats.generated += 1;
    let mut oracle = |text: &str| -> gen::OracleResult {
        guarded("parse_module", || parse_module(text, 0))
            .and_then(|r| match r {
                Ok(mut m) => guarded("verify_module", || verify_module(&mut m).map(|_| m)),
                Err(d) => Ok(Err(d)),
            })
            .map(Result::ok)
            .map_err(|f| (f.kind, f.detail))
    };
    let generated = gen::generate(rng, gen::Mode::Full, index, &mut oracle);
    stats.oracle_calls += generated.oracle_calls;
    let failures = generated
        .problems
        .into_iter()
        .map(|p| Failure::new(p.kind, p.detail).on(p.input.as_bytes()))
        .collect();
    (generated.text, failures)
}

// ---------------------------------------------------------------------------------------
// Mutations.

const DICTIONARY: &[&str] = &[
    "func",
    "where",
    "reducer",
    "return",
    "input",
    "constant",
    "reduce",
    "tensor",
    "egraph",
    "eclass",
    "root",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "<",
    ">",
    ",",
    ":",
    "=",
    "+",
    "-",
    "*",
    "/",
    "|",
    "\n",
    " ",
    "@add",
    "@max",
    "@rolling",
    "@nope",
    "%0",
    "%99",
    "M",
    "K",
    "N",
    "Q",
    "1",
    "0",
    "4096",
    "18446744073709551616",
    "99999999999",
    "1e308",
    "-inf",
    "nan",
    "0.5",
    "p",
    "q",
    "m",
    "x",
    "a",
    "f32",
    "bf16",
    "i1",
    "i32",
    "f64",
    "axis=",
    "parallel=",
    "reducer=",
    "keep_dims",
    "acc=f32",
    "to=i32",
    "partition",
    "replicate",
    "combination",
    "collection",
    "tile_matmul",
    "matmul",
    "transpose[1,0]",
    "slice[0,0,1]",
    "slice[K,1,K2]",
    "concat[0]",
    "K2 = K + K",
    "HD = NH*D",
    "reshape",
    "broadcast",
    "get",
    "tuple",
    "select",
    "fill[0.0]",
    "iota[M]",
    "exp",
    "mul",
    "partition(K,p)",
    "partial(p)",
    "replicate(p)",
    "(K/p)",
    "|p|",
    "// -----",
    "//",
    "λ",
    "\u{7f}",
    "\t",
    "\r\n",
    "x(",
];

fn tokens(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut kind = 0u8;
    for (i, c) in s.char_indices() {
        let k = if c.is_alphanumeric() || "_.@%".contains(c) {
            1
        } else if c == ' ' || c == '\t' {
            2
        } else {
            3
        };
        if i > start && (k != kind || k == 3) {
            out.push(&s[start..i]);
            start = i;
        }
        kind = k;
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// One to four text-level mutations of `text` (the result is valid UTF-8).
fn mutate_text(rng: &mut Rng, text: &str, corpus: &[String]) -> String {
    let mut s = text.to_string();
    for _ in 0..1 + rng.below(4) {
        let toks: Vec<String> = tokens(&s).into_iter().map(str::to_string).collect();
        let n = toks.len().max(1);
        s = match rng.below(11) {
            0 => {
                let i = rng.below(n);
                toks.iter()
                    .enumerate()
                    .filter(|(k, _)| *k != i)
                    .map(|(_, t)| t.as_str())
                    .collect()
            }
            1 => {
                let i = rng.below(n);
                let mut t = toks.clone();
                if let Some(x) = t.get(i).cloned() {
                    t.insert(i, x);
                }
                t.concat()
            }
            2 => {
                let mut t = toks.clone();
                if !t.is_empty() {
                    let (i, j) = (rng.below(n), rng.below(n));
                    let last = t.len() - 1;
                    t.swap(i.min(last), j.min(last));
                }
                t.concat()
            }
            3 => {
                let mut t = toks.clone();
                if !t.is_empty() {
                    let i = rng.below(t.len());
                    t[i] = rng.pick(DICTIONARY).to_string();
                }
                t.concat()
            }
            4 => {
                let mut t = toks.clone();
                let i = rng.below(t.len() + 1);
                t.insert(i, rng.pick(DICTIONARY).to_string());
                t.concat()
            }
            5 => {
                let cut = floor_boundary(&s, rng.below(s.len() + 1));
                s[..cut].to_string()
            }
            6 => {
                // Splice: a prefix of this text with a suffix of another.
                let other = rng.pick(corpus);
                let a = floor_boundary(&s, rng.below(s.len() + 1));
                let b = floor_boundary(other, rng.below(other.len() + 1));
                format!("{}{}", &s[..a], &other[b..])
            }
            7 => {
                // Line-level: delete, duplicate or move a line.
                let mut lines: Vec<&str> = s.split_inclusive('\n').collect();
                if !lines.is_empty() {
                    let i = rng.below(lines.len());
                    match rng.below(3) {
                        0 => {
                            lines.remove(i);
                        }
                        1 => lines.insert(i, lines[i]),
                        _ => {
                            let l = lines.remove(i);
                            let j = rng.below(lines.len() + 1);
                            lines.insert(j, l);
                        }
                    }
                }
                lines.concat()
            }
            8 => {
                // Replace a number with an extreme one.
                let mut t = toks.clone();
                let nums: Vec<usize> = (0..t.len())
                    .filter(|&i| t[i].starts_with(|c: char| c.is_ascii_digit()))
                    .collect();
                if !nums.is_empty() {
                    let i = *rng.pick(&nums);
                    t[i] = rng
                        .pick(&[
                            "0",
                            "1",
                            "3",
                            "7",
                            "1024",
                            "99999999999",
                            "18446744073709551615",
                            "1e308",
                            "1e-320",
                            "0.0",
                            "4294967296",
                        ])
                        .to_string();
                }
                t.concat()
            }
            9 => {
                // Insert random characters (NUL, controls, non-ASCII).
                let at = floor_boundary(&s, rng.below(s.len() + 1));
                let c = *rng.pick(&['\0', '\u{1}', '\u{fffd}', 'é', '\u{feff}', '\u{2028}', '#']);
                format!("{}{}{}", &s[..at], c, &s[at..])
            }
            _ => {
                // Rename: replace every occurrence of one identifier with another token.
                let words: Vec<&String> = toks
                    .iter()
                    .filter(|t| t.starts_with(|c: char| c.is_alphabetic()))
                    .collect();
                if words.is_empty() {
                    s.clone()
                } else {
                    let w = (*rng.pick(&words)).clone();
                    let to = rng.pick(DICTIONARY).to_string();
                    toks.iter()
                        .map(|t| if *t == w { to.as_str() } else { t.as_str() })
                        .collect()
                }
            }
        };
        if s.len() > 200_000 {
            s.truncate(floor_boundary(&s, 200_000));
        }
    }
    s
}

/// Byte-level mutations for the binary: invalid UTF-8, NUL bytes, truncation mid-character.
fn mutate_bytes(rng: &mut Rng, text: &str) -> Vec<u8> {
    let mut b = text.as_bytes().to_vec();
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(b.len() + 1);
        match rng.below(5) {
            0 => b.insert(at, 0),
            1 => b.insert(
                at,
                *rng.pick(&[0x80, 0xbf, 0xc0, 0xc3, 0xe2, 0xf0, 0xfe, 0xff]),
            ),
            2 => b.truncate(at),
            3 => {
                let bytes: Vec<u8> = (0..1 + rng.below(8)).map(|_| rng.next() as u8).collect();
                b.splice(at..at, bytes);
            }
            _ => {
                // Cut a multi-byte character in half.
                let multi = "λé€😀".as_bytes();
                let k = rng.below(multi.len());
                b.splice(at..at, multi[..k.max(1)].iter().copied());
            }
        }
    }
    b
}

const CLI_FLAGS: &[&[&str]] = &[
    &[],
    &["--split-input-file"],
    &["--print-types"],
    &["--passes=verify", "--print-ir-after-all"],
    &["--split-input-file", "--verify-diagnostics"],
    &["--split-input-file", "--print-types", "--timing"],
    &["--stats=json"],
];

// ---------------------------------------------------------------------------------------
// The corpus: every .ef file in examples/ and tests/lit, and each `// -----` chunk.

fn ef_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            ef_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "ef") {
            out.push(p);
        }
    }
}

fn corpus() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    ef_files(&root.join("examples"), &mut files);
    ef_files(&root.join("tests/lit"), &mut files);
    let mut out = Vec::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for chunk in text.split("\n// -----\n") {
            if chunk.contains("func") || chunk.contains("reducer") || chunk.contains("egraph") {
                out.push(chunk.to_string());
            }
        }
        out.push(text);
    }
    assert!(!out.is_empty(), "no corpus files found");
    out
}

// ---------------------------------------------------------------------------------------
// Failure collection, shrinking and the report.

#[derive(Default)]
struct Findings {
    by_signature: BTreeMap<String, (Failure, u64)>,
}

impl Findings {
    fn add(&mut self, f: Failure) {
        let sig = f.signature();
        let entry = self.by_signature.entry(sig).or_insert((f.clone(), 0));
        entry.1 += 1;
        if f.input.len() < entry.0.input.len() {
            entry.0 = f;
        }
    }
}

/// Reproduces a failure's signature on `input`.
fn reproduces(f: &Failure, input: &[u8]) -> bool {
    let mut stats = Stats::default();
    let got = match &f.args {
        Some(args) => check_cli(args, input, &mut stats),
        None => match std::str::from_utf8(input) {
            Ok(text) => check_text(text, &mut stats),
            Err(_) => return false,
        },
    };
    got.err().is_some_and(|g| g.signature() == f.signature())
}

/// Greedy shrinking by lines, then tokens, then characters, within a time budget.
fn shrink(f: &Failure, budget: Duration) -> Vec<u8> {
    let start = Instant::now();
    let mut best = f.input.clone();
    let Ok(text) = String::from_utf8(best.clone()) else {
        return best;
    };
    let is_cli = f.args.is_some();
    let mut current = text;
    for unit in 0..3 {
        let mut pieces: Vec<String> = match unit {
            0 => current.split_inclusive('\n').map(str::to_string).collect(),
            1 => tokens(&current).into_iter().map(str::to_string).collect(),
            _ => current.chars().map(|c| c.to_string()).collect(),
        };
        let mut chunk = (pieces.len() / 2).max(1);
        while chunk >= 1 {
            let mut i = 0;
            while i < pieces.len() {
                if start.elapsed() > budget || (is_cli && pieces.len() > 400 && unit == 2) {
                    return best;
                }
                let end = (i + chunk).min(pieces.len());
                let candidate: String = pieces[..i].concat() + &pieces[end..].concat();
                if reproduces(f, candidate.as_bytes()) {
                    pieces.drain(i..end);
                    best = candidate.into_bytes();
                } else {
                    i += chunk;
                }
            }
            if chunk == 1 {
                break;
            }
            chunk /= 2;
        }
        current = String::from_utf8(best.clone()).unwrap_or_default();
    }
    best
}

fn shown(input: &[u8]) -> String {
    let text = String::from_utf8_lossy(input);
    let text: String = text
        .chars()
        .map(|c| match c {
            '\0' => "\\0".to_string(),
            c if c.is_control() && c != '\n' => format!("\\u{{{:x}}}", c as u32),
            c => c.to_string(),
        })
        .collect();
    if text.len() > 3000 {
        format!(
            "{}\n… ({} bytes in all)",
            &text[..floor_boundary(&text, 3000)],
            input.len()
        )
    } else {
        text
    }
}

fn report(findings: &Findings) -> String {
    let mut out = String::new();
    let out_dir = std::env::var_os("EFOPT_FUZZ_OUT").map(PathBuf::from);
    for (n, (sig, (f, count))) in findings.by_signature.iter().enumerate() {
        let budget = if env_u64("EFOPT_FUZZ_SECS").is_some() {
            20
        } else {
            5
        };
        let small = if std::env::var_os("EFOPT_FUZZ_NO_SHRINK").is_some() {
            f.input.clone()
        } else {
            shrink(f, Duration::from_secs(budget))
        };
        out.push_str(&format!(
            "\n=== failure {}: {sig} (seen {count} times)\n{}\n",
            n + 1,
            f.detail.lines().take(12).collect::<Vec<_>>().join("\n")
        ));
        if let Some(args) = &f.args {
            out.push_str(&format!("--- efopt {} < input\n", args.join(" ")));
        }
        out.push_str(&format!(
            "--- reproducer ({} bytes):\n{}\n",
            small.len(),
            shown(&small)
        ));
        if let Some(dir) = &out_dir {
            let _ = std::fs::create_dir_all(dir);
            let _ = std::fs::write(dir.join(format!("failure-{}.ef.bin", n + 1)), &small);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// The main fuzz loop.

struct Budget {
    deadline: Option<Instant>,
    generated: u64,
    mutations: u64,
    cli: u64,
}

fn fuzz_loop(seed: u64, budget: Budget, progress: &Mutex<String>) -> (Stats, Findings) {
    let mut rng = Rng::new(seed);
    let mut stats = Stats::default();
    let mut findings = Findings::default();
    let mut corpus = corpus();
    let base_corpus = corpus.len();
    let started = Instant::now();
    let (mut generated, mut mutated, mut cli) = (0u64, 0u64, 0u64);
    let done = |g: u64, m: u64, c: u64| match budget.deadline {
        Some(d) => Instant::now() >= d,
        None => {
            (g >= budget.generated && m >= budget.mutations && c >= budget.cli)
                || started.elapsed() > Duration::from_secs(120)
        }
    };
    while !done(generated, mutated, cli) {
        // A generated program, checked as is.
        let (program, failures) = generate(&mut rng, &mut stats, generated);
        generated += 1;
        if generated <= env_u64("EFOPT_FUZZ_SHOW").unwrap_or(0) {
            eprintln!("--- generated program {generated}:\n{program}");
        }
        for f in failures {
            findings.add(f);
        }
        *progress.lock().unwrap() = program.clone();
        if let Err(f) = check_text(&program, &mut stats) {
            findings.add(f);
        }
        // Keep some generated programs as mutation seeds (bounded).
        if corpus.len() < base_corpus + 200 {
            corpus.push(program.clone());
        } else {
            let i = base_corpus + rng.below(200);
            corpus[i] = program.clone();
        }
        // Mutations: of this program and of corpus files.
        let per_round = (budget.mutations / budget.generated.max(1)).max(8);
        for k in 0..per_round {
            let seed_text = if k % 2 == 0 {
                program.clone()
            } else {
                rng.pick(&corpus).clone()
            };
            let text = mutate_text(&mut rng, &seed_text, &corpus);
            *progress.lock().unwrap() = text.clone();
            if let Err(f) = check_text(&text, &mut stats) {
                findings.add(f);
            }
            mutated += 1;
        }
        // Byte-level input through the binary, now and then.
        let cli_every = (budget.generated / budget.cli.max(1)).max(1);
        if generated % cli_every == 0 || budget.deadline.is_some() && rng.chance(1, 4) {
            let seed_text = rng.pick(&corpus).clone();
            let bytes = if rng.chance(1, 4) {
                mutate_text(&mut rng, &seed_text, &corpus).into_bytes()
            } else {
                mutate_bytes(&mut rng, &seed_text)
            };
            let flags: Vec<String> = rng.pick(CLI_FLAGS).iter().map(|s| s.to_string()).collect();
            *progress.lock().unwrap() = String::from_utf8_lossy(&bytes).into_owned();
            if let Err(f) = check_cli(&flags, &bytes, &mut stats) {
                findings.add(f);
            }
            cli += 1;
        }
    }
    (stats, findings)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn fuzz() {
    install_panic_hook();
    let secs = env_u64("EFOPT_FUZZ_SECS");
    let seed = env_u64("EFOPT_FUZZ_SEED").unwrap_or_else(|| match secs {
        Some(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        None => 0x5eed_ef0f,
    });
    let budget = Budget {
        deadline: secs.map(|s| Instant::now() + Duration::from_secs(s)),
        generated: 250,
        mutations: 5000,
        cli: 40,
    };
    // A watchdog: a case that hangs fails the test with the input it was working on.
    let progress = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel();
    let worker_progress = Arc::clone(&progress);
    let started = Instant::now();
    std::thread::Builder::new()
        .name("fuzz-worker".into())
        .stack_size(8 << 20)
        .spawn(move || {
            let result = fuzz_loop(seed, budget, &worker_progress);
            let _ = tx.send(result);
        })
        .expect("spawn the fuzz worker");
    let limit = Duration::from_secs(secs.unwrap_or(0) + 300);
    let (stats, findings) = match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(_) => panic!(
            "fuzz: no result after {limit:?} (seed {seed}); a case hangs. Input:\n{}",
            shown(progress.lock().unwrap().as_bytes())
        ),
    };
    let elapsed = started.elapsed();
    eprintln!(
        "fuzz: seed {seed:#x}, {:.1} s: {} cases ({} generated programs, {} oracle calls), {} parsed, {} verified, {} interpreted, {} functions lowered ({} refused by lower), {} runs of the binary; {} distinct failures",
        elapsed.as_secs_f64(),
        stats.cases,
        stats.generated,
        stats.oracle_calls,
        stats.parsed,
        stats.verified,
        stats.interpreted,
        stats.lowered,
        stats.refused_by_lower,
        stats.cli_runs,
        findings.by_signature.len()
    );
    assert!(
        stats.verified * 20 >= stats.generated,
        "too few generated programs verify ({} of {}): the generator is broken",
        stats.verified,
        stats.generated
    );
    if !findings.by_signature.is_empty() {
        panic!(
            "fuzz found {} distinct failure(s) (seed {seed:#x}; rerun with EFOPT_FUZZ_SEED={seed}):{}",
            findings.by_signature.len(),
            report(&findings)
        );
    }
}

// ---------------------------------------------------------------------------------------
// Stress cases.

/// A 10,000-statement program parses, verifies, prints (as a fixed point) and runs in
/// reasonable time.
#[test]
fn ten_thousand_statements() {
    install_panic_hook();
    let mut text = String::from(
        "func big where M = 4, N = 8 {\n  a: tensor<MxN, f32> = input\n  b: tensor<N, f32> = input\n",
    );
    let mut rng = Rng::new(42);
    let mut names = vec!["a".to_string()];
    for i in 0..10_000 {
        let x = rng.pick(&names).clone();
        let y = names[names.len() - 1].clone();
        let expr = match i % 7 {
            0 => format!("{x} + {y}"),
            1 => format!("tanh({x}) * b"),
            2 => format!("maximum({x}, {y}) - 0.5"),
            3 => format!("combination[M,p](partition[M,p]({x}) * replicate[p](b))"),
            4 => format!("{x} / (abs({y}) + 1.0)"),
            5 => format!("select(less({x}, {y}), {x}, {y})"),
            _ => format!("{x} - reduce {y} axis=N reducer=@max keep_dims"),
        };
        let name = format!("v{i}");
        text.push_str(&format!("  {name} = {expr}\n"));
        names.push(name);
    }
    text.push_str("  return v9999\n}\n");
    let start = Instant::now();
    let mut m = parse_module(&text, 0).expect("the big program parses");
    let parsed = start.elapsed();
    verify_module(&mut m).expect("the big program verifies");
    let verified = start.elapsed();
    let once = print(&m, true);
    let again = parse_module(&once, 0).expect("its printed form parses");
    assert_eq!(once, print(&again, true), "printing is not a fixed point");
    let printed = start.elapsed();
    let mut stats = Stats::default();
    check_text(&text, &mut stats).unwrap_or_else(|f| panic!("{}: {}", f.kind, f.detail));
    eprintln!(
        "10,000 statements: parse {parsed:?}, verify {:?}, print+reparse {:?}, full check {:?}",
        verified - parsed,
        printed - verified,
        start.elapsed() - printed
    );
    assert!(
        stats.interpreted == 1,
        "the big program was not interpreted"
    );
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "10,000 statements took {:?}",
        start.elapsed()
    );
}

/// 100,000 nested parentheses (and calls, brackets, unary minus signs) are an error, not a
/// stack overflow. This runs on the test's own (small) thread stack.
#[test]
fn deep_nesting_is_an_error() {
    install_panic_hook();
    let n = 100_000;
    // The last field says whether the error must be about nesting (the others may stop
    // at a syntax error first).
    let cases = [
        ("parentheses", "(".repeat(n) + "a" + &")".repeat(n), true),
        ("calls", "exp(".repeat(n) + "a" + &")".repeat(n), true),
        ("unclosed", "(".repeat(n) + "a", true),
        ("brackets", "[".repeat(n) + "0" + &"]".repeat(n), false),
        ("tuple literals", "<".repeat(n) + "a" + &">".repeat(n), true),
        ("unary minus", "-".repeat(n) + "a", true),
        ("neg calls", "neg(".repeat(n) + "a" + &")".repeat(n), true),
        (
            "tuple calls",
            "tuple(a, ".repeat(n) + "a" + &")".repeat(n),
            true,
        ),
        (
            "types",
            "a".to_string() + "\n  c: " + &"(".repeat(n) + "tensor<f32>" + &")".repeat(n) + " = a",
            false,
        ),
    ];
    for (what, expr, nesting) in cases {
        let text = format!(
            "func f where M = 4 {{\n  a: tensor<M, f32> = input\n  b = {expr}\n  return b\n}}\n"
        );
        let start = Instant::now();
        let result = guarded("parse_module", || parse_module(&text, 0))
            .unwrap_or_else(|f| panic!("{what}: {}: {}", f.kind, f.detail));
        let diags = match result {
            Ok(_) => panic!("{what}: 100,000 levels of nesting parsed without an error"),
            Err(d) => d,
        };
        assert!(
            !nesting || diags.iter().any(|d| d.message.contains("deeper than")),
            "{what}: expected a nesting error, got: {}",
            messages(&diags)
        );
        render_all(&text, &diags).unwrap_or_else(|f| panic!("{what}: {}: {}", f.kind, f.detail));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: took {:?}",
            start.elapsed()
        );
    }
}

/// `a + a + … + a` with 1,000,000 terms on one line is rejected (it nests too deeply) with
/// a diagnostic, in reasonable time and without overflowing the stack. Run through the
/// binary so that a hang or a stack overflow is observed rather than suffered.
#[test]
fn million_term_sum_is_an_error() {
    let terms = 1_000_000;
    let mut text = String::from("func f where M = 4 {\n  a: tensor<M, f32> = input\n  b = a");
    text.push_str(&" + a".repeat(terms - 1));
    text.push_str("\n  return b\n}\n");
    let start = Instant::now();
    let out = run_cli(&[], text.as_bytes(), Duration::from_secs(30));
    let elapsed = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.timed_out,
        "a 1,000,000-term sum did not finish within 30 s (parse time grows quadratically \
         with the length of an infix chain: 8,000 terms take about 10 s)"
    );
    assert!(
        out.code.is_some(),
        "efopt was killed by a signal after {elapsed:?} (a stack overflow dropping or walking \
         the 1,000,000-deep expression?)"
    );
    assert_eq!(
        out.code,
        Some(1),
        "expected exit code 1 after {elapsed:?}, stderr:\n{}",
        stderr.chars().take(2000).collect::<String>()
    );
    assert!(
        stderr.contains("nests deeper than"),
        "expected a nesting diagnostic, got:\n{}",
        stderr.chars().take(2000).collect::<String>()
    );
}

/// Empty input, NUL bytes and invalid UTF-8 through the binary: exit code 1 with a located
/// diagnostic, never a panic.
#[test]
fn empty_nul_and_invalid_utf8_input() {
    let valid = "func f where M = 4 {\n  a: tensor<M, f32> = input\n  return a\n}\n";
    let mut invalid_utf8 = valid.as_bytes().to_vec();
    invalid_utf8.splice(23..23, [0xff, 0xfe]);
    let mut truncated = valid.as_bytes().to_vec();
    truncated.extend_from_slice("λ".as_bytes().split_at(1).0);
    let mut nul = valid.as_bytes().to_vec();
    nul.splice(23..23, [0]);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", Vec::new(), "empty input"),
        ("blank", b"  \n\n\t\n".to_vec(), "empty input"),
        (
            "comments only",
            b"// nothing here\n".to_vec(),
            "empty input",
        ),
        ("NUL", nul, "<stdin>:2:3: NUL byte in source"),
        ("only NUL", vec![0], "NUL byte in source"),
        (
            "invalid UTF-8",
            invalid_utf8,
            "<stdin>:2:3: input is not valid UTF-8",
        ),
        ("truncated UTF-8", truncated, "input is not valid UTF-8"),
        ("only 0xff", vec![0xff], "input is not valid UTF-8"),
    ];
    let mut problems = Vec::new();
    for (what, input, expected) in &cases {
        for args in [&[][..], &["--split-input-file".to_string()][..]] {
            let out = run_cli(args, input, Duration::from_secs(20));
            let stderr = String::from_utf8_lossy(&out.stderr);
            // A control byte of the input is shown as `?`, never echoed raw to a terminal.
            if out.stderr.iter().any(|b| *b == 0 || *b == 0x1b) {
                problems.push(format!("{what} {args:?}: stderr echoes a control byte"));
            }
            if out.code != Some(1) || !stderr.contains(expected) {
                problems.push(format!(
                    "{what} {args:?}: exit {:?}, expected 1 and `{expected}`; stderr:\n{}",
                    out.code,
                    stderr.lines().take(4).collect::<Vec<_>>().join("\n")
                ));
            }
        }
    }
    // The same inputs through the library (as text where they are text).
    for (what, input, _) in &cases {
        if let Ok(text) = std::str::from_utf8(input) {
            let mut stats = Stats::default();
            if let Err(f) = check_text(text, &mut stats) {
                problems.push(format!("{what} (library): {}: {}", f.kind, f.detail));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// The generator itself: programs it builds verify, and a fixed seed gives the same program.
#[test]
fn generator_is_deterministic_and_valid() {
    install_panic_hook();
    let mut stats = Stats::default();
    let (a, fa) = generate(&mut Rng::new(7), &mut stats, 0);
    let (b, _) = generate(&mut Rng::new(7), &mut stats, 0);
    assert_eq!(a, b);
    assert!(fa.is_empty(), "{:?}", fa.first().map(|f| &f.detail));
    let mut m = parse_module(&a, 0).unwrap_or_else(|d| panic!("{}\n{a}", messages(&d)));
    verify_module(&mut m).unwrap_or_else(|d| panic!("{}\n{a}", messages(&d)));
}
