#!/usr/bin/env bash
# The workloads study in one device call, Qwen3-0.6B (dummy weights, bf16). Run from the repo root (with the
# wheels in .whl, carried, where hydra is missing). Writes 3 files under $OUT: workloads.log (progress with
# elapsed seconds, every table), aa.md (fresh vs reused engines) and workloads.tgz (the sweep dirs and
# each run.py log, outputs.jsonl left out).
#   bash experiments/serving/gpu_workloads.sh                       # all parts: about 6-7 min on an H100
#   PARTS="reuse aa" bash experiments/serving/gpu_workloads.sh      # ~4 min
#   PARTS="trace capacity" bash experiments/serving/gpu_workloads.sh
#   SMOKE=1 OUT=/tmp/x PYTHON=.venv/bin/python bash experiments/serving/gpu_workloads.sh   # CPU, qwen3_tiny,
#                                                     # tiny request counts: checks the script end to end
# Parts:
#   reuse     the serving preset's workload (256 requests, 512 prompt and 128 output tokens, greedy, SLOs
#             TTFT 200 ms and TPOT 20 ms, one repeat) swept over 6 rates, once with a fresh engine per job
#             (engine.reuse=false) and once reusing one: the wall time of each sweep, each job's build_s,
#             whether the greedy tokens agree job by job; the grid's max rate meeting the SLOs
#   aa        fresh against reused engines with intervals: 3 jobs a side at 128 req/s (workload.seed=0,1,2,
#             1 repeat each), engine.reuse=false (an engine per job) against true (one engine for the 3);
#             each metric's mean and 95% CI over the 3 jobs a side and Welch's 95% CI of the difference
#             (written to $OUT/aa.md): within noise is the expected verdict. (`trial=` cannot serve here:
#             a new trial always builds its own engine, DESIGN's unit of replication.)
#   trace     a synthetic Mooncake-format trace (make_mooncake_trace.py: 8 s, ~6 req/s, ~5.6k-token
#             prompts sharing ~half their blocks) replayed with scheduler.batching=prefill_first,mixed
#             and prefix caching on and off
#   tokens    the serving workload with every arrival at t0 (seeds 0-2), fresh against reused engines:
#             whether their greedy tokens agree job by job when batching does not follow the clock
#   trace_moe the same trace and sweep on Qwen3-30B-A3B (dummy bf16 weights; not in the default parts)
#   capacity  experiment=capacity on the same serving workload: the highest rate meeting the SLOs by
#             search, to set against the grid's answer
# BUDGET (s, default 540) caps the whole call: each step's timeout is cut to what is left and a step with
# under 20 s left is skipped, so the call ends (and its files are written) inside the device's 10 minutes.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
WORK="${WORK:-/tmp/wl}"; rm -rf "$WORK"; mkdir -p "$WORK"
LOG="$OUT/workloads.log"; : > "$LOG"
PY="${PYTHON:-python3}"
if ! "$PY" -c "import hydra" 2>/dev/null; then  # the GPU image lacks hydra & co.: the wheels in .whl
  if [ ! -d /tmp/site/hydra ] && [ -d "${WHEELS:-.whl}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "${WHEELS:-.whl}"/*.whl || { echo "wheel install failed" | tee -a "$LOG"; exit 1; }
  fi
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BUDGET="${BUDGET:-540}"; T0=$(date +%s)
if [ "${SMOKE:-0}" = 1 ]; then  # CPU: the tiny model, a handful of requests, every override the GPU run uses
  MODEL=(model=qwen3_tiny cache.cpu_kv_cache_gib=0.05 logger=none engine.use_tqdm=false)
  MOE_MODEL=(model=qwen3_moe_tiny cache.cpu_kv_cache_gib=0.05 logger=none engine.use_tqdm=false)
  SIZE=(workload.num_requests=4 workload.input_len=32 workload.output_len=4)
  RATES="${RATES:-8,16,32,64,128,inf}"; AA_RATE=32
  TRACE_GEN=(--seconds 2 --rate 3 --block-size 16 --max-output 8)
  TRACE_RUN=(workload.trace_block_size=16 cache.block_size=16)  # KV blocks no larger than the trace's
  CAPACITY=(capacity.start_rate=16 capacity.precision=0.5 capacity.max_probes=6 metrics.slo.ttft_ms=1000)
else
  MODEL=(model=qwen3_0_6b model.load_format=dummy model.dtype=bfloat16 logger=none engine.use_tqdm=false)
  MOE_MODEL=(model=qwen3_30b_a3b model.load_format=dummy model.dtype=bfloat16 logger=none engine.use_tqdm=false)
  SIZE=()
  RATES="${RATES:-64,128,192,256,384,inf}"; AA_RATE=128
  TRACE_GEN=(--seconds 8 --rate 6); TRACE_RUN=()
  CAPACITY=(capacity.start_rate=128 capacity.precision=0.15)
fi
SERVING=(experiment=serving sampler=greedy save_outputs=true "${SIZE[@]}")
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "[+$(elapsed)s] $*" | tee -a "$LOG"; }
# a step's timeout: its own cap, cut to what is left of BUDGET; a step with under 20 s left is skipped
cap() { local left=$(( BUDGET - $(elapsed) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
budget_ok() { [ $(( BUDGET - $(elapsed) )) -ge 20 ] || { say "skipped $1: the budget of ${BUDGET}s is spent"; return 1; }; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# Each job's build time, whether it reused an engine, and its mean TTFT/TPOT, from its results.json
jobs_table() { "$PY" - "$@" <<'PY'
import json, pathlib, sys
for sweep in sys.argv[1:]:
    paths = pathlib.Path(sweep).glob("*/results.json")
    for path in sorted(paths, key=lambda p: int(p.parent.name.split("_")[0])):
        s = json.loads(path.read_text()).get("summary", {})
        print(f"{pathlib.Path(sweep).name} job {path.parent.name}: rate {s.get('offered_request_rate')} "
              f"build_s {s.get('build_s', 0):.2f} reused {s.get('engine_reused')} engine {s.get('engine_id')} "
              f"mean TTFT {s.get('mean_ttft_ms', 0):.1f} ms mean TPOT {s.get('mean_tpot_ms', 0):.2f} ms "
              f"attainment {s.get('slo_attainment')}")
PY
}
same_tokens() { "$PY" - "$1" "$2" <<'PY'
import json, pathlib, sys
def tokens(sweep):
    out = {}
    for path in pathlib.Path(sweep).glob("*/outputs.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        out[int(path.parent.name.split("_")[0])] = [(r["repeat"], r["request_id"], r["output_token_ids"]) for r in rows]
    return out
a, b = tokens(sys.argv[1]), tokens(sys.argv[2])
equal = sorted(job for job in a if a[job] == b.get(job))
print(f"greedy tokens equal, fresh vs reused engine: {len(equal)} of {len(a)} jobs {equal} (reused sweep: {len(b)} jobs)")
PY
}
# Fresh (A) against reused (B) engines: each metric's mean and 95% CI over a side's jobs, Welch's 95% CI of
# the difference B - A, and whether it excludes 0
fresh_vs_reused() { "$PY" - "$1" "$2" <<'PY'
import json, math, pathlib, sys
from scipy import stats
def jobs(sweep):
    paths = pathlib.Path(sweep).glob("*/results.json")
    return [json.loads(p.read_text())["summary"] for p in paths if json.loads(p.read_text())["status"] == "ok"]
a, b = jobs(sys.argv[1]), jobs(sys.argv[2])
print(f"# Fresh (A: {sys.argv[1]}, {len(a)} jobs) against reused (B: {sys.argv[2]}, {len(b)} jobs) engines\n")
print("| metric | A mean [95% CI] | B mean [95% CI] | B/A | B - A, Welch 95% CI | verdict |")
print("|---|---|---|---|---|---|")
def ci(v):
    m = sum(v) / len(v)
    if len(v) < 2:
        return m, math.nan, math.nan
    sd = stats.tstd(v)
    h = stats.t.ppf(0.975, len(v) - 1) * sd / math.sqrt(len(v))
    return m, max(m - h, 0.0), m + h  # every metric here is >= 0
for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms", "output_throughput"):
    va, vb = [s[key] for s in a if key in s], [s[key] for s in b if key in s]
    if len(va) < 2 or len(vb) < 2:
        print(f"| {key} | {va} | {vb} | | | not enough jobs |")
        continue
    (ma, la, ha), (mb, lb, hb) = ci(va), ci(vb)
    sa, sb = stats.tvar(va) / len(va), stats.tvar(vb) / len(vb)
    df = (sa + sb) ** 2 / ((sa**2 / (len(va) - 1)) + (sb**2 / (len(vb) - 1))) if sa + sb > 0 else 1
    h = stats.t.ppf(0.975, df) * math.sqrt(sa + sb)
    lo, hi = mb - ma - h, mb - ma + h
    verdict = "within noise" if lo <= 0 <= hi else "**differs**"  # 5 metrics at 95%: 1 in 4 runs flags one
    print(f"| {key} | {ma:.4g} [{la:.4g}, {ha:.4g}] | {mb:.4g} [{lb:.4g}, {hb:.4g}] | {mb / ma:.3f} | "
          f"[{lo:.4g}, {hi:.4g}] | {verdict} |")
PY
}
# The Mooncake-format trace (made once per call) over batching x prefix caching: replay_trace NAME CAP LABEL MODEL...
replay_trace() {
  local name=$1 limit=$2 label=$3; shift 3
  [ -f "$WORK/mooncake.jsonl" ] || "$PY" experiments/serving/make_mooncake_trace.py --out "$WORK/mooncake.jsonl" \
    "${TRACE_GEN[@]}" 2>&1 | tee -a "$LOG"
  local start; start=$(date +%s%N); say "start: Mooncake-format trace$label, batching x prefix caching (4 jobs)"
  timeout -k 15 "$(cap "$limit")" "$PY" run.py -m "$@" workload=trace "workload.path=$WORK/mooncake.jsonl" \
    "${TRACE_RUN[@]}" scheduler.batching=prefill_first,mixed cache.enable_prefix_caching=true,false \
    metrics.slo.ttft_ms=1000 metrics.slo.tpot_ms=50 metrics.kv_quality.num_requests=0 \
    "hydra.sweep.dir=$WORK/$name" 'hydra.sweep.subdir=${hydra.job.num}' > "$WORK/$name.log" 2>&1
  say "Mooncake-format trace$label, batching x prefix caching: rc $? wall $(ms_since "$start") ms"
  grep -E "nanoexp: error" "$WORK/$name.log" | head -5 | tee -a "$LOG"
  cat "$WORK/$name/sweep_summary.md" 2>/dev/null | tee -a "$LOG"
}
say "workloads study $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') SMOKE=${SMOKE:-0} budget ${BUDGET}s"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader 2>&1 | tee -a "$LOG"
fi
for part in ${PARTS:-reuse aa trace capacity}; do
  budget_ok "$part" || continue
  case "$part" in
    reuse)
      for mode in fresh reused; do
        budget_ok "$mode" || continue
        reuse=$([ "$mode" = reused ] && echo true || echo false); start=$(date +%s%N)
        say "start: 6-point rate sweep ($RATES), engine.reuse=$reuse"
        timeout -k 15 "$(cap 240)" "$PY" run.py -m "${MODEL[@]}" "${SERVING[@]}" repeats=1 "workload.request_rate=$RATES" \
          engine.reuse=$reuse "hydra.sweep.dir=$WORK/$mode" 'hydra.sweep.subdir=${hydra.job.num}' \
          > "$WORK/$mode.log" 2>&1
        say "6-point rate sweep, engine.reuse=$reuse: rc $? wall $(ms_since "$start") ms"
        grep -hE "max rate|nanoexp: error" "$WORK/$mode/sweep_summary.md" "$WORK/$mode.log" 2>/dev/null | head -5 | tee -a "$LOG"
      done
      jobs_table "$WORK/fresh" "$WORK/reused" 2>&1 | tee -a "$LOG"
      same_tokens "$WORK/fresh" "$WORK/reused" 2>&1 | tee -a "$LOG" ;;
    aa)
      for mode in aa_fresh aa_reused; do
        budget_ok "$mode" || continue
        reuse=$([ "$mode" = aa_reused ] && echo true || echo false); start=$(date +%s%N)
        say "start: 3 jobs (workload.seed=0,1,2) at ${AA_RATE} req/s, engine.reuse=$reuse"
        timeout -k 15 "$(cap 150)" "$PY" run.py -m "${MODEL[@]}" "${SERVING[@]}" repeats=1 workload.seed=0,1,2 \
          "workload.request_rate=$AA_RATE" engine.reuse=$reuse "hydra.sweep.dir=$WORK/$mode" \
          'hydra.sweep.subdir=${hydra.job.num}' > "$WORK/$mode.log" 2>&1
        say "3 jobs, engine.reuse=$reuse: rc $? wall $(ms_since "$start") ms"
        grep -hE "nanoexp: error" "$WORK/$mode.log" 2>/dev/null | head -5 | tee -a "$LOG"
      done
      jobs_table "$WORK/aa_fresh" "$WORK/aa_reused" 2>&1 | tee -a "$LOG"
      same_tokens "$WORK/aa_fresh" "$WORK/aa_reused" 2>&1 | tee -a "$LOG"
      fresh_vs_reused "$WORK/aa_fresh" "$WORK/aa_reused" > "$OUT/aa.md" 2>&1; tee -a "$LOG" < "$OUT/aa.md" ;;
    tokens)  # all arrivals at t0: the batches do not follow the clock, so fresh and reused engines must agree
      for mode in tokens_fresh tokens_reused; do
        budget_ok "$mode" || continue
        reuse=$([ "$mode" = tokens_reused ] && echo true || echo false)
        timeout -k 15 "$(cap 150)" "$PY" run.py -m "${MODEL[@]}" "${SERVING[@]}" repeats=1 workload.seed=0,1,2 \
          workload.request_rate=inf engine.reuse=$reuse "hydra.sweep.dir=$WORK/$mode" \
          'hydra.sweep.subdir=${hydra.job.num}' > "$WORK/$mode.log" 2>&1
        say "3 jobs at t0, engine.reuse=$reuse: rc $?"
      done
      same_tokens "$WORK/tokens_fresh" "$WORK/tokens_reused" 2>&1 | tee -a "$LOG" ;;
    trace) replay_trace trace 200 "" "${MODEL[@]}" ;;
    trace_moe)  # the same trace on Qwen3-30B-A3B (dummy bf16 weights, 61 GB: one H100 with a 13 GB KV cache)
      replay_trace trace_moe 300 " on Qwen3-30B-A3B" "${MOE_MODEL[@]}" ;;
    capacity)
      start=$(date +%s%N); say "start: capacity search (serving workload, 2 repeats a probe)"
      timeout -k 15 "$(cap 200)" "$PY" run.py experiment=capacity "${MODEL[@]}" "${SIZE[@]}" "${CAPACITY[@]}" \
        "hydra.run.dir=$WORK/capacity" > "$WORK/capacity.log" 2>&1
      say "capacity search: rc $? wall $(ms_since "$start") ms"
      grep -E "^capacity|nanoexp: error" "$WORK/capacity.log" | tee -a "$LOG"
      cat "$WORK/capacity/capacity.md" 2>/dev/null | tee -a "$LOG" ;;
    *) say "unknown part $part (reuse, aa, tokens, trace, trace_moe, capacity)" ;;
  esac
done
pack() { tar czf "$OUT/workloads.tgz" -C "$(dirname "$WORK")" --exclude='*.jsonl' --exclude='.gpu_locks' "$@" \
  "$(basename "$WORK")"; }
pack  # the device returns files up to 16 MiB: drop the step logs, then the plots, where it would not
[ "$(stat -c %s "$OUT/workloads.tgz")" -gt 15000000 ] && pack --exclude='steps.csv'
[ "$(stat -c %s "$OUT/workloads.tgz")" -gt 15000000 ] && pack --exclude='steps.csv' --exclude='*.png'
say "done $(date -u +%FT%TZ); files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
