#!/usr/bin/env bash
# One device call for the fp8-weights study (one H100 or H200, repo root; hydra/wandb importable):
#   bash experiments/fp8/gpu_check.sh
# Writes $OUT/fp8.log (everything) and $OUT/fp8_sweep.tgz (the run.py outputs). Parts, in order, each
# capped by what is left of ~285 s: the fp8 GPU tests; one run.py sweep per table of Qwen3-8B dummy
# weights with model.quantization=none,fp8 (batch-1 TPOT, a 4,096-token prefill step); the kernel
# microbenchmarks against their floors (Qwen3-8B shapes); with time left, nanovllm_bench-style throughput
# with and without an fp8 KV cache. Knobs: BUDGET_S (285), TESTS_S (the GPU tests' cap, 50), SKIP_KERNELS=1.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
LOG="$OUT/fp8.log"; : > "$LOG"
export PYTHONPATH="${PYTHONPATH:-}:$PWD" PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-285} - ($(date +%s) - start) )); }
cap() { local l; l=$(left); [ "$l" -lt 5 ] && l=5; echo $(( l < $1 ? l : $1 )); }  # a part's limit: its cap or what is left
say() { echo "== $* (t=$(( $(date +%s) - start )) s)" | tee -a "$LOG"; }
MODEL=(model=qwen3_8b model.load_format=dummy model.dtype=bfloat16 logger=none metrics.weight_quality.num_requests=0)

say "machine"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.total --format=csv,noheader >> "$LOG" 2>&1
git log --oneline -1 >> "$LOG" 2>&1

say "gpu tests: kernels, the fp8 checkpoint on the GPU path"
timeout $(cap ${TESTS_S:-50}) python3 -m pytest -q -m gpu --durations=5 tests/kernels/test_fp8_kernels.py \
  tests/kernels/test_fp8_fused_inputs.py tests/e2e/test_fp8_gpu.py -k "not no_timed_step_compiles" >> "$LOG" 2>&1
echo "pytest exit $?" >> "$LOG"
say "gpu tests: no timed step compiles (weights none/fp8 x KV auto/fp8)"
timeout $(cap 70) python3 -m pytest -q -m gpu --durations=4 tests/e2e/test_fp8_gpu.py -k no_timed_step_compiles >> "$LOG" 2>&1
echo "pytest exit $?" >> "$LOG"

summary() { python3 - "$1" "$2" <<'PY' >> "$LOG" 2>&1
import csv, glob, json, os, statistics, sys
root, what = sys.argv[1], sys.argv[2]
if os.path.exists(root + "/sweep_summary.md"):
    print("".join(open(root + "/sweep_summary.md").readlines()[:14]))
for d in sorted(glob.glob(root + "/*/")):
    cfg = open(d + ".hydra/overrides.yaml").read().replace("\n", " ") if os.path.exists(d + ".hydra/overrides.yaml") else ""
    res = json.load(open(d + "results.json")) if os.path.exists(d + "results.json") else {}
    summ = res.get("summary", res)
    keys = [k for k in summ if any(s in k for s in ("tpot_ms", "latency_ms", "output_throughput", "compile",
            "quality", "weight", "load_s", "warmup_s", "ttft_ms")) and not k.startswith("p9")]
    print(d, cfg)
    print("  ", {k: summ[k] for k in keys[:40]})
    if what == "steps" and os.path.exists(d + "steps.csv"):
        rows = list(csv.DictReader(open(d + "steps.csv")))
        big = [float(r["step_time_ms"]) for r in rows if int(float(r.get("num_prefill_tokens", 0) or 0)) >= 4096]
        if big:
            print(f"   4096-token prefill steps: median {statistics.median(big):.2f} ms, min {min(big):.2f}, n={len(big)}")
PY
}

say "batch-1 TPOT, Qwen3-8B, quantization none,fp8"
timeout $(cap 70) python3 run.py -m "${MODEL[@]}" model.quantization=none,fp8 \
  workload=latency workload.batch_size=1 workload.input_len=128 workload.output_len=128 scheduler.max_num_seqs=8 \
  workload.num_iters=4 workload.num_iters_warmup=1 hydra.sweep.dir=/tmp/fp8_tpot 'hydra.sweep.subdir=${hydra.job.num}' \
  > /tmp/fp8_tpot.log 2>&1; echo "exit $?" >> "$LOG"; tail -4 /tmp/fp8_tpot.log >> "$LOG"
summary /tmp/fp8_tpot none

say "4,096-token prefill step, Qwen3-8B, quantization none,fp8"
timeout $(cap 45) python3 run.py -m "${MODEL[@]}" model.quantization=none,fp8 \
  workload=latency workload.batch_size=1 workload.input_len=4096 workload.output_len=1 scheduler.max_num_seqs=8 \
  cache.enable_prefix_caching=false \
  workload.num_iters=5 workload.num_iters_warmup=1 hydra.sweep.dir=/tmp/fp8_prefill 'hydra.sweep.subdir=${hydra.job.num}' \
  > /tmp/fp8_prefill.log 2>&1; echo "exit $?" >> "$LOG"; tail -4 /tmp/fp8_prefill.log >> "$LOG"
summary /tmp/fp8_prefill steps

if [ -z "${SKIP_KERNELS:-}" ]; then
  say "kernel microbenchmarks"
  timeout $(cap 90) python3 experiments/fp8/kernel_bench.py >> "$LOG" 2>&1; echo "bench exit $?" >> "$LOG"
fi

if [ "$(left)" -gt 70 ]; then
  say "throughput (nanovllm_bench workload, 128 requests), Qwen3-8B, quantization x kv cache dtype"
  timeout $(( $(left) - 5 )) python3 run.py -m experiment=nanovllm_bench "${MODEL[@]}" model.quantization=none,fp8 \
    cache.kv_cache_dtype=auto,fp8_e4m3 workload.num_requests=128 repeats=2 metrics.kv_quality.num_requests=0 \
    profile=host \
    hydra.sweep.dir=/tmp/fp8_bench 'hydra.sweep.subdir=${hydra.job.num}' > /tmp/fp8_bench.log 2>&1
  echo "exit $?" >> "$LOG"; tail -4 /tmp/fp8_bench.log >> "$LOG"
  summary /tmp/fp8_bench none
else
  say "throughput skipped: $(left) s left"
fi
for f in /tmp/fp8_tpot.log /tmp/fp8_prefill.log /tmp/fp8_bench.log; do
  [ -f "$f" ] && { echo "---- $f (errors)" >> "$LOG"; grep -iE "error|traceback|exception" "$f" | head -20 >> "$LOG"; }
done
tar czf "$OUT/fp8_sweep.tgz" -C /tmp fp8_tpot fp8_prefill $( [ -d /tmp/fp8_bench ] && echo fp8_bench ) 2>/dev/null
say "done"
