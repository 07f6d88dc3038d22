//! `rank` on every workload of ../shared/design/workloads.md at B = 1, 8 and 16 (full sizes):
//! candidates ranked, ranking time, the top-1's predicted time, kernels, DRAM bytes against
//! the compulsory minimum (every input read once, every output written once) and against the
//! unfused program (the source lowered as it is: one kernel per operator, every intermediate
//! stored), its FLOPs against the source's, and the paper's observation about the winner
//! beside what the model ranks first.
//!
//! Run with `cargo bench --bench rank`. Each configuration runs
//! `efopt --set B=… --passes='saturate,extract{time-limit=T},rank{top=1}' --stats=json`
//! (T from EFOPT_RANK_EXTRACT_SECS, default 10; EFOPT_BENCH_FILTER=name runs one workload);
//! attention rows extract with `stored-grids=true` (batch and head split together), marked
//! `sg`.

use std::path::Path;
use std::process::Command;

const WORKLOADS: &[&str] = &[
    "ngpt",
    "rmsnorm_mlp",
    "rmsnorm_swiglu",
    "gated_mlp",
    "rmsnorm_gemm",
    "lora",
    "layernorm_gemm",
    "mha_decode",
    "mha_prefill",
];

/// Bytes of the function's inputs and results at its sizes, and the unfused program's bytes
/// and FLOPs (the source as `lower` plans it).
fn source_figures(path: &Path, b: u64) -> (f64, f64, f64, f64) {
    let text = std::fs::read_to_string(path).expect("example");
    let mut m = efopt::parse::parse_module(&text, 0).expect("parses");
    for f in &mut m.funcs {
        for bind in &mut f.bindings {
            if bind.name == "B" {
                bind.value = b;
            }
        }
    }
    let info = efopt::verify::verify_module(&mut m).expect("verifies");
    let f = &m.funcs[0];
    let size = |t: &efopt::ir::TensorType| -> f64 {
        t.shape
            .iter()
            .map(|d| d.eval(&|s| f.binding(s)).unwrap_or(1) as f64)
            .product::<f64>()
            * t.dtype.size_bytes() as f64
    };
    let mut compulsory = 0.0;
    for p in &f.body.params {
        if let Some(efopt::ir::Type::Tensor(t)) = f.body.ty(*p) {
            compulsory += size(t);
        }
    }
    for r in &f.body.results {
        if let Some(efopt::ir::Type::Tensor(t)) = f.body.ty(*r) {
            compulsory += size(t);
        }
    }
    let plan = efopt::lower::plan(&info, f).expect("the source lowers");
    let c = efopt::lower::mask::plan_cost(&plan);
    (
        compulsory,
        (c.bytes_read + c.bytes_written) as f64,
        c.flops as f64,
        c.kernels as f64,
    )
}

fn observation(name: &str, b: u64, kernels: u64, programs: u64) -> String {
    match (name, b) {
        ("rmsnorm_mlp", _) => format!(
            "paper: 1 kernel, norm after both products; model: {kernels} kernel(s) ({})",
            if kernels == 1 { "agrees" } else { "differs" }
        ),
        ("lora", 1) => format!(
            "paper: stores X·A (2 kernels); model: {kernels} kernel(s) ({})",
            if kernels == 2 { "agrees" } else { "differs" }
        ),
        ("mha_decode", 1) => format!(
            "paper: a head over several programs; model: {programs} programs for 32 heads, {kernels} kernel(s) ({})",
            if programs > 32 { "agrees" } else { "differs" }
        ),
        ("mha_prefill", _) => format!("1 kernel (no score matrix stored): {}", kernels == 1),
        _ => String::new(),
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let secs: f64 = std::env::var("EFOPT_RANK_EXTRACT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let filter = std::env::var("EFOPT_BENCH_FILTER").unwrap_or_default();
    println!(
        "| workload | B | legal of ranked | rank s | top-1 us | bound | kernels | DRAM / compulsory | DRAM / unfused | time / (compulsory/BW) | (time − launches) / (compulsory/BW) | FLOPs / source | observation |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for name in WORKLOADS {
        if !filter.is_empty() && !name.contains(&filter) {
            continue;
        }
        let path = root.join("examples").join(format!("{name}.ef"));
        for b in [1u64, 8, 16] {
            let (compulsory, unfused, source_flops, _) = source_figures(&path, b);
            let grids = if name.starts_with("mha") {
                " stored-grids=true"
            } else {
                ""
            };
            let out = Command::new(env!("CARGO_BIN_EXE_efopt"))
                .arg("--set")
                .arg(format!("B={b}"))
                .arg(format!(
                    "--passes=saturate,extract{{time-limit={secs} max-candidates=50000 check-candidates=false{grids}}},rank{{top=1}}"
                ))
                .arg("--stats=json")
                .arg(&path)
                .arg("-o")
                .arg("/dev/null")
                .output()
                .expect("efopt runs");
            let err = String::from_utf8_lossy(&out.stderr);
            let Some(start) = err
                .find("\n{")
                .map(|i| i + 1)
                .or(err.starts_with('{').then_some(0))
            else {
                println!(
                    "| {name} | {b} | failed: {} |",
                    err.lines().last().unwrap_or("")
                );
                continue;
            };
            let stats: serde_json::Value = serde_json::from_str(&err[start..]).expect("stats json");
            let passes = stats["chunks"][0]["passes"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let rank = passes
                .iter()
                .find(|p| p["pass"].as_str().is_some_and(|n| n.starts_with("rank")));
            let Some(rank) = rank else {
                println!("| {name} | {b} | no rank pass ran |");
                continue;
            };
            let top = &rank["counters"]["candidates"][0];
            let all = format!("{}{err}", String::from_utf8_lossy(&out.stdout));
            // "N candidate(s) ranked …; M without a legal schedule dropped": N of N + M.
            let line = all
                .lines()
                .find(|l| l.starts_with("// rank @") || l.starts_with("# rank @"))
                .unwrap_or("");
            let legal: u64 = line
                .split(": ")
                .nth(1)
                .and_then(|l| l.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let illegal: u64 = line
                .split("; ")
                .find(|p| p.contains("without a legal schedule"))
                .and_then(|p| p.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let ranked = format!("{legal} of {}", legal + illegal);
            let us = top["predicted_us"].as_f64().unwrap_or(f64::NAN);
            let dram = top["dram_bytes"].as_f64().unwrap_or(f64::NAN);
            let flops = top["flops"]["total"].as_f64().unwrap_or(f64::NAN);
            let kernels = top["kernels"].as_u64().unwrap_or(0);
            let programs: u64 = top["programs"]
                .as_array()
                .map(|a| a.iter().filter_map(|p| p.as_u64()).max().unwrap_or(0))
                .unwrap_or(0);
            // H100 (the device rank used): 3.0 TB/s, 2 us a launch.
            let ideal_us = compulsory / 3.0e12 * 1e6;
            let launches = 2.0 * kernels as f64;
            println!(
                "| {name}{} | {b} | {ranked} | {:.2} | {us:.2} | {} | {kernels} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
                if grids.is_empty() { "" } else { " (sg)" },
                rank["counters"]["rank_seconds"].as_f64().unwrap_or(f64::NAN),
                top["bottleneck"].as_str().unwrap_or("?"),
                dram / compulsory,
                dram / unfused,
                us / ideal_us,
                (us - launches) / ideal_us,
                flops / source_flops,
                observation(name, b, kernels, programs),
            );
        }
    }
}
