#!/usr/bin/env bash
# One GPU call for the MoE study (one H100 or H200, under 5 minutes): the MoE GPU tests, the fused-MoE
# kernel microbenchmark at Qwen3-30B-A3B's shapes against its floors, and Qwen3-30B-A3B (dummy bf16
# weights) latency jobs: batch-1 TPOT and decode steps of 64 and
# 256 sequences (the expert-load count's cost: the routing kernel with and without it, in the
# microbenchmark). Everything goes to the one log $OUT/moe.log.
# Usage (repo root; hydra/wandb installed, PYTHONPATH set to the repo root):
#   OUT=/some/dir bash experiments/moe/gpu_check.sh [parts]
# parts (default: tests kernels b1 bn prefill): tests = the MoE GPU tests and the kernel tests on the device;
# kernels = bench_moe.py; b1 = batch-1 TPOT with the expert-load count on and off; bn = decode steps of 64
# and 256 sequences; prefill = one 4,096-token prefill per iteration; bench = experiment=nanovllm_bench;
# hf = the same bench (32 requests) through our engine and transformers in one sweep; fp8 = batch-1 TPOT
# and the bench with model.quantization=none,fp8; decode = the MoE decode path's GPU tests (kernels at
# Qwen3-30B-A3B shapes, CUDA graphs, EP, fp8), the MoE engine GPU tests (gpu_quick) and the fp8 no-compile
# test, then bench_moe.py at 1, 2, 4, 8, 16 tokens (decode path against grouped, bf16 and fp8: which wins
# per size, what DECODE_MAX_TOKENS and FOLD_ROUTING_MAX_TOKENS should be); decode_b1 = batch-1 TPOT three ways on the
# same tree: as it is, with kernels/triton_moe.FOLD_ROUTING_MAX_TOKENS=0 (the routing kernel first) and with
# DECODE_MAX_TOKENS=0 (grouped at every size, the path before the decode path), each constant patched
# in-process (experiments/tools/with_constant.py); VARIANTS (MODULE:NAME=expression, ';' between them)
# replaces those two, e.g. the decode tiles' candidates: VARIANTS="nanoexp.kernels.triton_moe_decode:
# DECODE_TILES=DecodeTiles(GemvTile(16, 256, 4), GemvTile(4, 128, 4))" (without the line break).
# decode and decode_b1 fit one 10-minute call each.
# Knobs: TESTS (pytest -m expression, default gpu_quick), BENCH_S (candidate-tile budget, default 25),
# TESTS_TIMEOUT (default 150).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
LOG="$OUT/moe.log"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="${PYTHONPATH:-$PWD}"
started=$(date +%s)
section() { echo; echo "=== $1 ($(( $(date +%s) - started )) s in) ==="; }
# decode-step medians per batch size from each job's steps.csv (the timed repeats only: repeat > 0 not
# needed, the latency workload's warm-up iterations are untimed and unlogged)
step_medians() { python3 - "$@" <<'PY'
import csv, glob, statistics, sys
for root in sys.argv[1:]:
    for path in sorted(glob.glob(root + "/**/steps.csv", recursive=True)):
        rows = list(csv.DictReader(open(path)))
        decode = [r for r in rows if int(float(r["num_prefill_tokens"])) == 0]
        by_seqs = {}
        for r in decode:
            by_seqs.setdefault(int(float(r["num_seqs"])), []).append(float(r["step_time_ms"]))
        prefill = {}
        for r in rows:
            if int(float(r["num_decode_tokens"])) == 0:
                prefill.setdefault(int(float(r["num_tokens"])), []).append(float(r["step_time_ms"]))
        load = [float(r["expert_load_max"]) / float(r["expert_load_mean"]) for r in decode
                if r.get("expert_load_max") and float(r.get("expert_load_mean") or 0) > 0]
        print(path)
        for seqs, times in sorted(by_seqs.items()):
            if len(times) >= 3:
                q1, med, q3 = statistics.quantiles(times, n=4)
                print(f"  decode steps of {seqs} seqs: median {med:.3f} ms (quartiles {q1:.3f}, {q3:.3f}; n={len(times)})")
        for tokens, times in sorted(prefill.items()):
            print(f"  prefill-only steps of {tokens} tokens: median {statistics.median(times):.2f} ms (n={len(times)})")
        if load:
            print(f"  decode expert load max/mean (worst layer): median {statistics.median(load):.2f}")
PY
}
echo "git HEAD: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
LAT=(model=qwen3_30b_a3b model.load_format=dummy model.dtype=bfloat16 workload=latency logger=none
     scheduler.max_num_batched_tokens=4096 'hydra.sweep.subdir=${hydra.job.num}')
SHOW="Error|error|Traceback|TPOT|E2E|TTFT|iteration latency|weights|peak|changed from|^nanoexp|graphs"
for part in ${*:-tests kernels b1 bn prefill}; do
  case "$part" in
    tests)
      section "MoE GPU tests (-m ${TESTS:-gpu_quick}) and kernel tests"
      timeout "${TESTS_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -m "${TESTS:-gpu_quick}" --durations=5 \
        tests/models/test_moe_gpu.py 2>&1 | tail -25
      timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_moe.py 2>&1 | tail -8 ;;
    kernels)
      section "fused MoE kernels, Qwen3-30B-A3B shapes"
      timeout 70 python3 experiments/moe/bench_moe.py --budget-s "${BENCH_S:-25}" 2>&1 | tail -150 ;;
    b1)
      section "Qwen3-30B-A3B batch 1 (128 prompt tokens), expert-load count on and off"
      timeout 150 python3 run.py -m "${LAT[@]}" workload.batch_size=1 workload.input_len=128 workload.output_len=128 \
        workload.num_iters=4 workload.num_iters_warmup=2 scheduler.max_num_seqs=8 engine.expert_load_stats=true,false \
        hydra.sweep.dir=/tmp/moe_b1 2>&1 | grep -E "$SHOW" | head -40
      step_medians /tmp/moe_b1 ;;
    bn)
      section "Qwen3-30B-A3B decode steps of 256 and 64 sequences"
      timeout 150 python3 run.py -m "${LAT[@]}" workload.batch_size=256,64 workload.input_len=128 workload.output_len=24 \
        workload.num_iters=2 workload.num_iters_warmup=1 scheduler.max_num_seqs=256 \
        hydra.sweep.dir=/tmp/moe_bn 2>&1 | grep -E "$SHOW" | head -30
      step_medians /tmp/moe_bn ;;
    prefill)
      section "Qwen3-30B-A3B one 4,096-token prefill per iteration (the prefix cache emptied before each)"
      timeout 120 python3 run.py -m "${LAT[@]}" workload.batch_size=1 workload.input_len=4096 workload.output_len=1 \
        workload.num_iters=6 workload.num_iters_warmup=2 scheduler.max_num_seqs=8 scheduler.max_model_len=4608 \
        hydra.sweep.dir=/tmp/moe_prefill 2>&1 | grep -E "$SHOW" | head -20
      step_medians /tmp/moe_prefill ;;
    bench)
      section "experiment=nanovllm_bench model=qwen3_30b_a3b"
      timeout 240 python3 run.py -m experiment=nanovllm_bench model=qwen3_30b_a3b logger=none repeats=2 \
        hydra.sweep.dir=/tmp/moe_bench 'hydra.sweep.subdir=${hydra.job.num}' 2>&1 | grep -E "$SHOW|throughput" | head -30
      step_medians /tmp/moe_bench ;;
    fp8)
      section "Qwen3-30B-A3B, bf16 against fp8 weights (experts included): batch-1 TPOT, then nanovllm_bench"
      timeout 150 python3 run.py -m "${LAT[@]}" workload.batch_size=1 workload.input_len=128 workload.output_len=128 \
        workload.num_iters=4 workload.num_iters_warmup=1 scheduler.max_num_seqs=8 model.quantization=none,fp8 \
        metrics.weight_quality.num_requests=0 \
        hydra.sweep.dir=/tmp/moe_fp8_b1 2>&1 | grep -E "$SHOW" | head -30
      step_medians /tmp/moe_fp8_b1
      timeout 240 python3 run.py -m experiment=nanovllm_bench model=qwen3_30b_a3b logger=none repeats=2 profile=host \
        model.quantization=none,fp8 metrics.kv_quality.num_requests=0 metrics.weight_quality.num_requests=0 \
        hydra.sweep.dir=/tmp/moe_fp8_bench 'hydra.sweep.subdir=${hydra.job.num}' 2>&1 | grep -E "$SHOW|throughput" | head -30
      head -12 /tmp/moe_fp8_bench/sweep_summary.md 2>/dev/null
      step_medians /tmp/moe_fp8_bench ;;
    hf)
      section "experiment=nanovllm_bench model=qwen3_30b_a3b, 32 requests, engine=nanoexp,hf in one sweep"
      timeout "${HF_TIMEOUT:-300}" python3 run.py -m experiment=nanovllm_bench model=qwen3_30b_a3b logger=none repeats=1 \
        workload.num_requests=32 engine=nanoexp,hf metrics.kv_quality.num_requests=0 \
        hydra.sweep.dir=/tmp/moe_hf 'hydra.sweep.subdir=${hydra.job.num}' 2>&1 | grep -E "$SHOW|throughput" | head -40
      head -12 /tmp/moe_hf/sweep_summary.md 2>/dev/null
      step_medians /tmp/moe_hf ;;
    decode)
      section "MoE decode path: GPU tests, then the kernels at decode sizes (bf16 and fp8)"
      timeout "${TESTS_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -m gpu --durations=5 \
        tests/kernels/test_triton_moe_decode.py 2>&1 | tail -15
      timeout 240 python3 -m pytest -q -p no:cacheprovider -m "${TESTS:-gpu_quick}" --durations=5 \
        tests/models/test_moe_gpu.py tests/models/test_moe_fp8_gpu.py 2>&1 | tail -15
      timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -k no_timed_step_compiles \
        tests/models/test_moe_fp8_gpu.py 2>&1 | tail -6
      timeout 150 python3 experiments/moe/bench_moe.py --tokens 1 2 4 8 16 --budget-s "${BENCH_S:-60}" --fp8 \
        2>&1 | tail -150 ;;
    decode_b1)
      section "Qwen3-30B-A3B batch 1 (128 prompt tokens): the MoE decode path as the tree has it, without the folded routing, without the decode path"
      B1=("${LAT[@]}" workload.batch_size=1 workload.input_len=128 workload.output_len=128 workload.num_iters=4
          workload.num_iters_warmup=2 scheduler.max_num_seqs=8)
      IFS=';' read -ra variants <<< "${VARIANTS:-nanoexp.kernels.triton_moe:FOLD_ROUTING_MAX_TOKENS=0;nanoexp.kernels.triton_moe:DECODE_MAX_TOKENS=0}"
      for variant in tree "${variants[@]}"; do
        echo "--- $variant"
        name=${variant##*:}
        dir=/tmp/moe_decode_b1_${name%%=*}
        patch=(); [ "$variant" = tree ] || patch=("$variant")
        # the constant patched in-process before run.py builds the engine (make_triton_moe, TritonMoe.moe and
        # decode_moe read them per engine and per call)
        timeout 150 python3 experiments/tools/with_constant.py "${patch[@]}" -- run.py -m "${B1[@]}" \
          hydra.sweep.dir="$dir" 2>&1 | grep -E "$SHOW" | head -12
        step_medians "$dir"
      done ;;
    *) echo "unknown part $part" ;;
  esac
done
tar czf "$OUT/moe_sweeps.tgz" -C /tmp --exclude=outputs.jsonl $(cd /tmp && ls -d moe_* 2>/dev/null) 2>/dev/null
section "done"
