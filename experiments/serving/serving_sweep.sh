#!/usr/bin/env bash
# One device call for the serving study: GPU tests of the mixed-step paths, the prefill-step
# profile, and the rate sweep under both batching policies; everything under $OUT.
# Usage (repo root on the GPU machine, wheels from ../shared/tools/device-wheels.sh in .whl):
#   bash experiments/serving/serving_sweep.sh [parts]   parts: tests profile sweep base bench latency trace lone online
#   (default: tests profile sweep)
# tests runs TESTS (a pytest -m expression, default gpu_quick; TESTS_TIMEOUT seconds, default 240); bench starts each checkout with cold caches;
# latency is batch-1 TPOT of BASE and this checkout; trace is a profiled sweep (profile=all) whose Chrome
# traces are checked for a decode-graph replay and a prefill step's kernels; lone is an online job of lone
# 16- and 512-token prompts at 8 req/s from BASE and this checkout (LONE_TREES), its step_medians; online
# is two loaded jobs (ONLINE_TREES): 16-token prompts at 400 req/s, 512-token prompts all at t0 in steps
# of at most 4,096 tokens, both `prefill_first`, with the SM clock sampled every 100 ms (the card clocks
# down under a long burst).
# `base DIR`-style parts run the same sweep from another checkout: BASE=dir.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
here="$PWD"
if [ -d "${WHEELS:-.whl}" ]; then
  [ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:-.whl}"/*.whl
fi
export PYTHONPATH="/tmp/site:$here" PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SWEEP=(workload=random workload.num_requests=256 workload.input_len=512 workload.output_len=128
       workload.request_rate=${RATES:-32,128,inf} model.load_format=dummy model.dtype=bfloat16 logger=none)
parts="${*:-tests profile sweep}"
# A job's printed summary (from its header line to the end), or its last lines when it printed none
summary_or_tail() { awk '/^nanoexp \|/ { on = 1 } on { print } { last[NR % 12] = $0 }
  END { if (!on) for (i = NR - 11; i <= NR; i++) if (i > 0) print last[i % 12] }'; }
# Each job's step times from its steps.csv: medians and quartiles by step kind (prefill-only, mixed,
# decode), and of prefill-only steps by their most common prefill token counts
step_medians() { python3 - "$1" <<'PY'
import collections, csv, glob, statistics, sys
def show(label, times):
    if len(times) > 1:
        q1, med, q3 = statistics.quantiles(times, n=4)
        print(f"  {label}: median {med:.2f} ms (quartiles {q1:.2f}, {q3:.2f}; n={len(times)})")
for path in sorted(glob.glob(sys.argv[1] + "/*/steps.csv")):
    rows = list(csv.DictReader(open(path)))
    prefill, decode = (lambda r: int(float(r["num_prefill_tokens"]))), (lambda r: int(float(r["num_decode_tokens"])))
    kind = lambda r: "prefill-only" if decode(r) == 0 else "decode" if prefill(r) == 0 else "mixed"
    print(path)
    for name in ("prefill-only", "mixed", "decode"):
        show(f"{name} steps", [float(r["step_time_ms"]) for r in rows if kind(r) == name])
    counts = collections.Counter(prefill(r) for r in rows if kind(r) == "prefill-only")
    for tokens, _ in counts.most_common(3):
        show(f"prefill-only steps of {tokens} tokens",
             [float(r["step_time_ms"]) for r in rows if kind(r) == "prefill-only" and prefill(r) == tokens])
PY
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/machine.txt"
for part in $parts; do
  case "$part" in
    tests) timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -m "${TESTS:-gpu_quick}" tests/ > "$OUT/gpu_tests.log" 2>&1
           tail -15 "$OUT/gpu_tests.log" ;;
    profile) TORCH_LOGS=recompiles timeout 240 python3 experiments/serving/prefill_profile.py --out /tmp/prof ${PROFILE_ARGS:-} 2>&1 | grep -v "^-" | head -400 > "$OUT/profile.log"; head -12 "$OUT/profile.log" ;;
    sweep) timeout 420 python3 run.py -m "${SWEEP[@]}" scheduler.batching=${BATCHING:-prefill_first,mixed} \
             hydra.sweep.dir=/tmp/sweep 'hydra.sweep.subdir=${hydra.job.num}' > "$OUT/sweep.log" 2>&1
           tail -5 "$OUT/sweep.log"; cat /tmp/sweep/sweep_summary.md 2>/dev/null | head -30
           step_medians /tmp/sweep | tee "$OUT/sweep_steps.log"
           tar czf "$OUT/sweep.tgz" -C /tmp sweep ;;
    base) (cd "$BASE" && PYTHONPATH="/tmp/site:$BASE" timeout 300 python3 run.py -m "${SWEEP[@]}" \
             hydra.sweep.dir=/tmp/base 'hydra.sweep.subdir=${hydra.job.num}' > "$OUT/base.log" 2>&1)
           tail -3 "$OUT/base.log"; tar czf "$OUT/base.tgz" -C /tmp base ;;
    bench) for tree in "$BASE" "$here"; do  # each with empty Triton and inductor caches: a cold start-up
             cold="/tmp/cold_$(basename "$tree")"; start=$(date +%s)
             (cd "$tree" && TRITON_CACHE_DIR="$cold/triton" TORCHINDUCTOR_CACHE_DIR="$cold/inductor" \
               PYTHONPATH="/tmp/site:$tree" timeout 240 python3 run.py experiment=nanovllm_bench logger=none \
               hydra.run.dir=/tmp/bench_$(basename "$tree") 2>&1 | summary_or_tail)
             echo "$(basename "$tree"): job wall $(( $(date +%s) - start )) s"
           done | tee "$OUT/bench.log" ;;
    latency) for tree in "$BASE" "$here"; do
               (cd "$tree" && PYTHONPATH="/tmp/site:$tree" timeout 150 python3 run.py workload=latency \
                 workload.batch_size=1 workload.input_len=1024 model.load_format=dummy model.dtype=bfloat16 \
                 logger=none hydra.run.dir=/tmp/latency_$(basename "$tree") 2>&1 | grep -iE "tpot|latency|duration" | head -6)
               echo "^ $(basename "$tree")"
             done | tee "$OUT/latency.log" ;;
    lone) for tree in ${LONE_TREES:-"$BASE" "$here"}; do
            (cd "$tree" && PYTHONPATH="/tmp/site:$tree" timeout 200 python3 run.py -m "${SWEEP[@]}" \
              workload.num_requests=48 workload.input_len=16,512 workload.output_len=4 workload.request_rate=8 \
              hydra.sweep.dir=/tmp/lone_$(basename "$tree") 'hydra.sweep.subdir=${hydra.job.num}' > /dev/null 2>&1)
            step_medians "/tmp/lone_$(basename "$tree")"
            echo "^ $(basename "$tree")"
          done | tee "$OUT/lone.log" ;;
    online) for tree in ${ONLINE_TREES:-"$here"}; do  # the step sizes of the targets, in loaded online jobs
              name=$(basename "$tree")
              nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader,nounits -lms 100 \
                > "$OUT/clocks_$name.csv" 2>/dev/null & clocks=$!
              (cd "$tree" && export PYTHONPATH="/tmp/site:$tree" &&
               timeout 150 python3 run.py -m "${SWEEP[@]}" workload.num_requests=512 workload.input_len=16 \
                 workload.output_len=16 workload.request_rate=400 scheduler.batching=prefill_first \
                 hydra.sweep.dir=/tmp/online_$name hydra.sweep.subdir=short > /dev/null 2>&1
               timeout 150 python3 run.py -m "${SWEEP[@]}" workload.output_len=16 workload.request_rate=inf \
                 scheduler.batching=prefill_first scheduler.max_num_batched_tokens=4096 scheduler.max_model_len=4096 \
                 hydra.sweep.dir=/tmp/online_$name append_to_sweep=true hydra.sweep.subdir=long > /dev/null 2>&1)
              kill $clocks
              step_medians "/tmp/online_$name"
              awk -F', ' '$1 > 1000 && (!m || $1 < m) { m = $1 } $2 > t { t = $2 }  # idle is 345 MHz
                END { if (m) print "  SM clock: lowest above idle " m " MHz, highest temperature " t " C" }' \
                "$OUT/clocks_$name.csv"
              echo "^ $name"
            done | tee "$OUT/online.log" ;;
    trace) timeout 240 python3 run.py -m "${SWEEP[@]}" workload.num_requests=64 workload.request_rate=32,inf \
             profile=all hydra.sweep.dir=/tmp/trace 'hydra.sweep.subdir=${hydra.job.num}' > "$OUT/trace.log" 2>&1
           tail -3 "$OUT/trace.log"
           python3 - <<'PY' | tee "$OUT/trace_check.log"
import glob, json
for path in sorted(glob.glob("/tmp/trace/*/profile/trace_repeat0.json")):
    names = [e.get("name", "") for e in json.load(open(path)).get("traceEvents", [])]
    count = lambda key: sum(key in n for n in names)
    print(path, "graph launches", count("cudaGraphLaunch"), "prefill kernels", count("_prefill_kernel"),
          "decode kernels", count("_decode_split_kernel"), "GEMMs", count("nvjet") + count("_skinny_gemm"))
PY
           tar czf "$OUT/trace.tgz" -C /tmp --exclude='*.json' trace ;;
  esac
done
