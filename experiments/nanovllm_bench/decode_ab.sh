#!/usr/bin/env bash
# Decode-step table of Qwen3-0.6B (bf16 cache), this tree against a base commit, alternated
# (base, new, base, new) in one call; each tree runs its own decode_step.py.
# Usage (repo root, GPU machine): BATCHES=1,2,4,16 bash experiments/nanovllm_bench/decode_ab.sh BASE_REV
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
git worktree add -f /tmp/base "$1" > /dev/null 2>&1
for i in 1 2; do
  for tree in /tmp/base "$PWD"; do
    name=$( [ "$tree" = /tmp/base ] && echo "$1" || echo this)
    (cd "$tree" && PYTHONPATH="$tree" timeout 120 python3 experiments/nanovllm_bench/decode_step.py \
      --batches "${BATCHES:-1,2,4,16}" --contexts 1024 --out "$OUT/decode_ab_${i}_$name.md" > "$OUT/ab.log" 2>&1) \
      || tail -5 "$OUT/ab.log"
    echo "run $i, $name"; grep "^| [0-9]" "$OUT/decode_ab_${i}_$name.md"
  done
done
