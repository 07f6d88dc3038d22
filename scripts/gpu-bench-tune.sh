#!/usr/bin/env bash
# The GPU bench of `tune` (issue 47): per workload of ../shared/design/workloads.md at
# B = 1, 8, 16, efopt's tuned latency (saturate, extract, rank{top=20}, tune{budget=60}, all
# in efopt: Triton compiled by python/efopt_cuda.py, launched and timed with cudarc: CUDA
# events around CUDA graphs over input copies past the L2) beside PyTorch eager,
# torch.compile and SDPA's flash backend (python/gpu_bench.py --baselines-only, the same
# timing: CUDA graphs over input copies past the L2, median), then the table and geometric
# means (python/tune_table.py). Needs a GPU, torch and triton (the GPU machine's image).
#
# Environment (defaults in brackets):
#   EFOPT_PYTHON          the Python with torch and triton [python3]
#   EFOPT_BIN             an efopt binary to use instead of building one [cargo build --release]
#   EFOPT_TUNE_BUDGET     tune's budget per workload, seconds [60]
#   EFOPT_TUNE_BS         the batch sizes ["1 8 16"]
#   EFOPT_TUNE_WORKLOADS  the workloads [all nine]
#   EFOPT_EXTRACT_LIMIT   extract's time limit per workload, seconds [30]
#   EFOPT_TUNE_OPTS       more tune options (`device=simulated` for a dry run without a GPU) []
#   EFOPT_RUN_TIMEOUT     a limit on each efopt run, seconds [600]
#   EFOPT_BENCH_OUT       where results go [target/gpu-bench-tune]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${EFOPT_BENCH_OUT:-target/gpu-bench-tune}"
BUDGET="${EFOPT_TUNE_BUDGET:-60}"
PY="${EFOPT_PYTHON:-python3}"
BS="${EFOPT_TUNE_BS:-1 8 16}"
WORKLOADS="${EFOPT_TUNE_WORKLOADS:-ngpt rmsnorm_mlp rmsnorm_swiglu gated_mlp rmsnorm_gemm lora layernorm_gemm mha_decode mha_prefill}"
LIMIT="${EFOPT_EXTRACT_LIMIT:-30}"
RUN_TIMEOUT="${EFOPT_RUN_TIMEOUT:-600}"
TUNE_OPTS="${EFOPT_TUNE_OPTS:-}"
mkdir -p "$OUT"
if [ -n "${EFOPT_BIN:-}" ]; then
  BIN="$EFOPT_BIN"
else
  cargo build --release --quiet || exit 1
  BIN=./target/release/efopt
fi
for b in $BS; do
  for ex in $WORKLOADS; do
    echo "# $ex B=$b ($(date +%T))" >&2
    EFOPT_PYTHON="$PY" timeout "$RUN_TIMEOUT" "$BIN" --set "B=$b" \
      --passes="saturate,extract{time-limit=$LIMIT},rank{top=20},tune{budget=$BUDGET $TUNE_OPTS}" "examples/$ex.ef" \
      -o "$OUT/$ex.B$b.ef" --stats=json 2>"$OUT/$ex.B$b.json" || echo "efopt failed on $ex B=$b" >&2
    grep -h "^// tune\|error\|warning" "$OUT/$ex.B$b.json" | head -5 >&2
  done
  timeout "$RUN_TIMEOUT" "$PY" python/gpu_bench.py "$OUT" --baselines-only --set "B=$b" --json "$OUT/torch.B$b.json" \
    --only "$(echo $WORKLOADS | tr ' ' ',')" >&2 || echo "baselines failed at B=$b" >&2
done
"$PY" python/tune_table.py "$OUT"
