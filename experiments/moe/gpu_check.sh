#!/usr/bin/env bash
# One GPU call for the MoE study (one H100 or H200, under 5 minutes): the MoE GPU tests, the fused-MoE
# kernel microbenchmark at Qwen3-30B-A3B's shapes against its floors, and Qwen3-30B-A3B (dummy bf16
# weights) latency jobs: batch-1 TPOT and decode steps of 64 and
# 256 sequences (the expert-load count's cost: the routing kernel with and without it, in the
# microbenchmark). Everything goes to the one log $OUT/moe.log.
# Usage (repo root; hydra/wandb installed, PYTHONPATH set to the repo root):
#   OUT=/some/dir bash experiments/moe/gpu_check.sh
# Knobs: TESTS (pytest -m expression, default gpu_quick), BENCH_S (candidate-tile budget, default 25), TESTS_TIMEOUT (default 120).
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
        load = [float(r["expert_load_max"]) / float(r["expert_load_mean"]) for r in decode if r.get("expert_load_max")]
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
echo "GPU_READY: $(cat GPU_READY 2>/dev/null || echo none); git HEAD: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader

section "MoE GPU tests (-m ${TESTS:-gpu_quick})"
timeout "${TESTS_TIMEOUT:-120}" python3 -m pytest -q -p no:cacheprovider -m "${TESTS:-gpu_quick}" --durations=5 \
  tests/kernels/test_triton_moe.py tests/models/test_moe_gpu.py 2>&1 | tail -25

section "fused MoE kernels, Qwen3-30B-A3B shapes"
timeout 70 python3 experiments/moe/bench_moe.py --budget-s "${BENCH_S:-25}" 2>&1 | tail -150

LAT=(model=qwen3_30b_a3b model.load_format=dummy model.dtype=bfloat16 workload=latency logger=none
     workload.input_len=128 scheduler.max_num_batched_tokens=2048)
section "Qwen3-30B-A3B latency: batch 1, then batch 256 and 64"
timeout 80 python3 run.py -m "${LAT[@]}" workload.batch_size=1 workload.output_len=128 workload.num_iters=4 \
  workload.num_iters_warmup=2 scheduler.max_num_seqs=8 \
  hydra.sweep.dir=/tmp/moe_b1 'hydra.sweep.subdir=${hydra.job.num}' 2>&1 \
  | grep -E "Error|Traceback|TPOT|E2E|iteration latency|weights|peak|changed from|^nanoexp|graph|warm" | head -40
step_medians /tmp/moe_b1
remaining=$(( 285 - ($(date +%s) - started) ))
if [ "$remaining" -gt 40 ]; then
  timeout "$remaining" python3 run.py -m "${LAT[@]}" workload.batch_size=256,64 workload.output_len=24 \
    workload.num_iters=2 workload.num_iters_warmup=1 scheduler.max_num_seqs=256 scheduler.max_num_batched_tokens=4096 \
    hydra.sweep.dir=/tmp/moe_bn 'hydra.sweep.subdir=${hydra.job.num}' 2>&1 \
    | grep -E "Error|Traceback|TPOT|E2E|iteration latency|weights|peak|changed from|^nanoexp" | head -30
  step_medians /tmp/moe_bn
else
  echo "skipped batch 64/256: ${remaining} s left"
fi
section "done"
