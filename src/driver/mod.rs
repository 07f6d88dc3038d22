//! The `efopt` command: the command line ([`cli`], clap), reading the input, `--split-input-file`
//! chunks, `--set` overrides, `--verify-diagnostics` ([`expect`]), and writing the output,
//! diagnostics, the timing report and statistics. The pipeline itself runs in the library's
//! pass manager (`crate::passes::manager`).

mod cli;
mod expect;

use crate::diag::{Diagnostic, SourceMap};
use crate::ir::print::{write_module, PrintOptions};
use crate::ir::{Binding, Module};
use crate::passes::manager::{
    Failure, IrPrinting, Observer, PassManager, PipelineConfig, PipelineOutput,
};
use crate::passes::parse_pipeline;
use clap::Parser;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

pub use cli::{Cli, StatsFormat, When};

/// The text of `efopt --list-rules`: every equality rule's family, name and equation.
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
    output: PipelineOutput,
    diagnostics: Vec<Diagnostic>,
    failed: bool,
}

/// Writes what a chunk leaves: a backend's code, or the module, printed only as it is written
/// so that its text is never held whole.
fn write_output(output: &PipelineOutput, w: &mut impl Write, cli: &Cli) -> std::io::Result<()> {
    match output {
        PipelineOutput::None => Ok(()),
        PipelineOutput::Code(code) => w.write_all(code.as_bytes()),
        PipelineOutput::Module(m) => write_module(
            w,
            m,
            PrintOptions {
                types: cli.print_types,
            },
        ),
    }
}

/// Dumps go to standard error and report lines to standard output as passes run, so that
/// they interleave with what the passes print themselves (progress lines).
struct StdStreams;

impl Observer for StdStreams {
    fn dump(&mut self, text: &str) {
        eprint!("{text}");
    }

    fn report(&mut self, lines: &[String]) {
        let mut stdout = std::io::stdout().lock();
        for line in lines {
            let _ = writeln!(stdout, "{line}");
        }
    }
}

struct Timing {
    rows: Vec<(String, f64)>,
}

/// Runs the command on `args` (without the program name); returns the process exit code.
pub fn run(args: &[String]) -> i32 {
    let argv = std::iter::once("efopt".to_string()).chain(args.iter().cloned());
    let opts = match Cli::try_parse_from(argv) {
        Ok(o) => o,
        Err(e) => {
            // `--help` and `--version` too: clap prints them to stdout, and exits 0.
            let _ = e.print();
            return e.exit_code();
        }
    };
    if opts.list_passes {
        print!("{}", crate::passes::list_passes());
        return 0;
    }
    if opts.list_rules {
        print!("{}", list_rules());
        return 0;
    }
    let color = opts
        .color
        .on(|| std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none());
    let mut sources = SourceMap::default();

    // The pipeline string is a source of its own so errors point into it.
    let pipeline_text = opts.pipeline.clone().unwrap_or_default();
    let pipeline_src = sources.add("<pipeline>", pipeline_text.clone());
    let base_dir = opts
        .input
        .as_deref()
        .filter(|p| *p != "-")
        .and_then(|p| std::path::Path::new(p).parent().map(|d| d.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("."));
    let config = PipelineConfig {
        verify_each: opts
            .verify_each
            .unwrap_or(PipelineConfig::default().verify_each),
        seed: opts.seed,
        progress: opts.progress.on(|| std::io::stderr().is_terminal()),
        base_dir,
        print_ir: IrPrinting {
            before: opts.print_before.clone(),
            after: opts.print_after.clone(),
            after_all: opts.print_after_all,
            types: opts.print_types,
        },
    };
    let mut manager = match parse_pipeline(&pipeline_text, pipeline_src)
        .and_then(|specs| PassManager::from_specs(&specs, config))
    {
        Ok(m) => m,
        Err(diags) => {
            for d in &diags {
                sources.render(d, color, &mut std::io::stderr());
            }
            return 1;
        }
    };
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
    let chunks = if opts.split_input_file {
        split_chunks(&text)
    } else {
        vec![(0, text.len())]
    };
    // `-o FILE` is written to a file beside it, which replaces FILE only once the run
    // succeeds: a failed run leaves FILE as it was, not empty or half written (as mlir-opt).
    let mut output_file = None;
    let mut sink: Box<dyn Write> = match &opts.output {
        Some(path) => match OutputFile::create(path) {
            Ok((file, handle)) => {
                output_file = Some(handle);
                Box::new(std::io::BufWriter::new(file))
            }
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
    let mut chunks_ok = 0;
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
                output: PipelineOutput::None,
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
                &mut manager,
                &mut sources,
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
        chunks_ok += usize::from(!outcome.failed);
        // Each chunk is written once processed, and its module dropped before the next.
        if write_failed.is_none() {
            write_failed = write_output(&outcome.output, &mut sink, &opts)
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
            if let Some(f) = output_file {
                f.discard();
            }
            return 1;
        }
    }
    drop(sink);
    // Split input: each chunk is a run of its own, and the file holds those that succeeded
    // (a failed chunk writes nothing); it is kept unless every chunk failed.
    if let Some(f) = output_file {
        if exit == 0 || (separated && chunks_ok > 0) {
            if let Err(e) = f.keep() {
                eprintln!("error: cannot write `{}`: {e}", f.path);
                return 1;
            }
        } else {
            f.discard();
        }
    }
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
    if opts.stats == Some(StatsFormat::Json) {
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

/// Where `-o FILE` is written: a temporary file beside FILE, renamed over it by `keep`, or
/// FILE itself where it is not a regular file (`/dev/null`, a pipe), which no rename may
/// replace.
struct OutputFile {
    path: String,
    temporary: Option<std::path::PathBuf>,
}

impl OutputFile {
    fn create(path: &str) -> std::io::Result<(std::fs::File, OutputFile)> {
        let target = std::path::Path::new(path);
        let special = std::fs::metadata(target).is_ok_and(|m| !m.is_file());
        let file_name = target.file_name().filter(|_| !special);
        let Some(file_name) = file_name else {
            let file = std::fs::File::create(target)?;
            return Ok((
                file,
                OutputFile {
                    path: path.into(),
                    temporary: None,
                },
            ));
        };
        let temporary = target.with_file_name(format!(
            ".{}.efopt-{}.tmp",
            file_name.to_string_lossy(),
            std::process::id()
        ));
        let file = std::fs::File::create(&temporary)?;
        Ok((
            file,
            OutputFile {
                path: path.into(),
                temporary: Some(temporary),
            },
        ))
    }

    fn keep(&self) -> std::io::Result<()> {
        match &self.temporary {
            Some(t) => std::fs::rename(t, &self.path).inspect_err(|_| {
                let _ = std::fs::remove_file(t);
            }),
            None => Ok(()),
        }
    }

    fn discard(self) {
        if let Some(t) = &self.temporary {
            let _ = std::fs::remove_file(t);
        }
    }
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
/// e-graph dump that binds it; marks in `applied` the overrides that met one. A derived size
/// (`HD = NH*D`) is recomputed from its factors; setting it directly is an error, as is a
/// derived size the new values make non-positive.
fn apply_sets(
    m: &mut Module,
    sets: &[(String, u64)],
    applied: &mut [bool],
) -> Vec<crate::diag::Diagnostic> {
    let mut diags = Vec::new();
    if sets.is_empty() {
        return diags;
    }
    let mut set_in = |bindings: &mut Vec<Binding>,
                      mentions: &dyn Fn(&str) -> bool,
                      at: crate::diag::Span,
                      applied: &mut [bool]| {
        let mut changed = false;
        for ((name, value), applied) in sets.iter().zip(applied.iter_mut()) {
            if let Some(b) = bindings.iter_mut().find(|b| &b.name == name) {
                if let Some(def) = &b.def {
                    diags.push(
                        crate::diag::Diagnostic::error(
                            b.span,
                            format!("--set {name}={value}: `{name}` is derived, `{name} = {def}`"),
                        )
                        .with_help(format!(
                            "set its factors instead ({}); `{name}` is recomputed from them",
                            def.symbols()
                                .iter()
                                .map(|s| format!("--set {s}=…"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )),
                    );
                    *applied = true;
                    continue;
                }
                b.value = *value;
                changed = true;
                *applied = true;
            } else if mentions(name) {
                bindings.push(Binding {
                    name: name.clone(),
                    value: *value,
                    def: None,
                    span: at,
                });
                *applied = true;
            }
        }
        if changed {
            if let Err(errors) = crate::ir::sizes::resolve_bindings(bindings) {
                let set: Vec<String> = sets.iter().map(|(n, v)| format!("--set {n}={v}")).collect();
                for e in errors {
                    let mut d = crate::diag::Diagnostic::error(bindings[e.binding].span, e.message)
                        .with_note(None, format!("after {}", set.join(" ")));
                    d.help = e.help;
                    diags.push(d);
                }
            }
        }
    };
    for f in &mut m.funcs {
        // Printed only if some name is not bound.
        let unbound = sets
            .iter()
            .any(|(n, _)| f.bindings.iter().all(|b| &b.name != n));
        let text = if unbound {
            crate::ir::print::print_function(f, PrintOptions::default())
        } else {
            String::new()
        };
        let mentions = |name: &str| mentions_word(&text, name);
        let at = f.name_span;
        set_in(&mut f.bindings, &mentions, at, applied);
    }
    for g in &mut m.egraphs {
        let at = g.name_span;
        set_in(&mut g.bindings, &|_| false, at, applied);
    }
    diags
}

fn mentions_word(text: &str, name: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|w| w == name)
}

/// Parses a chunk, applies `--set`, and runs the pipeline on it.
#[allow(clippy::too_many_arguments)]
fn process_chunk(
    text: &str,
    source: u32,
    opts: &Cli,
    manager: &mut PassManager,
    sources: &mut SourceMap,
    timing: &mut Timing,
    stats: &mut Vec<serde_json::Value>,
    sets_applied: &mut [bool],
) -> ChunkOutcome {
    let t0 = Instant::now();
    let mut module = match crate::parse::parse_module(text, source) {
        Ok(m) => m,
        Err(d) => {
            // Whether a chunk that does not parse uses a name is unknown: no warning then.
            sets_applied.fill(true);
            return ChunkOutcome {
                output: PipelineOutput::None,
                diagnostics: d,
                failed: true,
            };
        }
    };
    timing
        .rows
        .push(("parse".into(), t0.elapsed().as_secs_f64() * 1e3));
    let set_errors = apply_sets(&mut module, &opts.sets, sets_applied);
    if !set_errors.is_empty() {
        return ChunkOutcome {
            output: PipelineOutput::None,
            diagnostics: set_errors,
            failed: true,
        };
    }
    let result = manager.run_observed(module, sources, &mut StdStreams);
    timing.rows.extend(result.timing);
    // A chunk whose module did not verify on load ran no pass and has no entry. (Nor has one
    // whose IR failed `--verify-each`, as before the pass manager moved into the library: the
    // output is kept as it was.)
    if matches!(result.failure, None | Some(Failure::Pass(_))) {
        let passes = result
            .passes
            .into_iter()
            .map(|p| {
                let mut entry = serde_json::Map::new();
                entry.insert("pass".into(), p.pass.into());
                entry.insert("wall_ms".into(), p.wall_ms.into());
                entry.insert("counters".into(), serde_json::Value::Object(p.counters));
                serde_json::Value::Object(entry)
            })
            .collect();
        stats.push(moved_object("passes", serde_json::Value::Array(passes)));
    }
    ChunkOutcome {
        output: result.output,
        diagnostics: result.diagnostics,
        failed: result.failed,
    }
}
