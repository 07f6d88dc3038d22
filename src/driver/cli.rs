//! The command line, declared with clap's derive API: every flag, its help (grouped in the
//! sections PIPELINE, INPUT AND OUTPUT and DEBUGGING), and the checks of flag values. A usage
//! error is clap's message and exit code 2; `--help` and `--version` exit 0.

use clap::{ArgAction, Parser, ValueEnum};

const ABOUT: &str = "\
efopt — tensor-program superoptimizer (EquiForge)

Reads a module in the .ef textual IR, verifies it, runs a pipeline of named passes and
prints the resulting IR (canonical form; it parses again). With no --passes it prints
the canonical form of the input.";

const AFTER_HELP: &str = "\
ENVIRONMENT:
  EFOPT_WRONG_CANDIDATES=error
                              a candidate `extract` drops because it differs from its
                              source (a bug in efopt) is an error, not a warning (the
                              test suites set it)
  EFOPT_PYTHON=PATH           the Python with triton and numpy that triton-check runs
                              (default: the checkout's .venv/bin/python)
  NO_COLOR                    set: --color=auto does not color diagnostics

Dumps are delimited by `// -----// IR Dump … //----- //` comment lines, so each dump
parses as a module. Diagnostics go to stderr.

Exit status: 0 on success; 1 on any error in the input or the pipeline; 2 on a usage
error (an unknown flag or a bad flag value).";

/// `auto|always|never`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum When {
    Auto,
    Always,
    Never,
}

impl When {
    /// Whether it is on, `auto` deciding by `auto`.
    pub fn on(self, auto: impl FnOnce() -> bool) -> bool {
        match self {
            When::Auto => auto(),
            When::Always => true,
            When::Never => false,
        }
    }
}

/// `--stats=FORMAT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StatsFormat {
    Json,
}

#[derive(Debug, Parser)]
#[command(
    name = "efopt",
    version,
    about = ABOUT,
    after_help = AFTER_HELP,
    // A flag given twice takes its last value, as `--passes` did before clap.
    args_override_self = true,
    disable_help_flag = true,
    disable_version_flag = true,
    // The same help in every build: test builds get clap's `wrap_help` from dev-dependencies,
    // and would otherwise wrap it to the terminal. (They also get `color`, which colors only
    // a terminal.)
    term_width = 0
)]
pub struct Cli {
    /// the input module (`-` or absent: standard input)
    #[arg(value_name = "FILE")]
    pub input: Option<String>,

    /// comma-separated passes with options in braces:
    /// --passes='verify,check{against=m0.ef tol=0.01}'
    #[arg(
        short = 'p',
        long = "passes",
        value_name = "PIPELINE",
        help_heading = "PIPELINE",
        verbatim_doc_comment
    )]
    pub pipeline: Option<String>,

    /// list every pass with its summary and options
    #[arg(long, help_heading = "PIPELINE")]
    pub list_passes: bool,

    /// list every equality rule: family, name, equation
    #[arg(long, help_heading = "PIPELINE")]
    pub list_rules: bool,

    /// verify after every pass (default: on in debug builds)
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_bool,
        help_heading = "PIPELINE"
    )]
    pub verify_each: Option<bool>,

    /// write the final IR to FILE instead of standard output; FILE is replaced only by a run
    /// that succeeds (with --split-input-file: by one where some chunk did, holding the
    /// output of every chunk that did)
    #[arg(short = 'o', value_name = "FILE", help_heading = "INPUT AND OUTPUT")]
    pub output: Option<String>,

    /// process chunks separated by `// -----` independently
    #[arg(long, help_heading = "INPUT AND OUTPUT")]
    pub split_input_file: bool,

    /// check diagnostics against `// expected-error@+1 {{…}}`
    /// (also -warning, -note, -remark; @+N, @-N, @N or none)
    #[arg(long, help_heading = "INPUT AND OUTPUT", verbatim_doc_comment)]
    pub verify_diagnostics: bool,

    /// override a `where` binding (dimension size or axis extent) of
    /// functions and e-graph dumps, e.g. --set B=16; repeatable
    #[arg(
        long = "set",
        value_name = "NAME=VALUE",
        value_parser = parse_set,
        help_heading = "INPUT AND OUTPUT",
        verbatim_doc_comment
    )]
    pub sets: Vec<(String, u64)>,

    /// seed for random inputs of interpret/check (default 0)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        hide_default_value = true,
        value_parser = parse_seed,
        help_heading = "INPUT AND OUTPUT"
    )]
    pub seed: u64,

    /// print every statement's inferred type
    #[arg(long, help_heading = "INPUT AND OUTPUT")]
    pub print_types: bool,

    /// dump the IR after every pass to stderr
    #[arg(long = "print-ir-after-all", help_heading = "DEBUGGING")]
    pub print_after_all: bool,

    /// dump the IR before pass NAME (repeatable)
    #[arg(
        long = "print-ir-before",
        value_name = "NAME",
        value_parser = parse_pass_name,
        help_heading = "DEBUGGING"
    )]
    pub print_before: Vec<String>,

    /// dump the IR after pass NAME (repeatable)
    #[arg(
        long = "print-ir-after",
        value_name = "NAME",
        value_parser = parse_pass_name,
        help_heading = "DEBUGGING"
    )]
    pub print_after: Vec<String>,

    /// per-pass wall time on stderr
    #[arg(long, help_heading = "DEBUGGING")]
    pub timing: bool,

    /// per-pass counters as JSON on stderr (--stats=json)
    #[arg(
        long,
        value_name = "FORMAT",
        hide_possible_values = true,
        help_heading = "DEBUGGING"
    )]
    pub stats: Option<StatsFormat>,

    /// color diagnostics: auto (default: when stderr is a terminal
    /// and NO_COLOR is unset), always, never
    #[arg(
        long,
        value_name = "WHEN",
        default_value = "auto",
        hide_default_value = true,
        hide_possible_values = true,
        help_heading = "DEBUGGING",
        verbatim_doc_comment
    )]
    pub color: When,

    /// a progress line on stderr for saturate and extract runs longer
    /// than a second: auto (default: when stderr is a terminal), always,
    /// never
    #[arg(
        long,
        value_name = "WHEN",
        default_value = "auto",
        hide_default_value = true,
        hide_possible_values = true,
        help_heading = "DEBUGGING",
        verbatim_doc_comment
    )]
    pub progress: When,

    /// this help
    #[arg(short = 'h', long, action = ArgAction::Help, help_heading = "DEBUGGING")]
    help: Option<bool>,

    /// version
    #[arg(short = 'V', long, action = ArgAction::Version, help_heading = "DEBUGGING")]
    version: Option<bool>,
}

fn parse_bool(v: &str) -> Result<bool, String> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

fn parse_seed(v: &str) -> Result<u64, String> {
    v.parse()
        .map_err(|_| "expected a non-negative integer".into())
}

/// `NAME=VALUE`: a dimension (upper case) or axis (lower case) and a positive size.
fn parse_set(v: &str) -> Result<(String, u64), String> {
    let (name, n) = v
        .split_once('=')
        .ok_or_else(|| "expected NAME=VALUE".to_string())?;
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{n}` is not a positive integer"))?;
    if n == 0 {
        return Err(format!(
            "`{name}` must be at least 1 (sizes and extents are positive)"
        ));
    }
    if !crate::ir::is_dim_symbol(name) && !crate::ir::is_axis_name(name) {
        return Err(format!(
            "`{name}` is neither a dimension (upper case) nor an axis (lower case)"
        ));
    }
    Ok((name.to_string(), n))
}

fn parse_pass_name(v: &str) -> Result<String, String> {
    if crate::passes::registry().iter().any(|p| p.name == v) {
        Ok(v.to_string())
    } else {
        Err(format!("unknown pass `{v}` (see --list-passes)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_keep_their_spellings() {
        let cli = Cli::try_parse_from([
            "efopt",
            "-p",
            "verify",
            "--verify-each=false",
            "-o",
            "out.ef",
            "--set",
            "B=16",
            "--set=p=4",
            "--seed=7",
            "--print-ir-after=verify",
            "--print-ir-after",
            "saturate",
            "--stats=json",
            "--color=never",
            "--progress",
            "always",
            "-",
        ])
        .expect("parses");
        assert_eq!(cli.pipeline.as_deref(), Some("verify"));
        assert_eq!(cli.verify_each, Some(false));
        assert_eq!(cli.output.as_deref(), Some("out.ef"));
        assert_eq!(cli.sets, [("B".to_string(), 16), ("p".to_string(), 4)]);
        assert_eq!(cli.seed, 7);
        assert_eq!(cli.print_after, ["verify", "saturate"]);
        assert_eq!(cli.stats, Some(StatsFormat::Json));
        assert_eq!((cli.color, cli.progress), (When::Never, When::Always));
        assert_eq!(cli.input.as_deref(), Some("-"));
        let bare = Cli::try_parse_from(["efopt", "--verify-each", "--seed", "1", "--seed", "2"])
            .expect("parses");
        assert_eq!((bare.verify_each, bare.seed), (Some(true), 2));
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for args in [
            &["efopt", "--bogus"][..],
            &["efopt", "--set", "K"],
            &["efopt", "--set", "9=1"],
            &["efopt", "--verify-each=maybe"],
            &["efopt", "--print-ir-after=nope"],
            &["efopt", "a.ef", "b.ef"],
        ] {
            let e = Cli::try_parse_from(args).expect_err("refused");
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }
}
