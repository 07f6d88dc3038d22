//! Saturation cost on every workload of ../shared/design/workloads.md at B = 1, 8, 16, next
//! to the paper's figures (B = 16). Run with `cargo bench --bench saturate`; times are the
//! median of five runs (`EFOPT_BENCH_REPS`); `EFOPT_BENCH_FILTER=name` runs one workload.

use efopt::egraph::rules::all_rules;
use efopt::egraph::runner::Runner;
use efopt::egraph::TypedEGraph;
use std::path::Path;
use std::time::Instant;

const WORKLOADS: &[(&str, &str, &str)] = &[
    // file, paper e-classes/e-nodes, paper saturation seconds (B = 16)
    ("ngpt", "100/296", "0.09"),
    ("rmsnorm_mlp", "346/949", "8.72"),
    ("rmsnorm_swiglu", "411/1,179", "0.89"),
    ("gated_mlp", "256/645", "0.04"),
    ("rmsnorm_gemm", "204/590", "0.02"),
    ("lora", "284/870", "0.07"),
    ("layernorm_gemm", "1,057/5,388", "151.6"),
    ("mha_decode", "5,223/22,339", "395.3"),
    ("mha_prefill", "5,286/65,283", "1741.9"),
];

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = all_rules();
    // EFOPT_BENCH_FILTER=name runs one workload; EFOPT_BENCH_REPS sets the runs per median.
    let filter = std::env::var("EFOPT_BENCH_FILTER").ok();
    let reps: usize = std::env::var("EFOPT_BENCH_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .max(1);
    println!(
        "{:<16} {:>3} {:>9} {:>8} {:>5} {:<22} {:>10} {:>20}   {:>13} {:>10}",
        "workload",
        "B",
        "e-classes",
        "e-nodes",
        "iters",
        "stop",
        "sat (ms)",
        "search/add/rebuild",
        "paper cls/nds",
        "paper (s)"
    );
    for (name, paper_size, paper_time) in WORKLOADS {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let path = root.join("examples").join(format!("{name}.ef"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            println!("{name:<16} missing {}", path.display());
            continue;
        };
        for b in [1u64, 8, 16] {
            let Ok(mut module) = efopt::parse::parse_module(&text, 0) else {
                println!("{name:<16} does not parse");
                break;
            };
            for f in &mut module.funcs {
                for binding in &mut f.bindings {
                    if binding.name == "B" {
                        binding.value = b;
                    }
                }
            }
            if efopt::verify::verify_module(&mut module).is_err() {
                println!("{name:<16} does not verify");
                break;
            }
            let f = &module.funcs[0];
            let mut times = Vec::new();
            let mut last = None;
            for _ in 0..reps {
                let Ok(mut g) = TypedEGraph::from_function(f, &module.reducers) else {
                    break;
                };
                let start = Instant::now();
                let report = Runner::default().run(&mut g, &rules);
                times.push(start.elapsed().as_secs_f64() * 1e3);
                last = Some(report);
            }
            times.sort_by(|a, b| a.total_cmp(b));
            let Some(r) = last else { continue };
            let (ps, pt) = if b == 16 {
                (*paper_size, *paper_time)
            } else {
                ("", "")
            };
            println!(
                "{:<16} {:>3} {:>9} {:>8} {:>5} {:<22} {:>10.1} {:>20}   {:>13} {:>10}",
                name,
                b,
                r.classes,
                r.nodes,
                r.iterations,
                r.stop.to_string(),
                times[times.len() / 2],
                format!(
                    "{:.1}/{:.1}/{:.1}",
                    r.phase_seconds[0] * 1e3,
                    r.phase_seconds[1] * 1e3,
                    r.phase_seconds[2] * 1e3
                ),
                ps,
                pt
            );
        }
    }
}
