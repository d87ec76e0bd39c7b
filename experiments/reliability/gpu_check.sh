#!/usr/bin/env bash
# One device call for the reliability checks; run from the repo root (with the wheels in .whl, carried, where
# hydra is missing). Writes one file, $OUT/reliability.log, with progress in elapsed seconds.
#   bash experiments/reliability/gpu_check.sh [parts]     parts: load step tests (default: load, ~1 min)
#   load   the non-finite weight check's share of a Qwen3-8B-size load (15.3 GiB sparse bf16 checkpoint)
#   step   the run-time check's cost per step (batch-1 TPOT, nano-vLLM benchmark) with and without it, ~2 min
#          (measured already in experiments/step_path: nothing measurable)
#   tests  the GPU tests of both checks, ~2 min
#   SMOKE=1 OUT=/tmp/x PYTHON=.venv/bin/python bash experiments/reliability/gpu_check.sh load step tests
#          CPU: qwen3_tiny's shape, a few tokens, the tests only collected: checks the script end to end
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
if ! "$PY" -c "import hydra" 2>/dev/null; then  # the GPU image lacks hydra & co.: the wheels in .whl
  if [ ! -d /tmp/site/hydra ] && [ -d "${WHEELS:-.whl}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "${WHEELS:-.whl}"/*.whl || { echo "wheel install failed"; exit 1; }
  fi
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1
SMOKE_ARG=(); PYTEST_ARG=()
[ "${SMOKE:-0}" = 1 ] && SMOKE_ARG=(--smoke) && PYTEST_ARG=(--collect-only)
T0=$(date +%s); log="$OUT/reliability.log"
say() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
{
  say "reliability $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') SMOKE=${SMOKE:-0}"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  for part in ${*:-load}; do
    say "start $part"
    case "$part" in
      load) dir="${TMPDIR:-/tmp}/qwen3_8b_zeros"
            timeout 120 "$PY" experiments/reliability/check_cost.py load --dir "$dir" "${SMOKE_ARG[@]}"; rc=$?
            rm -rf "$dir" ;;
      step) timeout 150 "$PY" experiments/reliability/check_cost.py step --trials 4 "${SMOKE_ARG[@]}"; rc=$? ;;
      tests) timeout 150 "$PY" -m pytest -q -p no:xdist -p no:cacheprovider -m "gpu or not gpu" -k "not run_py" \
               "${PYTEST_ARG[@]}" tests/loader/test_non_finite_weights.py tests/layers/test_sampler_non_finite.py \
               tests/engine/test_non_finite_logits.py tests/kernels/test_triton_sampler.py 2>&1 | tail -25
             rc=${PIPESTATUS[0]} ;;
      *) echo "unknown part $part (load, step, tests)"; rc=2 ;;
    esac
    say "$part exit $rc"
  done
} 2>&1 | tee "$log"
