//! Names for diagnostics: the closest known name to a misspelt one, the operator names, and
//! how to write an operator's bracket arguments.

use crate::ir::{BINARY_OPS, UNARY_OPS};

pub(super) fn closest<'a>(
    name: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1; b.len() + 1];
            for (j, cb) in b.iter().enumerate() {
                cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1);
            }
            prev = cur;
        }
        prev[b.len()]
    }
    candidates
        .map(|c| (distance(name, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min()
        .map(|(_, c)| c)
}

pub(super) fn all_op_names() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = UNARY_OPS.iter().map(|(n, _)| *n).collect();
    v.extend(BINARY_OPS.iter().map(|(n, _)| *n));
    v.extend([
        "select",
        "tuple",
        "get",
        "partition",
        "replicate",
        "combination",
        "collection",
        "cast",
        "matmul",
        "tile_matmul",
        "transpose",
        "reshape",
        "broadcast",
        "fill",
        "iota",
        "slice",
        "concat",
    ]);
    v
}

pub(super) fn bracket_help(op: &str) -> String {
    match op {
        "partition" | "combination" => format!("write `{op}[DIM,axis](x)`, e.g. `{op}[K,p](x)`"),
        "replicate" | "collection" => format!("write `{op}[axis](x)`"),
        "get" => "write `get[0](t)` or `get[field](t)`".into(),
        "reshape" | "broadcast" => format!("write `{op}[SHAPE](x)`, e.g. `{op}[Bx32x128](x)`"),
        "fill" => "write `fill[0.0]`".into(),
        "iota" => "write `iota[DIM]`".into(),
        "slice" => "write `slice[DIM, START, END](x)`, e.g. `slice[1, 0, 4](x)` or `slice[T, 0, T0](x)` (END exclusive)".into(),
        "concat" => "write `concat[DIM](a, b, …)`, e.g. `concat[0](cache, row)`".into(),
        _ => String::new(),
    }
}
