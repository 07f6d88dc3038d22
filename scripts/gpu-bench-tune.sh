#!/usr/bin/env bash
# The GPU bench of `tune` (issue 47): per workload of ../shared/design/workloads.md at
# B = 1, 8, 16, efopt's tuned latency (saturate, extract, rank{top=20}, tune{budget=60}, all
# in efopt: Triton compiled by python/efopt_cuda.py, launched and timed with cudarc: CUDA
# events around CUDA graphs over input copies past the L2) beside PyTorch eager,
# torch.compile and SDPA's flash backend (python/gpu_bench.py --baselines-only, the same
# timing: CUDA graphs over input copies past the L2, median), then the table and geometric
# means (python/tune_table.py). Needs a GPU, torch and triton (the GPU machine's image);
# EFOPT_PYTHON names that Python (default: python3). Writes target/gpu-bench-tune/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/gpu-bench-tune
BUDGET="${EFOPT_TUNE_BUDGET:-60}"
PY="${EFOPT_PYTHON:-python3}"
mkdir -p "$OUT"
cargo build --release --quiet
for b in 1 8 16; do
  for ex in ngpt rmsnorm_mlp rmsnorm_swiglu gated_mlp rmsnorm_gemm lora layernorm_gemm mha_decode mha_prefill; do
    echo "# $ex B=$b" >&2
    EFOPT_PYTHON="$PY" ./target/release/efopt --set "B=$b" \
      --passes="saturate,extract,rank{top=20},tune{budget=$BUDGET}" "examples/$ex.ef" \
      -o "$OUT/$ex.B$b.ef" --stats=json 2>"$OUT/$ex.B$b.json" || echo "efopt failed on $ex B=$b" >&2
  done
  "$PY" python/gpu_bench.py "$OUT" --baselines-only --set "B=$b" --json "$OUT/torch.B$b.json" \
    --only ngpt,rmsnorm_mlp,rmsnorm_swiglu,gated_mlp,rmsnorm_gemm,lora,layernorm_gemm,mha_decode,mha_prefill >&2
done
"$PY" python/tune_table.py "$OUT"
