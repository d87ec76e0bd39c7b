#!/usr/bin/env bash
# One device call: skinny-GEMM GPU tests, the per-shape GEMM table, and the decode step of
# Qwen3-0.6B with engine.gemm_backend=torch and =triton, logs under $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/machine.txt"
timeout 120 python3 -m pytest -q -m gpu tests/test_skinny_gemm.py 2>&1 | tail -5 | tee "$OUT/tests.log"
timeout 100 python3 experiments/kernels/bench_decode_splits.py 2>&1 | tee "$OUT/decode_splits.md" | tail -8
timeout 330 python3 experiments/kernels/bench_skinny_gemm.py --sweep --out "$OUT/skinny_gemm.md" 2>&1 | tail -80
for gemm in torch triton auto; do
  timeout 150 python3 experiments/nanovllm_bench/decode_step.py --gemm-backend $gemm --batches 1,4,16,64,128,256 \
    --contexts 1024 --out "$OUT/decode_$gemm.md" 2>&1 | tail -8
done
timeout 120 python3 experiments/nanovllm_bench/decode_step.py --profile --gemm-backend triton > "$OUT/profile.log" 2>&1
grep -A30 "batch 1 " "$OUT/profile.log" | cut -c1-60,100-140 | head -34
