#!/usr/bin/env bash
# One device call for the per-step fixed cost and the fp8 KV cache, logs under $OUT.
# Usage (repo root, on the GPU machine): bash experiments/nanovllm_bench/kv_fp8_session.sh [parts]
# parts: tests fused decode pdl prefetch profile sweep tiny tiles host splits ncu (default: tests fused decode)
#   tests   GPU tests of the fused norm/RoPE/store kernel, the one-pass decode, the fp8 cache and
#           the quality probe; GPU_TESTS adds files, TESTS_TIMEOUT (s, default 300) bounds the run
#   gputests  every GPU test file in a pytest process of its own, each bounded by FILE_TIMEOUT (s,
#           default 150), one summary line per file in $OUT/gpu_tests.md, so a call's limit cuts
#           at most one file; GPU_FILES picks the files (default: all with a gpu mark)
#   fused   experiments/nanovllm_bench/bench_fused.py
#   decode  decode-step table per cache dtype (auto, fp8_e4m3), each against its own floor
#   pdl     decode-step table with programmatic dependent launch off, then on (bf16 cache)
#   prefetch  the same, engine.pdl=on against prefetch (early launch, GEMM weights prefetched), alternated
#   host    the host's decode step with a stub model, this machine's CPU, inputs through pinned
#           copies to the GPU (experiments/nanovllm_bench/host_step.py; TP=2 too with 2 GPUs)
#   profile the kernels of one batch-1 and one batch-128 decode step
#   wide    the Triton GEMM at 64, 128 and 256 rows (row tiles of 64-128, K steps of 64, plain, gated
#           and with the norm in the K loop) against cuBLAS per 0.6B shape, every config in wide_gemm.jsonl
#   widestep  the decode step at 64-256 sequences, engine.gemm_backend=auto (cuBLAS there) and triton
#           (the Triton kernels up to 256 rows), alternated twice
#   lmhead  the LM head (0.6B and 8B shapes, 1-2 rows): cuBLAS against the GEMV and its config sweep
#   gemv    the GEMV at 1-4 rows, rows one by one or together, config sweep, against the tensor-core
#           kernel and cuBLAS per 0.6B shape (decides triton_gemv.AUTO_ROWS and the joint default)
#   trace   the engine's decode steps on the GPU timeline: kernels, gaps, step period
#           (experiments/nanovllm_bench/step_trace.py) at batch 1 and at 256 per cache dtype
#   fusedreduce  split-K decode at 1-64 x 1,024 as the engine's graphs choose it, reduce kernel vs last split
#   tiles   split-K decode per cache dtype and key-tile size (experiments/kernels/bench_decode_tiles.py)
#   splits  the same at 1/2/4/8 splits with the default tile (fp8 at 33-128 sequences is latency-bound?)
#   ncu     Nsight Compute on one bf16 and one fp8 decode call at 256 x 1,024 and 64 x 2,048
#           (experiments/kernels/ncu_decode.py; hardware counters need a Firecracker machine)
#   sweep   python run.py -m experiment=nanovllm_bench cache.kv_cache_dtype=auto,fp8_e4m3 $SWEEP_ARGS (W&B offline)
#   tinyab  the tiny checkpoint's fp8 job without, then with the engine's gc.freeze (decode step times)
#   tinytrace  the tiny checkpoint's fp8 job with each step and each kernel compile on one timeline
#           (experiments/kv_fp8/trace_compiles.py), its slow decode steps
#   tiny    the trained tiny checkpoint (experiments/kv_fp8/README.md: train it first and carry
#           experiments/kv_fp8/checkpoint), both cache dtypes, one sweep
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if [ -d .whl ]; then
  [ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
parts="${*:-tests fused decode}"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/machine.txt"
git log --oneline -1 | tee -a "$OUT/machine.txt"
for part in $parts; do
  case "$part" in
    tests) files=$(ls tests/test_triton_fused.py tests/test_kv_fp8.py tests/test_kv_quality.py 2>/dev/null)
           timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest -q -m gpu $files ${GPU_TESTS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -15 ;;
    gputests) for file in ${GPU_FILES:-$(grep -l "pytest.mark.gpu" tests/test_*.py)}; do
                log="$OUT/gpu_$(basename "$file" .py).log"
                timeout "${FILE_TIMEOUT:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider "$file" > "$log" 2>&1
                echo "| $file | exit $? | $(tail -1 "$log") |" | tee -a "$OUT/gpu_tests.md"
              done
              (cd "$OUT" && tar czf gpu_test_logs.tgz gpu_test_*.log && rm gpu_test_*.log) ;;
    fused) timeout 120 python3 experiments/nanovllm_bench/bench_fused.py --out "$OUT/fused.md" 2>&1 | tail -25 ;;
    decode) for dtype in auto fp8_e4m3; do
              timeout 150 python3 experiments/nanovllm_bench/decode_step.py --kv-cache-dtype $dtype \
                --batches 1,16,64,128,256 --contexts 1024 --out "$OUT/decode_$dtype.md" 2>&1 | tail -7
            done ;;
    pdl) for choice in off on; do
           timeout 150 python3 experiments/nanovllm_bench/decode_step.py --pdl $choice \
             --batches 1,16,64,256 --contexts 1024 --out "$OUT/decode_pdl_$choice.md" 2>&1 | tail -5
         done ;;
    prefetch) for choice in on prefetch on prefetch; do  # alternated: each twice
           timeout 120 python3 experiments/nanovllm_bench/decode_step.py --pdl $choice \
             --batches 1,16,64 --contexts 1024 --out "$OUT/decode_pdl_$choice.md" 2>&1 | tail -4
         done ;;
    host) timeout 200 python3 experiments/nanovllm_bench/host_step.py --device cuda 2>&1 | grep "^|" | tee "$OUT/host_step.md"
          if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
            timeout 200 python3 experiments/nanovllm_bench/host_step.py --device cuda --tp 2 2>&1 | grep "^|" | tee "$OUT/host_step_tp2.md"
          fi ;;
    splits) (cd experiments/kernels && timeout 200 python3 bench_decode_tiles.py --splits 1 2 4 8 \
             --out "$OUT/splits.md") 2>&1 | tail -10 ;;
    ncu) for shape in "256 1024" "64 2048"; do
           set -- $shape
           timeout 150 ncu --clock-control none --set full -k regex:_decode_split_kernel -s 1 -c 3 \
             python3 experiments/kernels/ncu_decode.py --batch $1 --context $2 > "$OUT/ncu_$1x$2.txt" 2>&1
           grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Stall" "$OUT/ncu_$1x$2.txt" | head -40
         done ;;
    fusedreduce) (cd experiments/kernels && timeout 200 python3 bench_decode_tiles.py --fused-reduce --max-len 4096 \
                   --shapes 1x1024 2x1024 4x1024 8x1024 16x1024 32x1024 64x1024 --out "$OUT/fused_reduce.md") 2>&1 | \
                   grep -E "^\||Error" | tail -16 ;;
    tiles) (cd experiments/kernels && timeout 200 python3 bench_decode_tiles.py --out "$OUT/tiles.md") 2>&1 | tail -10 ;;
    wide) (cd experiments/kernels && timeout "${WIDE_TIMEOUT:-400}" python3 bench_skinny_gemm.py --rows 64,128,256 \
            --sweep --only "0.6B qkv,0.6B gate_up+silu,0.6B o,0.6B down,0.6B norm+qkv,0.6B norm+gate_up+silu" \
            --out "$OUT/wide_gemm.md" --all-out "$OUT/wide_gemm.jsonl") 2>&1 | grep "^|" | tail -30 ;;
    widestep) for run in 1_auto 1_triton 2_auto 2_triton; do
            timeout 120 python3 experiments/nanovllm_bench/decode_step.py --gemm-backend "${run#*_}" \
              --batches 64,128,256 --contexts 1024 --out "$OUT/decode_gemm_$run.md" 2>&1 | grep "^|" | tail -3
          done ;;
    lmhead) (cd experiments/kernels && timeout 200 python3 bench_skinny_gemm.py --rows 1,2 --sweep gemv --only lm_head \
              --out "$OUT/lm_head.md" --all-out "$OUT/lm_head.jsonl") 2>&1 | grep -E "^\||Error" | tail -6 ;;
    gemv) (cd experiments/kernels && timeout 300 python3 bench_skinny_gemm.py --rows 1,2,3,4 --sweep gemv \
            --only "0.6B norm+qkv,0.6B o,0.6B norm+gate_up+silu,0.6B down" --out "$OUT/gemv.md") 2>&1 | tail -16 ;;
    trace) timeout 120 python3 experiments/nanovllm_bench/step_trace.py --batch 1 --out "$OUT/trace_b1.md" 2>&1 | head -40
           for dtype in auto fp8_e4m3; do
             timeout 150 python3 experiments/nanovllm_bench/step_trace.py --batch 256 --input-len 512 \
               --output-len 24 --kv-cache-dtype $dtype --out "$OUT/trace_b256_$dtype.md" 2>&1 | head -30
           done ;;
    profile) timeout 120 python3 experiments/nanovllm_bench/decode_step.py --profile > "$OUT/profile.log" 2>&1
             grep -A24 "batch 1 " "$OUT/profile.log" | cut -c1-60,100-150 ;;
    sweep) timeout "${SWEEP_TIMEOUT:-560}" python3 run.py -m experiment=nanovllm_bench cache.kv_cache_dtype=auto,fp8_e4m3 ${SWEEP_ARGS:-} \
             hydra.sweep.dir="$OUT/sweep" 'hydra.sweep.subdir=${hydra.job.num}' 2>&1 | tee "$OUT/sweep.log" | tail -30
           (cd "$OUT" && tar czf sweep.tgz --exclude=wandb sweep && rm -rf sweep) ;;
    tinyab) for variant in --no-freeze --freeze; do
              timeout 150 python3 experiments/kv_fp8/trace_compiles.py ${variant/--freeze/} model=qwen3_tiny_trained \
                workload=prompts_file workload.path=experiments/kv_fp8/checkpoint/prompts.jsonl workload.output_len=64 \
                sampler=greedy metrics.kv_quality.num_requests=0 cache.kv_cache_dtype=fp8_e4m3 logger=none \
                hydra.run.dir="$OUT/tinyab" > "$OUT/tinyab$variant.log" 2>&1
              rm -rf "$OUT/tinyab"
              grep "decode seqs 32" "$OUT/tinyab$variant.log" | awk '{print $(NF-1)}' | sort -n | \
                awk -v v="$variant" '{a[NR]=$1} END {print v, NR, "decode steps: min", a[1], "median", a[int((NR+1)/2)], "max", a[NR]}'
              grep -E "garbage|TPOT" "$OUT/tinyab$variant.log" | tail -4
            done ;;
    tinytrace) timeout 150 python3 experiments/kv_fp8/trace_compiles.py model=qwen3_tiny_trained \
                 workload=prompts_file workload.path=experiments/kv_fp8/checkpoint/prompts.jsonl \
                 workload.output_len=64 sampler=greedy metrics.kv_quality.num_requests=32 \
                 cache.kv_cache_dtype=fp8_e4m3 logger=none hydra.run.dir="$OUT/tinytrace" > "$OUT/tiny_trace.log" 2>&1
               rm -rf "$OUT/tinytrace"
               grep -E "compile|Recompil|garbage" "$OUT/tiny_trace.log" | cut -c1-200 | tail -15
               awk '/ decode /{ if ($(NF-1) + 0 > 5) print }' "$OUT/tiny_trace.log" | tail -10 ;;
    tiny) timeout 200 python3 run.py -m model=qwen3_tiny_trained workload=prompts_file \
             workload.path=experiments/kv_fp8/checkpoint/prompts.jsonl workload.output_len=64 sampler=greedy \
             metrics.kv_quality.num_requests=32 cache.kv_cache_dtype=auto,fp8_e4m3 logger=none \
             hydra.sweep.dir="$OUT/tiny" 'hydra.sweep.subdir=${hydra.job.num}' 2>&1 | tee "$OUT/tiny.log" | tail -20
          (cd "$OUT" && tar czf tiny.tgz tiny && rm -rf tiny) ;;
  esac
done
