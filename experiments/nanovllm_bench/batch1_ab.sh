#!/usr/bin/env bash
# Batch-1 decode of Qwen3-0.6B at TP=1, this tree against a base commit, alternated (base, new,
# base, new) on GPU 0; median TPOT per job in $OUT/batch1_ab.md.
# Usage (repo root, GPU machine, .whl carried): bash experiments/nanovllm_bench/batch1_ab.sh BASE_REV
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 CUDA_VISIBLE_DEVICES=0
git worktree add -f /tmp/base "$1" > /dev/null 2>&1
echo "| job | tree | median TPOT ms | mean TPOT ms |" > "$OUT/batch1_ab.md"
echo "|---|---|---:|---:|" >> "$OUT/batch1_ab.md"
for i in 1 2; do
  for tree in /tmp/base "$PWD"; do
    (cd "$tree" && PYTHONPATH="/tmp/site:$tree" timeout 100 python3 run.py model=qwen3_0_6b \
      model.load_format=dummy model.dtype=bfloat16 workload=latency workload.batch_size=1 \
      scheduler.max_num_seqs=8 logger=none hydra.run.dir="$OUT/ab_${i}_$(basename "$tree")" > "$OUT/ab.log" 2>&1)
    python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; \
print(f\"| $i | $( [ "$tree" = /tmp/base ] && echo "$1" || echo this) | {s['median_tpot_ms']:.3f} | {s['mean_tpot_ms']:.3f} |\")" \
      "$OUT/ab_${i}_$(basename "$tree")/results.json" >> "$OUT/batch1_ab.md"
  done
done
cat "$OUT/batch1_ab.md"
