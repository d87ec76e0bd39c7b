#!/usr/bin/env bash
# One device call for the reliability checks: the non-finite weight check's share of a Qwen3-8B-size
# load, the run-time check's cost per step (batch-1 TPOT, nano-vLLM benchmark) with and without it, and
# the GPU tests of both checks. Run from the repo root; writes $OUT/reliability.log. About 3 minutes.
#   bash experiments/reliability/gpu_check.sh [parts]   parts: load step tests (default: all three)
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if [ -d "${WHEELS:-.whl}" ] && [ ! -d /tmp/site/hydra ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "${WHEELS:-.whl}"/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1
log="$OUT/reliability.log"
{
  echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  for part in ${*:-load step tests}; do
    echo "== $part"
    case "$part" in
      load) timeout 90 python3 experiments/reliability/check_cost.py load; rc=$?
            rm -rf "${TMPDIR:-/tmp}/qwen3_8b_zeros" ;;
      step) timeout 120 python3 experiments/reliability/check_cost.py step --trials 4; rc=$? ;;
      tests) timeout 150 python3 -m pytest -q -p no:xdist -p no:cacheprovider -m "gpu or not gpu" -k "not run_py" \
               tests/loader/test_non_finite_weights.py tests/layers/test_sampler_non_finite.py \
               tests/engine/test_non_finite_logits.py tests/test_triton_sampler.py 2>&1 | tail -25
             rc=${PIPESTATUS[0]} ;;
      *) echo "unknown part $part"; rc=2 ;;
    esac
    echo "== $part exit $rc"
  done
} 2>&1 | tee "$log"
