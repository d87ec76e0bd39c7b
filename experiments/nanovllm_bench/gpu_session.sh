#!/usr/bin/env bash
# One device call: GPU tests, kernel micro-benchmarks, the decode-step table and the nano-vLLM
# benchmark, logs under $OUT. Usage (repo root, on the GPU machine): bash experiments/nanovllm_bench/gpu_session.sh [parts]
# parts: any of tests kernels sampler decode profile prefill bench ab final hf (default: tests kernels decode bench)
# ab: today's knobs as one sweep (gemm backend x KV cache dtype x async scheduling; run 10 swept
# the sampler kernel and fused prefill, both always on since);
# final: the defaults and the transformers baseline (engine=nanoexp,hf) as one sweep.
# Two calls may run side by side on two GPUs (CUDA_VISIBLE_DEVICES, separate OUT): wheels install once.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if [ -d .whl ]; then
  [ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
fi
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
parts="${*:-tests kernels decode bench}"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/machine.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/machine.txt"
for part in $parts; do
  case "$part" in
    tests) timeout 300 python3 -m pytest -q -m gpu tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -25 ;;
    kernels) timeout 200 python3 experiments/kernels/bench_attention.py 2>&1 | tee "$OUT/kernels.log" | tail -30 ;;
    sampler) timeout 120 python3 experiments/kernels/bench_sampler.py 2>&1 | tee "$OUT/sampler.log" | tail -10 ;;
    decode) timeout 200 python3 experiments/nanovllm_bench/decode_step.py --out "$OUT/decode_step.md" 2>&1 | tee "$OUT/decode.log" | tail -30 ;;
    prefill) timeout 200 python3 experiments/nanovllm_bench/prefill_step.py 2>&1 | tee "$OUT/prefill.log" | tail -40 ;;
    profile) timeout 200 python3 experiments/nanovllm_bench/decode_step.py --profile 2>&1 | tee "$OUT/profile.log" | tail -80 ;;
    bench) timeout 300 python3 run.py experiment=nanovllm_bench logger=none hydra.run.dir="$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -30 ;;
    ab) TORCH_LOGS=recompiles timeout 580 python3 run.py -m experiment=nanovllm_bench logger=none \
          engine.gemm_backend=torch,auto cache.kv_cache_dtype=auto,fp8_e4m3 scheduler.async_scheduling=false,true \
          hydra.sweep.dir="$OUT/ab" 'hydra.sweep.subdir=${hydra.job.num}' 2>&1 | tee "$OUT/ab.log" | tail -40 ;;
    final) timeout 560 python3 run.py -m experiment=nanovllm_bench engine=nanoexp,hf logger=none \
          hydra.sweep.dir="$OUT/final" 'hydra.sweep.subdir=${hydra.job.num}' 2>&1 | tee "$OUT/final.log" | tail -30 ;;
    hf) timeout 500 python3 run.py experiment=nanovllm_bench engine=hf logger=none hydra.run.dir="$OUT/hf" 2>&1 | tee "$OUT/hf.log" | tail -30 ;;
  esac
done
