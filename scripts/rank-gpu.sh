#!/usr/bin/env bash
# Writes what python/rank_gpu.py times on a GPU (issue 45: does rank's order match measured
# latency?): for each workload and batch size, the top candidates of
# `saturate,extract,rank,lower` as target/rank-gpu/<workload>.B<b>.py, with efopt's
# --stats=json (rank's predicted_us, in rank order) in <workload>.B<b>.stats.json.
# Then, on a machine with a GPU, torch and triton:
#   python3 python/rank_gpu.py target/rank-gpu [--json target/rank-gpu/result.json]
#
# Environment:
#   RANK_GPU_BATCHES  batch sizes (default "1 16")
#   RANK_GPU_ONLY     workloads to generate (space- or comma-separated; default: all nine)
#   RANK_GPU_EXTRACT  extract options (default "time-limit=20 max-candidates=50000"; attention
#                     workloads add stored-grids=true, as the rank bench does)
#   RANK_GPU_RANK     rank options (default "device=h100 top=10")
#   EFOPT             an efopt binary to use instead of building target/release/efopt
# A failing workload is logged (<workload>.B<b>.log, .stats.json) and the loop goes on; the
# failures are listed at the end and the exit status is 1 if there were any.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/rank-gpu
BATCHES="${RANK_GPU_BATCHES:-1 16}"
ONLY="${RANK_GPU_ONLY:-ngpt rmsnorm_mlp rmsnorm_swiglu gated_mlp rmsnorm_gemm lora layernorm_gemm mha_decode mha_prefill}"
EXTRACT="${RANK_GPU_EXTRACT:-time-limit=20 max-candidates=50000}"
RANK="${RANK_GPU_RANK:-device=h100 top=10}"
if [[ -n "${EFOPT:-}" ]]; then
  efopt="$EFOPT"
else
  cargo build --release --quiet
  efopt=./target/release/efopt
fi
mkdir -p "$OUT"
failed=()
for name in ${ONLY//,/ }; do
  if [[ ! -f "examples/$name.ef" ]]; then
    echo "$name: no examples/$name.ef" >&2
    failed+=("$name")
    continue
  fi
  for b in $BATCHES; do
    base="$OUT/$name.B$b"
    rm -f "$base.py" "$base.stats.json" "$base.log"
    start=$SECONDS
    # stdout (the pass summaries) goes to the log, stderr (remarks, then the JSON) to stats
    extract="$EXTRACT"
    if [[ "$name" == mha_* ]]; then
      extract="$extract stored-grids=true"
    fi
    if "$efopt" --set "B=$b" --passes="saturate,extract{$extract},rank{$RANK},lower" \
      "examples/$name.ef" -o "$base.py" --stats=json >"$base.log" 2>"$base.stats.json"; then
      n=$(grep -c '^def [A-Za-z0-9_]*_c[0-9]*(' "$base.py" || true)
      echo "$base.py: $n candidates in $((SECONDS - start)) s"
    else
      status=$?
      echo "$name B=$b: efopt failed (exit $status) after $((SECONDS - start)) s; see $base.log, $base.stats.json" >&2
      tail -n 5 "$base.stats.json" >&2 || true
      rm -f "$base.py" # a partial module must not be timed
      failed+=("$name.B$b")
    fi
  done
done
if ((${#failed[@]})); then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
echo "next, on a GPU machine: python3 python/rank_gpu.py $OUT --json $OUT/result.json"
