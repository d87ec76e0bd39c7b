#!/usr/bin/env bash
# Before/after on one GPU, in one call: the tree at $BASE (a `git archive` of an earlier commit) against
# this checkout, interleaved (base, new per round): batch-1 TPOT (Qwen3-0.6B, a 1,024-token prompt),
# the 128 req/s serving job (256 requests of 512/128 tokens, Poisson) and, in round 1,
# experiment=nanovllm_bench; bf16, dummy weights. Each job's numbers come from its results.json.
# Usage (repo root on the GPU machine; wheels installed into /tmp/site):
#   BASE=<dir> OUT=<dir> ROUNDS=2 bash experiments/tools/gpu_before_after.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
here=$PWD
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
exec >>"$OUT/before_after.log" 2>&1
COMMON=(logger=none model.load_format=dummy model.dtype=bfloat16 metrics.kv_quality.num_requests=0)
LATENCY=(workload=latency workload.batch_size=1 workload.input_len=1024 workload.output_len=128)
SERVING=(workload=random workload.num_requests=256 workload.input_len=512 workload.output_len=128
         workload.request_rate=128)
report() {  # job dir -> one line of the numbers the comparison reads
  python3 - "$1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/results.json"))["summary"]
keys = ("mean_tpot_ms", "median_tpot_ms", "p99_itl_ms", "output_throughput", "request_throughput")
print(" ".join(f"{k}={s[k]:.4g}" for k in keys if isinstance(s.get(k), (int, float))))
PY
}
job() {  # tree name kind overrides...
  local tree=$1 name=$2 kind=$3; shift 3
  local dir=/tmp/before_after/$name
  (cd "$tree" && PYTHONPATH="/tmp/site:$tree" timeout 150 python3 run.py "${COMMON[@]}" "$@" \
    "hydra.run.dir=$dir" > "$dir.log" 2>&1) || echo "$name failed: $(tail -2 "$dir.log")"
  echo "$kind $name: $(report "$dir" 2>/dev/null)"
}
mkdir -p /tmp/before_after
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in base new; do
    tree=$here; [ "$side" = base ] && tree=$BASE
    job "$tree" "${side}_latency_$round" latency "${LATENCY[@]}"
    job "$tree" "${side}_serving_$round" serving "${SERVING[@]}"
    [ "$round" = 1 ] && job "$tree" "${side}_bench_$round" bench experiment=nanovllm_bench
  done
done
