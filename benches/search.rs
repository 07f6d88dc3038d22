//! Search at scale: per workload of ../shared/design/workloads.md at B = 16 and per example
//! layer (the five §7.3 case studies and a Llama-2-7B decoder layer), the time to the top 10
//! (`saturate,extract,rank{top=10},lower`: rank-bounded extraction, and partitioning where
//! `saturate` decides on it), the states expanded with the bound and without it
//! (`extract{top=0}`, the same time limit), the partitions tried, how the searches stopped,
//! the candidates checked wrong (extract checks each one it outputs against the source), the
//! top-1's predicted time, and the paper's saturation + extraction time beside them.
//!
//! Run with `cargo bench --bench search` (release). EFOPT_BENCH_FILTER=name runs the rows whose
//! name contains it.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// (example, B or none, paper's saturation + extraction seconds at B = 16).
const ROWS: &[(&str, Option<u64>, Option<f64>)] = &[
    ("ngpt", Some(16), Some(0.09 + 1.30)),
    ("rmsnorm_mlp", Some(16), Some(8.72 + 4.34)),
    ("rmsnorm_swiglu", Some(16), Some(0.89 + 21.37)),
    ("gated_mlp", Some(16), Some(0.04 + 0.91)),
    ("rmsnorm_gemm", Some(16), Some(0.02 + 0.51)),
    ("lora", Some(16), Some(0.07 + 4.06)),
    ("layernorm_gemm", Some(16), Some(151.6 + 117.4)),
    ("mha_decode", Some(16), Some(395.3 + 272.4)),
    ("mha_prefill", Some(16), Some(1741.9 + 910.7)),
    ("attention_sinks", None, None),
    ("differential_attention", None, None),
    ("mhc", None, None),
    ("qknorm_mla", None, None),
    ("sliding_window_gqa", None, None),
    ("llama_decoder_layer", None, None),
];

/// The extraction time limit of both runs (seconds).
const LIMIT: f64 = 30.0;

struct Run {
    seconds: f64,
    expanded: u64,
    over_bound: u64,
    stops: Vec<String>,
    partitions_tried: u64,
    subgraphs: u64,
    ranked: u64,
    top1_us: f64,
    wrong: usize,
    lowered: usize,
    failed: Option<String>,
}

fn run(path: &Path, b: Option<u64>, passes: &str) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_efopt"));
    if let Some(b) = b {
        cmd.arg("--set").arg(format!("B={b}"));
    }
    let start = Instant::now();
    let out = cmd
        .arg(format!("--passes={passes}"))
        .arg("--stats=json")
        .arg(path)
        .output()
        .expect("efopt runs");
    let seconds = start.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let mut r = Run {
        seconds,
        expanded: 0,
        over_bound: 0,
        stops: Vec::new(),
        partitions_tried: 0,
        subgraphs: 0,
        ranked: 0,
        top1_us: f64::NAN,
        wrong: err.matches("wrong candidate").count(),
        lowered: stdout.matches("schedule=None").count(),
        failed: None,
    };
    let Some(start) = err
        .find("\n{")
        .map(|i| i + 1)
        .or(err.starts_with('{').then_some(0))
    else {
        r.failed = Some(
            err.lines()
                .find(|l| l.contains("rror"))
                .unwrap_or("no statistics")
                .to_string(),
        );
        return r;
    };
    let Ok(stats) = serde_json::from_str::<serde_json::Value>(&err[start..]) else {
        r.failed = Some("unreadable statistics".into());
        return r;
    };
    let passes = stats["chunks"][0]["passes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let pass = |name: &str| {
        passes
            .iter()
            .find(|p| p["pass"].as_str().is_some_and(|n| n.starts_with(name)))
            .cloned()
    };
    if let Some(s) = pass("saturate") {
        for p in s["counters"]["partitions"].as_array().into_iter().flatten() {
            r.partitions_tried += p["partitions_tried"].as_u64().unwrap_or(0);
            r.subgraphs += p["subgraphs"].as_u64().unwrap_or(0);
        }
    }
    if let Some(e) = pass("extract") {
        for g in e["counters"]["egraphs"].as_array().into_iter().flatten() {
            r.expanded += g["expanded_states"].as_u64().unwrap_or(0);
            r.over_bound += g["pruned_over_bound"].as_u64().unwrap_or(0);
            if let Some(s) = g["stop_reason"].as_str() {
                r.stops.push(s.to_string());
            }
            // The partition race's composed candidates join the whole search's.
            if let Some(n) = g["partition_race"].as_u64() {
                r.stops.push(format!("raced ({n} composed)"));
            }
        }
    }
    if let Some(k) = pass("rank") {
        let list = k["counters"]["candidates"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        r.ranked = list.len() as u64;
        r.top1_us = list
            .first()
            .and_then(|c| c["predicted_us"].as_f64())
            .unwrap_or(f64::NAN);
    }
    if !out.status.success() {
        r.failed = Some(
            err.lines()
                .find(|l| l.contains("rror"))
                .unwrap_or("failed")
                .to_string(),
        );
    }
    r
}

fn stops(r: &Run) -> String {
    let mut s = r.stops.clone();
    s.sort();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let n = s[i..].iter().take_while(|x| **x == s[i]).count();
        out.push(if n > 1 {
            format!("{n}× {}", s[i])
        } else {
            s[i].clone()
        });
        i += n;
    }
    out.join(", ")
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let filter = std::env::var("EFOPT_BENCH_FILTER").unwrap_or_default();
    println!("| program | B | time to top 10 s | ranked | checked wrong | lowered | top-1 us | expanded (bound) | pruned by bound | stops (bound) | partitions tried | subgraphs | expanded (no bound) | stops (no bound) | time (no bound) s | paper sat.+extr. s |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (name, b, paper) in ROWS {
        if !name.contains(filter.as_str()) {
            continue;
        }
        let path = root.join(format!("{name}.ef"));
        let bounded = run(
            &path,
            *b,
            &format!("saturate,extract{{time-limit={LIMIT}}},rank{{top=10}},lower"),
        );
        let full = run(
            &path,
            *b,
            &format!("saturate,extract{{top=0 time-limit={LIMIT} max-candidates=100000000 check-candidates=false}}"),
        );
        let b = b.map_or("-".to_string(), |b| b.to_string());
        let paper = paper.map_or("-".to_string(), |p| format!("{p:.2}"));
        if let Some(f) = &bounded.failed {
            println!("| {name} | {b} | {:.2} | failed: {f} |", bounded.seconds);
            continue;
        }
        println!(
            "| {name} | {b} | {:.2} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {paper} |",
            bounded.seconds,
            bounded.ranked,
            bounded.wrong,
            bounded.lowered,
            bounded.top1_us,
            bounded.expanded,
            bounded.over_bound,
            stops(&bounded),
            bounded.partitions_tried,
            bounded.subgraphs,
            full.expanded,
            stops(&full),
            full.seconds,
        );
    }
}
