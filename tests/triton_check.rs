//! Lowered candidates run under the Triton CPU interpreter and match the reference
//! interpreter, with several block sizes (16 does not divide every dimension), and every
//! kernel compiles for sm_90. Needs the venv from `scripts/setup-venv.sh` (the README's test
//! command creates it).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The number just before `what` in the `// triton-check:` summary line.
fn count(summary: &str, what: &str) -> u64 {
    let (head, _) = summary
        .split_once(what)
        .unwrap_or_else(|| panic!("`{what}` missing from {summary}"));
    head.rsplit(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no count before `{what}` in {summary}"))
}

fn venv_python(root: &Path) -> PathBuf {
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-venv.sh first",
        python.display()
    );
    python
}

/// Runs `efopt` with `passes` on an example at `sizes` and checks the `triton-check`
/// summary: success, no failure, every extracted candidate lowered, and every checked one
/// (a fixed-seed sample of them) run once per block size (two here). Returns the summary
/// line.
fn check_example(name: &str, sizes: &[&str], passes: &str) -> String {
    check_file(&format!("examples/{name}.ef"), sizes, passes)
}

/// Runs `efopt --passes=PASSES FILE` (FILE relative to the checkout, `--set` for each of
/// `sizes`) with the venv's Python and the extra environment `env`: exit code, stdout,
/// stderr.
fn efopt(
    file: &str,
    sizes: &[&str],
    passes: &str,
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_efopt"));
    for s in sizes {
        cmd.args(["--set", s]);
    }
    let out = cmd
        .arg(format!("--passes={passes}"))
        .arg(root.join(file))
        .env("EFOPT_PYTHON", venv_python(root))
        .envs(env.iter().copied())
        .output()
        .expect("efopt runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `check_example` on a file of the checkout.
fn check_file(name: &str, sizes: &[&str], passes: &str) -> String {
    let (code, stdout, stderr) = efopt(name, sizes, passes, &[]);
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("// triton-check:"))
        .unwrap_or_else(|| panic!("{name}: no triton-check summary\n{stdout}\n{stderr}"))
        .to_string();
    assert_eq!(code, Some(0), "{name}: {summary}\n{stderr}");
    assert_eq!(count(&summary, " failed"), 0, "{name}: {summary}");
    let lowered = count(&summary, " function(s) lowered");
    assert!(lowered > 0, "{name}: nothing lowered: {summary}");
    assert_eq!(
        count(&summary, " not lowered"),
        0,
        "{name}: {summary}\n{stderr}"
    );
    let checked = count(&summary, " checked");
    assert!(checked > 0 && checked <= lowered, "{name}: {summary}");
    assert_eq!(
        count(&summary, " run(s) ok"),
        2 * checked,
        "{name}: {summary}"
    );
    summary
}

#[test]
fn extracted_candidates_run_and_compile() {
    let small = ["B=4", "H=48", "F=40", "N=40", "R=16"];
    for (name, sized) in [
        ("attention_m0", false),
        ("attention_m1", false),
        ("attention_m2", false),
        ("matmul_exp_tiled", false),
        ("rowsum_collection", false),
        ("rowsum_tiled", false),
        ("rowsum", false),
        ("matmul_exp", false),
        ("lora", true),
        ("gated_mlp", true),
        ("rmsnorm_mlp", true),
        ("rmsnorm_gemm", true),
        ("ngpt", true),
        ("rmsnorm_swiglu", true),
        ("layernorm_gemm", true),
    ] {
        let sizes: &[&str] = if sized { &small } else { &[] };
        let summary = check_example(
            name,
            sizes,
            "saturate,extract{max-candidates=200},triton-check{compile=sm_90 blocks=16,32 sample=6}",
        );
        assert!(
            count(&summary, " kernel compilation") > 0,
            "{name}: {summary}"
        );
    }
}

/// Issue 42's programs under Triton: sliding windows whose first key tiles are fully masked
/// and causal attention, whose later key tiles are (the generated rolling reducer's guard,
/// lowered, keeps them from NaN), and one-row queries (a product with one row is no `tl.dot`,
/// which needs 16: the old lowering failed in Triton with "Input shapes should have M >=
/// 16"). Single-kernel candidates, which fold every key tile in one loop, and the first
/// candidates of any kind.
#[test]
fn masked_first_tiles_and_one_row_queries_run_and_compile() {
    for name in [
        "sliding_window_decode",
        "sliding_window_prefill",
        "causal_prefill",
        "decode_single_query",
        "attention_sinks_decode",
    ] {
        for extract in [
            "extract{max-candidates=40 max-kernels=1}",
            "extract{max-candidates=40}",
        ] {
            let summary = check_file(
                &format!("tests/corpus/{name}.ef"),
                &[],
                &format!("saturate,{extract},triton-check{{compile=sm_90 blocks=16,32 sample=4}}"),
            );
            assert!(
                count(&summary, " kernel compilation") > 0,
                "{name}: {summary}"
            );
        }
    }
}

/// A one-row LM head written with a literal 1 (`tests/corpus/lm_head_literal_row.ef`): its
/// softmax kernels run on a grid of one program over the row (axis `n1`), a block of 16 or
/// 32 over an extent of 1 masked to the row.
#[test]
fn literal_one_row_grids_run_and_compile() {
    let file = "tests/corpus/lm_head_literal_row.ef";
    let passes =
        "saturate,extract{max-candidates=40},triton-check{compile=sm_90 blocks=16,32 sample=6}";
    let summary = check_file(file, &[], passes);
    assert!(
        count(&summary, " kernel compilation") > 0,
        "lm_head_literal_row: {summary}"
    );
    // Some checked candidate runs a kernel on the one-program grid over the row.
    let (_, stdout, _) = efopt(file, &[], passes, &[]);
    assert!(
        stdout.lines().any(|l| l.starts_with("// triton-check ")
            && l.contains("\"BLOCK_n1\"")
            && l.contains(": ok")),
        "no candidate with an n1 grid was run:\n{stdout}"
    );
}

/// Folds that skip the key tiles their mask removes entirely and mask only the tiles it does
/// not keep entirely (`tests/lit/lower/masked_folds.ef`): causal, sliding-window (narrower
/// and wider than a tile; late rows' first key tiles fully masked) and sink masks, prefill
/// and decode, at sizes no block divides, two windows sorted at run time, rows that see no
/// key; and folds that must not skip (a running maximum
/// filled with 0, a sum filled with 1, an unguarded online softmax), which visit every tile.
/// All run against the reference interpreter with blocks of 16 and 32 and compile for sm_90.
#[test]
fn masked_folds_skip_tiles_run_and_compile() {
    check_counts("tests/lit/lower/masked_folds.ef", &[], 12, 12);
}

/// The case studies' optimised forms (examples/*_fused.ef, examples/qknorm_mla_absorbed.ef)
/// at small sizes no block divides: every construct lowers, runs against the reference
/// interpreter and compiles. The window and sink masks are offset by sizes (`T − 1`, `W`),
/// and their folds skip the masked key tiles.
#[test]
fn case_study_forms_run_and_compile() {
    for (name, sizes) in [
        (
            "sliding_window_gqa_fused",
            &["KVH=2", "T=72", "D=16", "W=20"][..],
        ),
        (
            "attention_sinks_fused",
            &["NH=2", "T=72", "D=16", "W=20"][..],
        ),
        ("mhc_fused", &["B=5", "C=24"][..]),
        (
            "qknorm_mla_absorbed",
            &["T=40", "L=16", "NH=2", "DH=16"][..],
        ),
        (
            "differential_attention_fused",
            &["NH=2", "T=40", "D=8", "DV=16"][..],
        ),
    ] {
        let summary = check_example(name, sizes, "triton-check{compile=sm_90 blocks=16,32}");
        assert!(
            count(&summary, " kernel compilation") > 0,
            "{name}: {summary}"
        );
    }
}

/// The corpus's masked attention, extracted (single-kernel candidates, whose loops skip
/// masked key tiles) at sizes no block divides, run and compiled.
#[test]
fn masked_corpus_candidates_at_odd_sizes_run_and_compile() {
    for (name, sizes) in [
        ("causal_prefill", &["Q=40", "K=40"][..]),
        ("sliding_window_prefill", &["Q=40", "K=40"][..]),
        ("attention_sinks_window", &["Q=40", "K=40"][..]),
        ("sliding_window_decode", &["K=100"][..]),
        ("attention_sinks_decode", &["K=100"][..]),
        ("flash_cast_probabilities", &["T=40"][..]),
        ("narrow_causal_attention", &["T=40"][..]),
        ("softcap_decode_bf16", &["S=100"][..]),
        ("sigmoid_causal_attention", &["T=40"][..]),
        ("window_decode_gqa_f16", &["S=100"][..]),
        ("causal_window_merged_heads", &["T=37"][..]),
    ] {
        let summary = check_file(
            &format!("tests/corpus/{name}.ef"),
            sizes,
            "saturate,extract{max-candidates=8 max-kernels=1},triton-check{compile=sm_90 blocks=16,32 sample=2}",
        );
        assert!(
            count(&summary, " kernel compilation") > 0,
            "{name}: {summary}"
        );
    }
}

/// Constant results (a mask from `iota`s, a `fill`) and a tensor-level `iota`, which had no
/// kernel or were refused (tests/lit/lower/constants.ef).
#[test]
fn constant_results_run_and_compile() {
    let summary = check_file(
        "tests/lit/lower/constants.ef",
        &[],
        "saturate,extract,triton-check{compile=sm_90 blocks=16,32}",
    );
    assert_eq!(count(&summary, " checked"), 3, "{summary}");
    assert!(count(&summary, " kernel compilation") >= 4, "{summary}");
}

/// A compiler crash (Triton's C++ asserts abort the process) fails the check naming the
/// kernel, and the other kernels are still compiled. The crash is injected through
/// `EFOPT_TRITON_ABORT_ON`.
#[test]
fn a_compiler_crash_names_the_kernel_and_the_rest_compiles() {
    let (code, stdout, stderr) = efopt(
        "examples/rowsum.ef",
        &[],
        "saturate,extract,triton-check{compile=sm_90 blocks=16}",
        &[("EFOPT_TRITON_ABORT_ON", "rowsum_c0_k0")],
    );
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("// triton-check:"))
        .unwrap_or_else(|| panic!("no summary\n{stdout}\n{stderr}"));
    assert_eq!(count(summary, " failed"), 1, "{summary}");
    // rowsum's candidates have four kernels: the three besides the crashed one compile.
    assert!(count(summary, " kernel compilation") >= 3, "{summary}");
    assert!(
        stderr.contains("rowsum_c0_k0") && stderr.contains("the compiler aborted"),
        "{stderr}"
    );
}

/// Hand-written stores: a stored tuple (one buffer per field), a store along a loop axis
/// (inside the loop) and a collection along it, all run and compiled.
#[test]
fn tuple_and_in_loop_stores_run_and_compile() {
    check_counts("tests/lit/lower/stores.ef", &[], 3, 4);
}

/// A file of the checkout at `sizes`: `functions` checked (all of them; `check_file`
/// asserts none fails), at least `kernels` kernel compilations for sm_90.
fn check_counts(file: &str, sizes: &[&str], functions: u64, kernels: u64) {
    let summary = check_file(file, sizes, "triton-check{compile=sm_90 blocks=16,32}");
    assert_eq!(count(&summary, " checked"), functions, "{summary}");
    assert!(
        count(&summary, " kernel compilation") >= kernels,
        "{summary}"
    );
}

/// `slice` and `concat` as views (tests/lit/lower/views.ef): a concat result, slices read by
/// tensor-level operators, a tiled region whose key tiles straddle a cache and the row
/// appended to it, with derived sizes, and views of views of a computed piece; then the extracted candidates of a KV-cache append
/// followed by decode attention (which load through the concat inside the fused kernel) and
/// of mHC-like coefficient groups (slices of the weight fused into one kernel). All run
/// under the interpreter against the reference and compile for sm_90.
#[test]
fn slice_and_concat_views_run_and_compile() {
    check_counts("tests/lit/lower/views.ef", &[], 4, 10);
    for name in ["kv_cache_append_decode", "mhc_coefficient_groups"] {
        for extract in [
            "extract{max-candidates=40 max-kernels=3}",
            "extract{max-candidates=40}",
        ] {
            let summary = check_file(
                &format!("tests/corpus/{name}.ef"),
                &[],
                &format!("saturate,{extract},triton-check{{compile=sm_90 blocks=16,32 sample=3}}"),
            );
            assert!(
                count(&summary, " kernel compilation") > 0,
                "{name}: {summary}"
            );
        }
    }
}

/// Broadcasts (new leading dimensions, a size-1 dimension stretched, a scalar), at tensor
/// level and loaded by a tiled region, all run and compiled.
#[test]
fn broadcasts_run_and_compile() {
    check_counts("tests/lit/lower/layout.ef", &[], 3, 4);
}

/// Reshapes (tests/lit/lower/reshape.ef): views of an input and of a stored value (heads split
/// from the hidden dimension and merged back), a merged result that is a view of the buffer
/// its kernel writes (returned reshaped by the host), a chain of views, a view of a stored transpose, tiles of a view, a block reshape of unpadded
/// tiles: run and compiled. The padded block reshape the file also holds is refused by name.
#[test]
fn reshapes_run_and_compile() {
    let (code, stdout, stderr) = efopt(
        "tests/lit/lower/reshape.ef",
        &[],
        "triton-check{compile=sm_90 blocks=16,32}",
        &[],
    );
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("// triton-check:"))
        .unwrap_or_else(|| panic!("no triton-check summary\n{stdout}\n{stderr}"));
    assert_eq!(code, Some(0), "{summary}\n{stderr}");
    assert_eq!(count(summary, " function(s) lowered"), 6, "{summary}");
    assert_eq!(count(summary, " not lowered"), 1, "{summary}");
    assert!(
        stderr.contains("cannot lower `padded_tile_reshape`"),
        "{stderr}"
    );
    assert_eq!(count(summary, " checked"), 6, "{summary}");
    assert_eq!(count(summary, " run(s) ok"), 12, "{summary}");
    assert_eq!(count(summary, " failed"), 0, "{summary}");
    // 1 + 2 + 1 + 2 + 1 + 2 kernels (the merged result is no kernel), each compiled.
    assert_eq!(count(summary, " kernel compilation"), 9, "{summary}");
}

/// Matrix products of operands of different ranks (tests/lit/lower/mixed_rank.ef: 3-d × 2-d,
/// 2-d × 3-d, a batch dimension of 1 on either side, 4-d × 3-d bf16, one row), and every
/// candidate extraction finds for a batched linear layer (its M, N, K and batch splits; before,
/// `lower` refused them all): run and compiled.
#[test]
fn mixed_rank_products_run_and_compile() {
    check_counts("tests/lit/lower/mixed_rank.ef", &[], 6, 6);
    let summary = check_file(
        "tests/inputs/batched_linear.ef",
        &[],
        "saturate,extract,triton-check{compile=sm_90 blocks=16,32}",
    );
    assert_eq!(count(&summary, " checked"), 9, "{summary}");
    assert!(count(&summary, " kernel compilation") >= 9, "{summary}");
}

/// Masks and integer values (tests/lit/lower/masks.ef): at tensor level, tiled, inside reducer
/// bodies (an item, or built there from index items), against batched scores, split views of a
/// broadcast, transposed and reduced mask and a whole view of a user reducer's fold of a
/// constant; `i32` inputs reduced and divided, `i1` inputs combined: run and compiled.
#[test]
fn masks_and_integers_run_and_compile() {
    check_counts("tests/lit/lower/masks.ef", &[], 11, 20);
}

/// Hand-written folds: an all-reduce collection fold before the kernel's other loop, a
/// one-field user reducer over a tile dimension, a collection fold inside a kernel, a
/// result stored through nested combinations (a two-dimensional grid), a whole (combined
/// in-kernel) axis, an axis both folded in a loop and on the grid, and user
/// reducers folded element by element (over a partial tile's dimension and at tensor
/// level) and over stored stacks (of tiles split by `k`, and of per-tile statistics), and
/// products (`@mul`, through `tl.reduce` and a combine function) over a tile dimension and
/// at tensor level, all run and compiled.
#[test]
fn all_reduce_and_user_reducer_folds_run_and_compile() {
    check_counts("tests/lit/lower/folds.ef", &[], 12, 15);
}

/// Single-kernel MHA decode candidates that split the head dimension `d` of the output
/// across programs while each folds `Q Kᵀ` over `d` in a loop (`d` a grid and a loop axis;
/// `lower` refused all such programs before), two of them with a fold over `d` hoisted out of
/// the loop over `k` beside one inside it (which shared one loop, reading `k` offsets before
/// that loop opened). Extracted by `extract{max-kernels=1}`; run, compared and compiled.
#[test]
fn head_split_attention_candidates_run_and_compile() {
    check_counts(
        "tests/inputs/mha_decode_head_split.ef",
        &["B=2", "NH=2", "K=64", "D=32"],
        4,
        4,
    );
}

/// MHA decode candidates that fold softmax statistics at tensor level over a stored stack of
/// per-key-tile values with a generated repair reducer (a loop over `k` loading each tile at
/// its key offsets; refused before). K = 40 leaves a partial last key tile at block 16 and
/// 32. Run, compared and compiled.
#[test]
fn stacked_fold_attention_candidates_run_and_compile() {
    check_counts(
        "tests/inputs/mha_decode_stacked_fold.ef",
        &["B=2", "NH=2", "K=40", "D=32"],
        3,
        6,
    );
}

/// Multi-head attention: batched (rank-4) products, as a 3-d `tl.dot` or, with one query row
/// (decode), as a broadcast multiply and sum. Both also compile for sm_90 (this needs the batch
/// dimensions unpadded: padded to 16 they made each prefill kernel take minutes).
#[test]
fn multi_head_attention_candidates_run() {
    for (name, sizes) in [
        ("mha_decode", &["B=2", "NH=2", "K=32", "D=16"][..]),
        ("mha_prefill", &["B=2", "NH=2", "Q=16", "K=32", "D=16"][..]),
    ] {
        let summary = check_example(
            name,
            sizes,
            "saturate,extract{max-candidates=12},triton-check{compile=sm_90 blocks=16,32 sample=6}",
        );
        assert!(count(&summary, " checked") >= 5, "{name}: {summary}");
        assert!(
            count(&summary, " kernel compilation") > 0,
            "{name}: {summary}"
        );
    }
}

/// The comparison is real: the lowered FlashAttention form is close to the reference but
/// not bit-equal, so `tol=0` reports a mismatch and fails the pipeline.
#[test]
fn a_mismatch_fails_the_pipeline() {
    let (code, stdout, stderr) = efopt(
        "examples/attention_m2.ef",
        &[],
        "triton-check{tol=0 blocks=16}",
        &[],
    );
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("MISMATCH"), "{stdout}");
    assert!(stderr.contains("triton-check: 1 failure(s)"), "{stderr}");
}

/// The GPU bench's CPU-side helpers (which candidates its tile filter times, the schedule
/// space): `python/test_gpu_bench.py` under the venv's Python, which has no torch.
#[test]
fn gpu_bench_helpers() {
    python_test("python/test_gpu_bench.py");
}

/// Runs a Python test script of the checkout under the venv's Python, from the checkout.
fn python_test(script: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(venv_python(root))
        .arg(root.join(script))
        .current_dir(root)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{script}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The rank-vs-measured GPU script's CPU-side helpers (Spearman's rank correlation with
/// ties, reading rank's `--stats=json`, the examples' inputs and sizes, the worker driver
/// with a stand-in worker): `python/test_rank_gpu.py` under the venv's Python.
#[test]
fn rank_gpu_helpers() {
    python_test("python/test_rank_gpu.py");
}

/// Candidates ranked at the workloads' full sizes keep the schedules rank chose (blocks of
/// one row where no product needs 16, blocks up to 1024, 1 to 5 stages), and run under those
/// schedules (the host function's default) at small sizes, and compile for sm_90.
#[test]
fn ranked_candidates_run_and_compile_at_their_schedules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("efopt-ranked-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, full, small) in [
        ("ngpt", &["B=1"][..], &["B=3", "H=40"][..]),
        ("rmsnorm_gemm", &["B=16"][..], &["B=3", "H=40", "N=24"][..]),
        ("lora", &["B=1"][..], &["B=2", "H=32", "N=40", "R=16"][..]),
        ("layernorm_gemm", &["B=8"][..], &["B=3", "H=40", "N=24"][..]),
        (
            "mha_decode",
            &["B=1"][..],
            &["B=2", "NH=2", "K=40", "D=16"][..],
        ),
    ] {
        let ranked = dir.join(format!("{name}.ef"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_efopt"));
        for s in full {
            cmd.args(["--set", s]);
        }
        let out = cmd
            .arg("--passes=saturate,extract{max-candidates=300 max-kernels=2},rank{top=4}")
            .arg(root.join(format!("examples/{name}.ef")))
            .arg("-o")
            .arg(&ranked)
            .output()
            .expect("efopt runs");
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&ranked).unwrap();
        assert!(
            text.contains(" schedule("),
            "{name}: no schedule in\n{text}"
        );
        let file = ranked.to_str().unwrap();
        let (code, stdout, stderr) = efopt(
            file,
            small,
            "triton-check{compile=sm_90 blocks=16 sample=0}",
            &[],
        );
        let summary = stdout
            .lines()
            .find(|l| l.starts_with("// triton-check:"))
            .unwrap_or_else(|| panic!("{name}: no summary\n{stdout}\n{stderr}"))
            .to_string();
        assert_eq!(code, Some(0), "{name}: {summary}\n{stdout}\n{stderr}");
        assert_eq!(count(&summary, " failed"), 0, "{name}: {summary}");
        // Each function: its ranked schedule ({}) and blocks of 16.
        assert_eq!(
            count(&summary, " run(s) ok"),
            2 * count(&summary, " checked"),
            "{name}: {summary}"
        );
        assert!(stdout.contains(" schedule {}: ok"), "{name}: {stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `pow` of negative bases (half the random inputs), zero bases and zero exponents runs equal
/// to the interpreter (the old `exp(y · log x)` was NaN for every negative base).
#[test]
fn powers_of_negative_bases_run_and_compile() {
    check_file(
        "tests/lit/lower/powers.ef",
        &[],
        "saturate,extract{max-candidates=6},triton-check{compile=sm_90 blocks=16,32}",
    );
}

/// bf16 casts round to nearest even under the CPU interpreter as on the GPU: a one-row
/// SwiGLU layer with bf16 intermediates runs within tolerance (it read 1.4 % off when the
/// interpreter truncated).
#[test]
fn bf16_casts_round_as_the_gpu_rounds() {
    check_file(
        "tests/lit/lower/bf16_rounding.ef",
        &["H=24", "F=24"],
        "saturate,extract{max-candidates=60 time-limit=10},triton-check{blocks=16,32 sample=6}",
    );
}

/// The tolerance a narrow program gets comes from the interpreter run without rounding
/// bf16/f16 results: that run is the f32 program on the same (narrow) inputs, and the
/// rounded run differs from it by the narrow roundings only. A sum of 64 bf16 products is
/// a few bf16 roundings from exact, not O(1).
#[test]
fn exact_floats_skip_only_narrow_rounding() {
    use efopt::interp::{random_inputs, relative_l2, Interpreter, Sizes};
    let narrow = "func f where M = 8, K = 64 {\n  a: tensor<MxK, bf16> = input\n  b: tensor<MxK, bf16> = input\n  e = exp(a * b)\n  return reduce e axis=1 reducer=@add keep_dims\n}\n";
    let wide = "func f where M = 8, K = 64 {\n  a: tensor<MxK, bf16> = input\n  b: tensor<MxK, bf16> = input\n  e = exp(cast(a) to=f32 * cast(b) to=f32)\n  return reduce e axis=1 reducer=@add keep_dims\n}\n";
    let run = |text: &str, exact: bool| {
        let mut m = efopt::parse::parse_module(text, 0).expect("parses");
        efopt::verify::verify_module(&mut m).expect("verifies");
        let f = &m.funcs[0];
        let sizes = Sizes::for_function(f, 4);
        let inputs = random_inputs(f, &sizes, 3, 1.0).expect("inputs");
        let mut interp = Interpreter::new(&m, sizes);
        if exact {
            interp = interp.with_exact_floats();
        }
        let out = interp.run(f, &inputs).expect("runs");
        out[0].dense().expect("a tensor").clone()
    };
    let (rounded, exact, f32) = (run(narrow, false), run(narrow, true), run(wide, false));
    // Without rounding, the bf16 program is the f32 one.
    assert!(relative_l2(&exact, &f32) < 1e-6);
    // With it, a few bf16 unit roundoffs (2^-8) away: the tolerance stays tight.
    let own = relative_l2(&rounded, &exact);
    assert!(own > 1e-4 && own < 4.0 * 2f64.powi(-8), "{own}");
}
