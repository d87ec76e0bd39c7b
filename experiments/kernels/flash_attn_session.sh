#!/usr/bin/env bash
# One device call for the flash-attn backend (issue 14): build flash-attn from the sdist, its GPU
# tests, the decode-step table and the nano-vLLM benchmark sweep for triton and flash_attn.
# Usage (repo root, on the GPU machine, with .fa/flash_attn-2.8.3.tar.gz and .whl/ carried):
#   bash experiments/kernels/flash_attn_session.sh [parts]
# parts: any of build tests decode bench (default: build tests). A second call on a fresh machine
# builds again (about the first part's time): `build decode bench`.
# Everything lands in $OUT/results.tar.gz (logs, tables, sweep summaries); the build log and a
# short summary.txt are also left beside it.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
FA_TARGET="${FA_TARGET:-/tmp/fa}"
if [ -d .whl ]; then  # the GPU image lacks hydra-core, omegaconf, antlr and submitit
  [ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
fi
export PYTHONPATH="$FA_TARGET:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
parts="${*:-build tests}"
WORK="$OUT/work"; mkdir -p "$WORK"
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv; nproc; free -g | head -2
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$WORK/machine.txt" 2>&1
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
fa_ok() { python3 -c 'import flash_attn, flash_attn_2_cuda' 2>/dev/null; }

for part in $parts; do
  start=$SECONDS
  case "$part" in
    build)
      if fa_ok; then summary "build: flash_attn already importable from $FA_TARGET, skipped"; continue; fi
      OUT="$OUT" timeout 500 bash experiments/kernels/build_flash_attn.sh .fa/flash_attn-2.8.3.tar.gz "$FA_TARGET" \
        2>&1 | tail -15
      fa_ok && summary "build: ok in $((SECONDS - start)) s" || summary "build: FAILED (see flash_attn_build.log)" ;;
    tests)
      timeout 420 python3 -m pytest -q -m gpu -rs tests/test_gpu_flash_attn.py tests/test_attention_self_check.py \
        2>&1 | tee "$WORK/gpu_tests.log" | tail -25
      summary "tests ($((SECONDS - start)) s): $(tail -1 "$WORK/gpu_tests.log")" ;;
    decode)
      for backend in triton flash_attn; do
        timeout 200 python3 experiments/nanovllm_bench/decode_step.py --attention-backend "$backend" \
          --out "$WORK/decode_step_$backend.md" 2>&1 | tee "$WORK/decode_$backend.log" | tail -4
      done
      summary "decode tables ($((SECONDS - start)) s): $(ls "$WORK"/decode_step_*.md 2>/dev/null | xargs -n1 basename | tr '\n' ' ')" ;;
    bench)
      timeout 560 python3 run.py -m experiment=nanovllm_bench engine.attention_backend=triton,flash_attn \
        logger=none hydra.sweep.dir="$WORK/bench" 'hydra.sweep.subdir=${hydra.job.num}' 2>&1 \
        | tee "$WORK/bench.log" | tail -30
      summary "bench ($((SECONDS - start)) s): $(ls "$WORK"/bench/sweep_summary.md 2>/dev/null || echo 'no sweep summary')" ;;
  esac
done
# Few files come back: pack the small text results, leave the build log and the summary beside them.
tar -czf "$OUT/results.tar.gz" -C "$OUT" --exclude='*.pt' --exclude='*.safetensors' \
  --exclude='*.so' --exclude='wandb' work && rm -rf "$WORK"
ls -la "$OUT"
