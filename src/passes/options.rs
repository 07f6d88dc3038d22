//! Typed pass options. Each pass declares a plain struct of its options whose `Default` impl is
//! the one place a default is written, and maps option names to its fields with
//! [`pass_options!`]; that table gives the pipeline parser each option's kind (what values it
//! takes, checked by [`check_option`] with the messages the lit tests expect), `--list-passes`
//! its help and default (read from `Default::default()` and written by [`OptionValue`]), and
//! [`configure`] the setter that turns `{key=value}` text into the struct.

use super::pipeline::PassSpec;
use crate::diag::{Diagnostic, Span};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptionKind {
    Float,
    Int,
    /// An integer of at least 1.
    Count,
    /// Comma-separated powers of two (Triton block sizes).
    PowersOfTwo,
    Path,
    Bool,
    /// Comma-separated `name:value` pairs.
    Extents,
    Choice(&'static [&'static str]),
    /// Comma-separated subset of the given words.
    List(&'static [&'static str]),
}

/// One option as the pipeline and `--list-passes` see it. Its default is not here: it is the
/// options struct's `Default`.
#[derive(Clone, Copy, Debug)]
pub struct OptionInfo {
    pub name: &'static str,
    pub kind: OptionKind,
    /// One line of help. `{default}` in it stands for the option's default, so that a default
    /// the help must mention is still written only once.
    pub help: &'static str,
}

impl OptionInfo {
    /// The help with `{default}` replaced by `default` (the option's default as listed).
    pub fn help_with(&self, default: &str) -> String {
        self.help.replace("{default}", default)
    }
}

/// A pass's options struct: `Default` gives every default, the table names the options.
/// Implemented by [`pass_options!`].
pub trait PassOptions: Default + Clone + std::fmt::Debug + Send + 'static {
    /// Every option, in the order `--list-passes` shows them.
    const OPTIONS: &'static [OptionInfo];

    /// Sets option `name` from its text, which [`check_option`] has accepted for its kind.
    fn set(&mut self, name: &str, value: &str) -> Result<(), String>;

    /// Option `name`'s value as text, as `--list-passes` writes a default ("" for none).
    fn get(&self, name: &str) -> Option<String>;
}

/// A value an option field can hold: read from and written as option text.
pub trait OptionValue: Sized {
    fn from_text(text: &str) -> Result<Self, String>;
    fn to_text(&self) -> String;
}

/// Implements [`PassOptions`] for a struct: each line maps an option name to a field (or a
/// field of a field, `sizes.seed`), with the option's kind and help.
///
/// ```ignore
/// pass_options!(SaturateOptions {
///     "node-limit" => node_limit: OptionKind::Int, "stop when the e-graph has this many e-nodes";
/// });
/// ```
macro_rules! pass_options {
    ($ty:ty { $( $key:literal => $($field:ident).+ : $kind:expr, $help:expr; )* }) => {
        impl $crate::passes::options::PassOptions for $ty {
            const OPTIONS: &'static [$crate::passes::options::OptionInfo] = &[
                $( $crate::passes::options::OptionInfo { name: $key, kind: $kind, help: $help }, )*
            ];

            fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
                let _ = value; // unused by a pass without options
                match name {
                    $( $key => {
                        self.$($field).+ = $crate::passes::options::OptionValue::from_text(value)?;
                        Ok(())
                    } )*
                    _ => Err(format!("no option `{name}`")),
                }
            }

            fn get(&self, name: &str) -> Option<String> {
                match name {
                    $( $key => Some($crate::passes::options::OptionValue::to_text(&self.$($field).+)), )*
                    _ => None,
                }
            }
        }
    };
}
pub(crate) use pass_options;

/// An enum of the words a `Choice` option takes: `WORDS` (in the order errors list them) is
/// the option's kind, and each word reads as its variant.
macro_rules! choice {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $word:literal ),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $name { $( $(#[$vmeta])* $variant ),+ }

        impl $name {
            /// The words of the option, in the order its errors list them.
            pub const WORDS: &'static [&'static str] = &[$($word),+];

            pub fn word(self) -> &'static str {
                match self { $( $name::$variant => $word ),+ }
            }
        }

        impl $crate::passes::options::OptionValue for $name {
            fn from_text(text: &str) -> Result<Self, String> {
                match text {
                    $( $word => Ok($name::$variant), )+
                    _ => Err(format!("expected one of {}, found `{text}`", Self::WORDS.join(", "))),
                }
            }

            fn to_text(&self) -> String {
                self.word().to_string()
            }
        }
    };
}
pub(crate) use choice;

/// Where each option was written (`name=value` in the `<pipeline>` source), for errors about
/// what its value names (a file that cannot be read). Empty for options set in code.
#[derive(Clone, Debug, Default)]
pub struct OptionSpans(BTreeMap<String, Span>);

impl OptionSpans {
    pub fn get(&self, name: &str) -> Option<Span> {
        self.0.get(name).copied()
    }

    /// Options written at these spans (a test's).
    #[cfg(test)]
    pub fn from_map(spans: BTreeMap<String, Span>) -> OptionSpans {
        OptionSpans(spans)
    }
}

/// Every option's default as `--list-passes` writes it ("" for none), in table order.
pub fn defaults<O: PassOptions>() -> Vec<String> {
    let d = O::default();
    O::OPTIONS
        .iter()
        .map(|o| d.get(o.name).unwrap_or_default())
        .collect()
}

/// The options a spec's `{key=value}` settings give: each checked against its kind and set in
/// order (a later setting of the same key wins). Every bad setting is reported.
pub fn configure<O: PassOptions>(spec: &PassSpec) -> Result<(O, OptionSpans), Vec<Diagnostic>> {
    let name = &spec.name;
    let mut options = O::default();
    let mut spans = OptionSpans::default();
    let mut errors = Vec::new();
    for setting in &spec.options {
        let (k, v, s) = (&setting.name, &setting.value, setting.span);
        let Some(opt) = O::OPTIONS.iter().find(|o| o.name == k) else {
            let known: Vec<&str> = O::OPTIONS.iter().map(|o| o.name).collect();
            errors.push(
                Diagnostic::error(s, format!("pass `{name}` has no option `{k}`")).with_help(
                    if known.is_empty() {
                        format!("`{name}` takes no options")
                    } else {
                        format!("its options are: {}", known.join(", "))
                    },
                ),
            );
            continue;
        };
        if let Err(e) = check_option(opt.kind, v).and_then(|()| options.set(k, v)) {
            let default = O::default().get(k).unwrap_or_default();
            errors.push(
                Diagnostic::error(s, format!("bad value for `{name}{{{k}}}`: {e}"))
                    .with_help(opt.help_with(&default)),
            );
            continue;
        }
        spans.0.insert(k.clone(), s);
    }
    if errors.is_empty() {
        Ok((options, spans))
    } else {
        Err(errors)
    }
}

/// Validates one option value against its declared kind.
pub fn check_option(kind: OptionKind, value: &str) -> Result<(), String> {
    match kind {
        OptionKind::Float => value
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(|_| ())
            .ok_or_else(|| format!("expected a non-negative number, found `{value}`")),
        OptionKind::Int => value
            .parse::<u64>()
            .map(|_| ())
            .map_err(|_| format!("expected an integer, found `{value}`")),
        OptionKind::Count => value
            .parse::<u64>()
            .ok()
            .filter(|n| *n >= 1)
            .map(|_| ())
            .ok_or_else(|| format!("expected a positive integer, found `{value}`")),
        OptionKind::PowersOfTwo => match value
            .split(',')
            .find(|w| !w.parse::<u64>().is_ok_and(|n| n.is_power_of_two()))
        {
            Some(bad) => Err(format!(
                "expected comma-separated powers of two, found `{bad}`"
            )),
            None => Ok(()),
        },
        OptionKind::Path => {
            if value.is_empty() {
                Err("expected a file path".into())
            } else {
                Ok(())
            }
        }
        OptionKind::Bool => match value {
            "true" | "false" => Ok(()),
            _ => Err(format!("expected `true` or `false`, found `{value}`")),
        },
        OptionKind::Extents => parse_extents(value).map(|_| ()),
        OptionKind::List(words) => match value.split(',').find(|w| !words.contains(w)) {
            Some(bad) => Err(format!("`{bad}` is not one of {}", words.join(", "))),
            None => Ok(()),
        },
        OptionKind::Choice(choices) => {
            if choices.contains(&value) {
                Ok(())
            } else {
                Err(format!(
                    "expected one of {}, found `{value}`",
                    choices.join(", ")
                ))
            }
        }
    }
}

/// `p:4,m:2` → [("p", 4), ("m", 2)].
pub fn parse_extents(value: &str) -> Result<Vec<(String, u64)>, String> {
    value
        .split(',')
        .filter(|s| !s.is_empty())
        .map(parse_extent)
        .collect()
}

/// `p:4` → ("p", 4): an axis or dimension name and a positive size.
fn parse_extent(pair: &str) -> Result<(String, u64), String> {
    let (a, e) = pair
        .split_once(':')
        .ok_or_else(|| format!("expected `axis:extent`, found `{pair}`"))?;
    let e: u64 = e
        .parse()
        .map_err(|_| format!("extent `{e}` is not an integer"))?;
    if e == 0 || !crate::ir::is_axis_name(a) && !crate::ir::is_dim_symbol(a) {
        return Err(format!("bad size binding `{pair}`"));
    }
    Ok((a.to_string(), e))
}

/// A time limit in seconds. Listed as written (`30`, where a plain number lists as `30.0`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Seconds(pub f64);

impl Seconds {
    /// The limit as a duration: one too long to represent means no limit.
    pub fn duration(self) -> std::time::Duration {
        std::time::Duration::try_from_secs_f64(self.0.max(0.0)).unwrap_or(std::time::Duration::MAX)
    }
}

impl OptionValue for Seconds {
    fn from_text(text: &str) -> Result<Self, String> {
        f64::from_text(text).map(Seconds)
    }

    fn to_text(&self) -> String {
        self.0.to_string()
    }
}

macro_rules! integer_values {
    ($($t:ty),*) => {$(
        impl OptionValue for $t {
            fn from_text(text: &str) -> Result<Self, String> {
                text.parse().map_err(|_| format!("expected an integer, found `{text}`"))
            }

            fn to_text(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
integer_values!(u64, usize);

macro_rules! float_values {
    ($($t:ty),*) => {$(
        impl OptionValue for $t {
            fn from_text(text: &str) -> Result<Self, String> {
                text.parse().map_err(|_| format!("expected a number, found `{text}`"))
            }

            /// `1.0`, `0.01`: a float always shows as one.
            fn to_text(&self) -> String {
                format!("{self:?}")
            }
        }
    )*};
}
float_values!(f32, f64);

impl OptionValue for bool {
    fn from_text(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|_| format!("expected `true` or `false`, found `{text}`"))
    }

    fn to_text(&self) -> String {
        self.to_string()
    }
}

impl OptionValue for String {
    fn from_text(text: &str) -> Result<Self, String> {
        Ok(text.to_string())
    }

    fn to_text(&self) -> String {
        self.clone()
    }
}

/// Unset (`None`) lists no default.
impl<T: OptionValue> OptionValue for Option<T> {
    fn from_text(text: &str) -> Result<Self, String> {
        T::from_text(text).map(Some)
    }

    fn to_text(&self) -> String {
        self.as_ref().map(T::to_text).unwrap_or_default()
    }
}

/// Comma-separated; empty items are skipped.
impl<T: OptionValue> OptionValue for Vec<T> {
    fn from_text(text: &str) -> Result<Self, String> {
        text.split(',')
            .filter(|s| !s.is_empty())
            .map(T::from_text)
            .collect()
    }

    fn to_text(&self) -> String {
        self.iter().map(T::to_text).collect::<Vec<_>>().join(",")
    }
}

/// A size binding `name:size` of an `extents` list.
impl OptionValue for (String, u64) {
    fn from_text(text: &str) -> Result<Self, String> {
        parse_extent(text)
    }

    fn to_text(&self) -> String {
        format!("{}:{}", self.0, self.1)
    }
}

impl OptionValue for crate::egraph::rules::Family {
    fn from_text(text: &str) -> Result<Self, String> {
        Self::parse(text).ok_or_else(|| format!("no rule family `{text}`"))
    }

    fn to_text(&self) -> String {
        self.name().to_string()
    }
}

/// Where a file an option names is read from: the path as written when it exists (or is
/// absolute), else beside the input file.
pub fn option_input_path(path: &str, base_dir: &std::path::Path) -> std::path::PathBuf {
    let written = std::path::Path::new(path);
    if written.is_absolute() || written.exists() {
        written.to_path_buf()
    } else {
        base_dir.join(written)
    }
}

/// The help of an error about a file `option_input_path` could not read.
pub const OPTION_PATH_HELP: &str =
    "a relative path is looked up in the working directory, then beside the input file";

/// An error about a value an option named (a file that cannot be read or written): it points
/// at the option in the pipeline when the option was written there.
pub fn option_error(span: Option<Span>, message: String, help: &str) -> Diagnostic {
    match span {
        Some(s) => Diagnostic::error(s, message),
        None => Diagnostic::global(crate::diag::Severity::Error, message),
    }
    .with_help(help.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_and_write_as_option_text() {
        assert_eq!(1.0f32.to_text(), "1.0");
        assert_eq!(0.01f64.to_text(), "0.01");
        assert_eq!(Seconds(30.0).to_text(), "30");
        assert_eq!(Seconds::from_text("2.5"), Ok(Seconds(2.5)));
        assert_eq!(None::<u64>.to_text(), "");
        assert_eq!(Vec::<u64>::from_text("16,32"), Ok(vec![16, 32]));
        assert_eq!(
            Vec::<(String, u64)>::from_text("p:4,m:2").map(|v| v.to_text()),
            Ok("p:4,m:2".to_string())
        );
        assert_eq!(Seconds(1e300).duration(), std::time::Duration::MAX);
    }
}
