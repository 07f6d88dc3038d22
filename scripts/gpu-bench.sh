#!/usr/bin/env bash
# Writes the Triton modules that python/gpu_bench.py times on a GPU: one per workload, every
# lowered candidate of `saturate,extract{max-candidates=N},lower`, into target/gpu-bench/.
# Then, on a machine with a GPU, torch and triton:
#   python3 python/gpu_bench.py target/gpu-bench
set -euo pipefail
cd "$(dirname "$0")/.."
N="${EFOPT_GPU_CANDIDATES:-16}"
OUT=target/gpu-bench
mkdir -p "$OUT"
cargo build --release --quiet
# gen EXAMPLE MODULE-SUFFIX EXTRACT-OPTIONS LOWER-OPTIONS
gen() {
  local func
  func=$(sed -n 's/^func \([a-z_0-9]*\).*/\1/p' "examples/$1.ef" | head -1)
  local out="$OUT/$func$2.py"
  ./target/release/efopt --passes="saturate,extract{max-candidates=$N $3},lower{$4}" \
    "examples/$1.ef" -o "$out" >"$out.log" 2>&1 || { echo "efopt failed on $1 (see $out.log)"; exit 1; }
  echo "$out: $(grep -c '^def .*_c[0-9]*(' "$out") lowered candidates"
}
# Attention: the single-kernel candidates (FlashAttention-style folds), also with bf16 dots.
gen attention_m0 "" "max-kernels=1" ""
gen attention_m0 .bf16dot "max-kernels=1" "dot-bf16=true"
for ex in gated_mlp rmsnorm_mlp rmsnorm_swiglu rmsnorm_gemm lora layernorm_gemm ngpt; do
  gen "$ex" "" "" ""
done
