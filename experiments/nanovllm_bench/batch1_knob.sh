#!/usr/bin/env bash
# Batch-1 decode of Qwen3-0.6B (MODEL= another conf/model) at TP=1, two settings of one knob
# alternated (A, B, A, B; ROUNDS=1: A, B) on GPU 0; median TPOT per job in $OUT/batch1_knob.md.
# Usage (repo root, GPU machine, .whl carried):
#   bash experiments/nanovllm_bench/batch1_knob.sh engine.pdl=on engine.pdl=prefetch
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 CUDA_VISIBLE_DEVICES=0
echo "| job | setting | median TPOT ms | mean TPOT ms | p99 TPOT ms |" > "$OUT/batch1_knob.md"
echo "|---|---|---:|---:|---:|" >> "$OUT/batch1_knob.md"
for i in $(seq "${ROUNDS:-2}"); do
  for setting in "$1" "$2"; do
    dir="$OUT/knob_${i}_${setting//[^a-z0-9]/_}"
    timeout 150 python3 run.py model="${MODEL:-qwen3_0_6b}" model.load_format=dummy model.dtype=bfloat16 \
      workload=latency workload.batch_size=1 scheduler.max_num_seqs=8 logger=none "$setting" \
      hydra.run.dir="$dir" > "$OUT/knob.log" 2>&1 || tail -5 "$OUT/knob.log"
    python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; \
print(f\"| $i | $setting | {s['median_tpot_ms']:.3f} | {s['mean_tpot_ms']:.3f} | {s['p99_tpot_ms']:.3f} |\")" \
      "$dir/results.json" >> "$OUT/batch1_knob.md"
  done
done
cat "$OUT/batch1_knob.md"
(cd "$OUT" && tar czf knob_runs.tgz knob_* && rm -rf knob_*)
