//! The `efopt` command: argument parsing, the pass pipeline (a straight-line driver that
//! verifies between passes in debug builds and tests), IR dumps, `--split-input-file`,
//! `--verify-diagnostics`, timing and statistics.

mod expect;
mod pipeline;

use crate::diag::{Diagnostic, Severity, SourceMap};
use crate::ir::print::{print_module, write_module, PrintOptions};
use crate::ir::{Binding, Module};
use crate::passes::{registry, PassContext};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

pub use pipeline::{parse_pipeline, PassSpec};

pub const HELP: &str = "\
efopt — tensor-program superoptimizer (EquiForge)

USAGE:
    efopt [OPTIONS] [FILE]            (FILE `-` or absent: standard input)

Reads a module in the .ef textual IR, verifies it, runs a pipeline of named passes and
prints the resulting IR (canonical form; it parses again). With no --passes it prints
the canonical form of the input.

PIPELINE:
    --passes=PIPELINE         comma-separated passes with options in braces:
                              --passes='verify,check{against=m0.ef tol=0.01}'
    --list-passes             list every pass with its summary and options
    --list-rules              list every equality rule: family, name, equation
    --verify-each=BOOL        verify after every pass (default: on in debug builds)

INPUT AND OUTPUT:
    -o FILE                   write the final IR to FILE instead of standard output
    --split-input-file        process chunks separated by `// -----` independently
    --verify-diagnostics      check diagnostics against `// expected-error@+1 {{…}}`
                              (also -warning, -note, -remark; @+N, @-N, @N or none)
    --set NAME=VALUE          override a `where` binding (dimension size or axis extent) of
                              functions and e-graph dumps, e.g. --set B=16; repeatable
    --seed N                  seed for random inputs of interpret/check (default 0)
    --print-types             print every statement's inferred type

DEBUGGING:
    --print-ir-after-all      dump the IR after every pass to stderr
    --print-ir-before=NAME    dump the IR before pass NAME (repeatable)
    --print-ir-after=NAME     dump the IR after pass NAME (repeatable)
    --timing                  per-pass wall time on stderr
    --stats=json              per-pass counters as JSON on stderr
    --color=WHEN              color diagnostics: auto (default), always, never
    --progress=WHEN           a progress line on stderr for saturate and extract runs
                              longer than a second: auto (default: when stderr is a
                              terminal), always, never
    -h, --help                this help
    -V, --version             version

ENVIRONMENT:
    EFOPT_WRONG_CANDIDATES=error
                              a candidate `extract` drops because it differs from its
                              source (a bug in efopt) is an error, not a warning (the
                              test suites set it)
    EFOPT_PYTHON=PATH         the Python with triton and numpy that triton-check runs
                              (default: the checkout's .venv/bin/python)

Dumps are delimited by `// -----// IR Dump … //----- //` comment lines, so each dump
parses as a module. Diagnostics go to stderr; exit code 1 on any error.
";

#[derive(Debug, Default)]
pub struct Options {
    pub input: Option<String>,
    pub output: Option<String>,
    pub pipeline: Option<String>,
    pub list_passes: bool,
    pub list_rules: bool,
    pub verify_each: bool,
    pub split_input_file: bool,
    pub verify_diagnostics: bool,
    pub sets: Vec<(String, u64)>,
    pub seed: u64,
    pub print_types: bool,
    pub print_after_all: bool,
    pub print_before: Vec<String>,
    pub print_after: Vec<String>,
    pub timing: bool,
    pub stats_json: bool,
    pub color: Option<bool>,
    /// `--progress`: None is auto (when stderr is a terminal).
    pub progress: Option<bool>,
}

/// Parses command-line arguments (without the program name).
pub fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        verify_each: cfg!(debug_assertions),
        ..Options::default()
    };
    let mut i = 0;
    let mut positional = Vec::new();
    while i < args.len() {
        let arg = &args[i];
        let (key, inline_val) = match arg.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            if let Some(v) = &inline_val {
                return Ok(v.clone());
            }
            i += 1;
            args.get(i)
                .cloned()
                .ok_or_else(|| format!("option {name} needs a value"))
        };
        match key.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "-V" | "--version" => return Err("version".into()),
            "--passes" | "-p" => o.pipeline = Some(value(&key)?),
            "--list-passes" => o.list_passes = true,
            "--list-rules" => o.list_rules = true,
            "--verify-each" => {
                o.verify_each = match inline_val.as_deref() {
                    None | Some("true") => true,
                    Some("false") => false,
                    Some(v) => return Err(format!("--verify-each takes true or false, not `{v}`")),
                }
            }
            "-o" => o.output = Some(value("-o")?),
            "--split-input-file" => o.split_input_file = true,
            "--verify-diagnostics" => o.verify_diagnostics = true,
            "--set" => {
                let v = value("--set")?;
                let (name, n) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--set takes NAME=VALUE, got `{v}`"))?;
                let n: u64 = n
                    .parse()
                    .map_err(|_| format!("--set {name}: `{n}` is not a positive integer"))?;
                if n == 0 {
                    return Err(format!("--set {name}=0: `{name}` must be at least 1 (sizes and extents are positive)"));
                }
                if !crate::ir::is_dim_symbol(name) && !crate::ir::is_axis_name(name) {
                    return Err(format!("--set: `{name}` is neither a dimension (upper case) nor an axis (lower case)"));
                }
                o.sets.push((name.to_string(), n));
            }
            "--seed" => {
                let v = value("--seed")?;
                o.seed = v
                    .parse()
                    .map_err(|_| format!("--seed takes an integer, got `{v}`"))?;
            }
            "--print-types" => o.print_types = true,
            "--print-ir-after-all" => o.print_after_all = true,
            "--print-ir-before" => o.print_before.push(value(&key)?),
            "--print-ir-after" => o.print_after.push(value(&key)?),
            "--timing" => o.timing = true,
            "--stats" => match value("--stats")?.as_str() {
                "json" => o.stats_json = true,
                other => return Err(format!("--stats supports `json`, not `{other}`")),
            },
            "--color" => o.color = when("--color", &value("--color")?)?,
            "--progress" => o.progress = when("--progress", &value("--progress")?)?,
            "-" => positional.push(arg.clone()),
            s if s.starts_with('-') => return Err(format!("unknown option `{arg}` (see --help)")),
            _ => positional.push(arg.clone()),
        }
        i += 1;
    }
    if positional.len() > 1 {
        return Err(format!(
            "expected one input file, got {}: {}",
            positional.len(),
            positional.join(" ")
        ));
    }
    o.input = positional.pop();
    Ok(o)
}

/// An `auto|always|never` option: `None` for auto (the caller decides from the terminal).
fn when(option: &str, v: &str) -> Result<Option<bool>, String> {
    match v {
        "auto" => Ok(None),
        "always" => Ok(Some(true)),
        "never" => Ok(Some(false)),
        other => Err(format!(
            "{option} takes auto, always or never, not `{other}`"
        )),
    }
}

pub fn list_passes() -> String {
    let mut s = String::from("Available passes:\n");
    for p in registry() {
        s.push_str(&format!("  {:<12} {}\n", p.name, p.summary));
        for o in p.options {
            let default = if o.default.is_empty() {
                String::new()
            } else {
                format!(" (default {})", o.default)
            };
            s.push_str(&format!("      {:<12} {}{default}\n", o.name, o.help));
        }
    }
    s
}

pub fn list_rules() -> String {
    let rules = crate::egraph::rules::all_rules();
    let mut s = format!("{} equality rules:\n", rules.len());
    for r in rules {
        s.push_str(&format!(
            "  {:<12} {:<28} {}\n",
            r.family.name(),
            r.name,
            r.equation
        ));
    }
    s
}

/// The result of processing one input chunk.
struct ChunkOutcome {
    output: ChunkOutput,
    diagnostics: Vec<Diagnostic>,
    failed: bool,
}

/// What a chunk writes to the output: a backend's code, or the module, printed only as it is
/// written so that its text is never held whole.
enum ChunkOutput {
    Code(String),
    Module(Module),
}

impl ChunkOutput {
    fn none() -> ChunkOutput {
        ChunkOutput::Code(String::new())
    }

    fn write(&self, w: &mut impl Write, opts: &Options) -> std::io::Result<()> {
        match self {
            ChunkOutput::Code(code) => w.write_all(code.as_bytes()),
            ChunkOutput::Module(m) => write_module(
                w,
                m,
                PrintOptions {
                    types: opts.print_types,
                },
            ),
        }
    }
}

struct Timing {
    rows: Vec<(String, f64)>,
}

/// Runs the command; returns the process exit code.
pub fn run(args: &[String]) -> i32 {
    let opts = match parse_args(args) {
        Ok(o) => o,
        Err(e) if e.is_empty() => {
            print!("{HELP}");
            return 0;
        }
        Err(e) if e == "version" => {
            println!("efopt {}", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    if opts.list_passes {
        print!("{}", list_passes());
        return 0;
    }
    if opts.list_rules {
        print!("{}", list_rules());
        return 0;
    }
    let color = opts.color.unwrap_or_else(|| {
        std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
    });
    let mut sources = SourceMap::default();

    // The pipeline string is a source of its own so errors point into it.
    let pipeline_text = opts.pipeline.clone().unwrap_or_default();
    let pipeline_src = sources.add("<pipeline>", pipeline_text.clone());
    let specs = match parse_pipeline(&pipeline_text, pipeline_src) {
        Ok(s) => s,
        Err(diags) => {
            for d in &diags {
                sources.render(d, color, &mut std::io::stderr());
            }
            return 1;
        }
    };
    for name in opts.print_before.iter().chain(&opts.print_after) {
        if !registry().iter().any(|p| p.name == name) {
            eprintln!("error: --print-ir-before/after: unknown pass `{name}` (see --list-passes)");
            return 1;
        }
    }

    let (name, bytes) = match read_input(opts.input.as_deref()) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let lossy = String::from_utf8_lossy(e.as_bytes()).into_owned();
            let id = sources.add(name.clone(), lossy);
            let d = Diagnostic::error(
                crate::diag::Span::new(id, at, at + 1),
                "input is not valid UTF-8",
            )
            .with_label(format!("invalid byte at offset {at}"))
            .with_help("efopt reads UTF-8 text; check the file's encoding");
            sources.render(&d, color, &mut std::io::stderr());
            return 1;
        }
    };
    // A UTF-8 byte-order mark is not part of the program; blank it (same length) so spans hold.
    let text = match text.strip_prefix('\u{feff}') {
        Some(rest) => format!("   {rest}"),
        None => text,
    };
    let base_dir = opts
        .input
        .as_deref()
        .filter(|p| *p != "-")
        .and_then(|p| std::path::Path::new(p).parent().map(|d| d.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("."));

    let chunks = if opts.split_input_file {
        split_chunks(&text)
    } else {
        vec![(0, text.len())]
    };
    let mut sink: Box<dyn Write> = match &opts.output {
        Some(path) => match std::fs::File::create(path) {
            Ok(file) => Box::new(std::io::BufWriter::new(file)),
            Err(e) => {
                eprintln!("error: cannot write `{path}`: {e}");
                return 1;
            }
        },
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut write_failed = None;
    let mut exit = 0;
    let mut timing = Timing { rows: Vec::new() };
    let mut stats = Vec::new();
    let separated = chunks.len() > 1;
    // Which `--set` overrides met a function or e-graph in some chunk: one that met none is
    // most likely a misspelt name.
    let mut sets_applied = vec![false; opts.sets.len()];
    for (index, (start, end)) in chunks.into_iter().enumerate() {
        // Written before the chunk is processed, and each chunk's output flushed once written:
        // passes print report lines to standard output as they run, and diagnostics follow
        // each chunk, so these must land after the text of the chunk before, never inside it.
        if index > 0 && write_failed.is_none() {
            write_failed = sink
                .write_all(b"// -----\n")
                .and_then(|()| sink.flush())
                .err();
        }
        // Other chunks are blanked (newlines kept, one space per byte) so spans, offsets and
        // line numbers are the file's.
        let mut masked = String::with_capacity(text.len());
        for (i, c) in text.char_indices() {
            if (start..end).contains(&i) || c == '\n' {
                masked.push(c);
            } else {
                masked.extend(std::iter::repeat_n(' ', c.len_utf8()));
            }
        }
        let id = sources.add(name.clone(), masked.clone());
        // A blank chunk has no text of its own to point at: point at where it starts.
        let outcome = if separated && text[start..end].trim().is_empty() {
            ChunkOutcome {
                output: ChunkOutput::none(),
                diagnostics: vec![Diagnostic::error(
                    crate::diag::Span::new(id, start, start),
                    "empty chunk: nothing between two `// -----` separators",
                )
                .with_label("this chunk is empty")
                .with_help("remove one of the separators")],
                failed: true,
            }
        } else {
            process_chunk(
                &masked,
                id,
                &opts,
                &specs,
                &mut sources,
                &base_dir,
                &mut timing,
                &mut stats,
                &mut sets_applied,
            )
        };
        if opts.verify_diagnostics {
            let problems = expect::verify_diagnostics(&masked, id, &outcome.diagnostics, &sources);
            for d in &problems {
                sources.render(d, color, &mut std::io::stderr());
            }
            if !problems.is_empty() {
                exit = 1;
            }
        } else {
            for d in &outcome.diagnostics {
                sources.render(d, color, &mut std::io::stderr());
            }
            if outcome.failed {
                exit = 1;
            }
        }
        // Each chunk is written once processed, and its module dropped before the next.
        if write_failed.is_none() {
            write_failed = outcome
                .output
                .write(&mut sink, &opts)
                .and_then(|()| sink.flush())
                .err();
        }
    }
    if let Some(e) = write_failed {
        // A closed pipe (`efopt … | head`) is the reader's choice, not an error.
        let reader_left = opts.output.is_none() && e.kind() == std::io::ErrorKind::BrokenPipe;
        if !reader_left {
            match &opts.output {
                Some(path) => eprintln!("error: cannot write `{path}`: {e}"),
                None => eprintln!("error: cannot write to standard output: {e}"),
            }
            return 1;
        }
    }
    drop(sink);
    for ((name, value), _) in opts.sets.iter().zip(&sets_applied).filter(|(_, a)| !**a) {
        eprintln!(
            "warning: --set {name}={value}: no function binds or uses `{name}`, and no e-graph binds it; \
             the names are case-sensitive"
        );
    }
    if opts.timing {
        let total: f64 = timing.rows.iter().map(|r| r.1).sum();
        let mut s =
            String::from("// ===- Pass execution timing report -===\n//   wall (ms)   pass\n");
        for (name, ms) in &timing.rows {
            s.push_str(&format!("//   {ms:>9.3}   {name}\n"));
        }
        s.push_str(&format!("//   {total:>9.3}   total\n"));
        eprint!("{s}");
    }
    if opts.stats_json {
        let doc = moved_object("chunks", serde_json::Value::Array(stats));
        // Written as it is serialised: with many candidates the text runs to megabytes.
        // Buffered, because stderr is not: unbuffered, RMSNorm–SwiGLU's 24,404 candidate rows
        // took 4 s of small writes to a pipe.
        let mut stderr = std::io::BufWriter::new(std::io::stderr().lock());
        let _ = serde_json::to_writer_pretty(&mut stderr, &doc);
        let _ = writeln!(stderr);
        let _ = stderr.flush();
    }
    exit
}

/// `{ key: value }` with `value` moved in. `json!` would serialise a copy of it, and with
/// `extract`'s one row per output candidate that copy, made after the output had stopped at
/// the memory limit, added 22 MiB to the peak of MHA decode's run at 8 GiB.
fn moved_object(key: &str, value: serde_json::Value) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    map.insert(key.into(), value);
    serde_json::Value::Object(map)
}

fn read_input(path: Option<&str>) -> Result<(String, Vec<u8>), String> {
    match path {
        None | Some("-") => {
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
                .map_err(|e| format!("cannot read standard input: {e}"))?;
            Ok(("<stdin>".into(), buf))
        }
        Some(p) => std::fs::read(p)
            .map(|b| (p.to_string(), b))
            .map_err(|e| format!("cannot read `{p}`: {e}")),
    }
}

/// Byte ranges of the chunks separated by `// -----` lines.
fn split_chunks(text: &str) -> Vec<(usize, usize)> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        if line.trim() == "// -----" {
            chunks.push((start, pos));
            start = pos + line.len();
        }
        pos += line.len();
    }
    chunks.push((start, text.len()));
    chunks
}

/// Applies `--set` overrides to every function that binds or uses the name, and to every
/// e-graph dump that binds it; marks in `applied` the overrides that met one.
fn apply_sets(m: &mut Module, sets: &[(String, u64)], applied: &mut [bool]) {
    for f in &mut m.funcs {
        for ((name, value), applied) in sets.iter().zip(applied.iter_mut()) {
            if let Some(b) = f.bindings.iter_mut().find(|b| &b.name == name) {
                b.value = *value;
                *applied = true;
            } else if function_mentions(f, name) {
                f.bindings.push(Binding {
                    name: name.clone(),
                    value: *value,
                    span: f.name_span,
                });
                *applied = true;
            }
        }
    }
    for g in &mut m.egraphs {
        for ((name, value), applied) in sets.iter().zip(applied.iter_mut()) {
            if let Some(b) = g.bindings.iter_mut().find(|b| &b.name == name) {
                b.value = *value;
                *applied = true;
            }
        }
    }
}

fn function_mentions(f: &crate::ir::Function, name: &str) -> bool {
    let text = crate::ir::print::print_function(f, PrintOptions::default());
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|w| w == name)
}

fn dump(title: &str, m: &Module, opts: &Options) {
    let body = print_module(
        m,
        PrintOptions {
            types: opts.print_types,
        },
    );
    eprint!("// -----// IR Dump {title} //----- //\n{body}\n");
}

#[allow(clippy::too_many_arguments)]
fn process_chunk(
    text: &str,
    source: u32,
    opts: &Options,
    specs: &[PassSpec],
    sources: &mut SourceMap,
    base_dir: &std::path::Path,
    timing: &mut Timing,
    stats: &mut Vec<serde_json::Value>,
    sets_applied: &mut [bool],
) -> ChunkOutcome {
    let mut diagnostics = Vec::new();
    let fail = |diagnostics: Vec<Diagnostic>| ChunkOutcome {
        output: ChunkOutput::none(),
        diagnostics,
        failed: true,
    };
    let t0 = Instant::now();
    let mut module = match crate::parse::parse_module(text, source) {
        Ok(m) => m,
        Err(d) => {
            // Whether a chunk that does not parse uses a name is unknown: no warning then.
            sets_applied.fill(true);
            return fail(d);
        }
    };
    timing
        .rows
        .push(("parse".into(), t0.elapsed().as_secs_f64() * 1e3));
    apply_sets(&mut module, &opts.sets, sets_applied);
    let t0 = Instant::now();
    if let Err(d) = crate::verify::verify_module(&mut module) {
        return fail(d);
    }
    timing
        .rows
        .push(("verify (on load)".into(), t0.elapsed().as_secs_f64() * 1e3));
    let original = module.clone();
    let mut pass_stats = Vec::new();
    // Code from a backend pass; report lines then become `#` comments on standard output.
    let mut emitted: Option<String> = None;
    let code_out = specs
        .iter()
        .any(|s| registry().iter().any(|p| p.name == s.name && p.emits_code));
    for spec in specs {
        let Some(info) = registry().into_iter().find(|p| p.name == spec.name) else {
            continue; // rejected when the pipeline was parsed
        };
        if opts.print_before.contains(&spec.name) {
            dump(&format!("Before {}", spec.name), &module, opts);
        }
        let mut pass = (info.create)(&info, &spec.options);
        let mut cx = PassContext {
            sources,
            original: &original,
            seed: opts.seed,
            base_dir: base_dir.to_path_buf(),
            report: Vec::new(),
            diagnostics: Vec::new(),
            counters: Default::default(),
            emitted: None,
            progress: opts
                .progress
                .unwrap_or_else(|| std::io::stderr().is_terminal()),
        };
        let t0 = Instant::now();
        let result = pass.run(&mut module, &mut cx);
        if let Some(code) = cx.emitted.take() {
            emitted = Some(code);
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        timing.rows.push((spec.name.clone(), ms));
        let report = std::mem::take(&mut cx.report);
        diagnostics.append(&mut cx.diagnostics);
        // The counters are moved in: `json!` would serialise a copy of them, and `extract`'s
        // list one entry per output candidate (tens of MB past its memory limit on MHA decode).
        let counters = std::mem::take(&mut cx.counters).into_iter().collect();
        let mut entry = serde_json::Map::new();
        entry.insert("pass".into(), spec.name.clone().into());
        entry.insert("wall_ms".into(), ms.into());
        entry.insert("counters".into(), serde_json::Value::Object(counters));
        pass_stats.push(serde_json::Value::Object(entry));
        if !report.is_empty() {
            let mut stdout = std::io::stdout().lock();
            for line in report {
                if code_out {
                    let _ = writeln!(stdout, "#{}", line.trim_start_matches('/'));
                } else {
                    let _ = writeln!(stdout, "{line}");
                }
            }
        }
        if let Err(mut d) = result {
            diagnostics.append(&mut d);
            stats.push(moved_object("passes", serde_json::Value::Array(pass_stats)));
            return ChunkOutcome {
                output: ChunkOutput::none(),
                diagnostics,
                failed: true,
            };
        }
        if opts.verify_each {
            if let Err(d) = crate::verify::verify_module(&mut module) {
                diagnostics.push(Diagnostic::global(
                    Severity::Error,
                    format!("pass `{}` produced IR that does not verify", spec.name),
                ));
                diagnostics.extend(d);
                return ChunkOutcome {
                    output: ChunkOutput::none(),
                    diagnostics,
                    failed: true,
                };
            }
        }
        if opts.print_after_all || opts.print_after.contains(&spec.name) {
            dump(&format!("After {}", spec.name), &module, opts);
        }
    }
    stats.push(moved_object("passes", serde_json::Value::Array(pass_stats)));
    let failed = diagnostics.iter().any(|d| d.is_error());
    ChunkOutcome {
        output: match emitted {
            Some(code) => ChunkOutput::Code(code),
            None => ChunkOutput::Module(module),
        },
        diagnostics,
        failed,
    }
}
