#!/usr/bin/env bash
# The workloads study in one device call, Qwen3-0.6B (dummy weights, bf16), everything in $OUT/workloads.log
# (and the sweep dirs in $OUT/workloads.tgz). Run from the repo root with the wheels on PYTHONPATH:
#   bash experiments/serving/gpu_workloads.sh             # all parts: about 6 min on an H100
#   PARTS=reuse bash experiments/serving/gpu_workloads.sh                 # ~3 min
#   PARTS="trace capacity" bash experiments/serving/gpu_workloads.sh      # ~3 min
# Parts:
#   reuse     the serving preset's workload (256 requests, 512 prompt and 128 output tokens, 2 repeats,
#             greedy, SLOs TTFT 200 ms and TPOT 20 ms) swept over 6 rates, once with a fresh engine per
#             job (engine.reuse=false) and once reusing one; the wall time of each sweep, whether the
#             tokens agree job by job, and `compare` on the latencies (fresh = A, reused = B); the grid's
#             max rate meeting the SLOs
#   trace     a synthetic Mooncake-format trace (make_mooncake_trace.py: 8 s, ~6 req/s, ~5.6k-token
#             prompts sharing ~half their blocks) replayed with scheduler.batching=prefill_first,mixed
#             and prefix caching on and off
#   capacity  experiment=capacity on the same serving workload: the highest rate meeting the SLOs by
#             search, to set against the grid's answer
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
LOG="$OUT/workloads.log"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
MODEL=(model=qwen3_0_6b model.load_format=dummy model.dtype=bfloat16 logger=none engine.use_tqdm=false)
SERVING=(experiment=serving repeats=2 sampler=greedy save_outputs=true)
RATES="${RATES:-64,128,192,256,384,inf}"
say() { echo "$*" | tee -a "$LOG"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# Each job's build time, whether it reused an engine, and its mean TTFT/TPOT, from its results.json
jobs_table() { "$PY" - "$@" <<'PY'
import json, pathlib, sys
for sweep in sys.argv[1:]:
    for path in sorted(pathlib.Path(sweep).glob("*/results.json"), key=lambda p: int(p.parent.name.split("_")[0])):
        s = json.loads(path.read_text()).get("summary", {})
        print(f"{sweep} job {path.parent.name}: rate {s.get('offered_request_rate')} build_s {s.get('build_s', 0):.2f} "
              f"reused {s.get('engine_reused')} engine {s.get('engine_id')} mean TTFT {s.get('mean_ttft_ms', 0):.1f} ms "
              f"mean TPOT {s.get('mean_tpot_ms', 0):.2f} ms attainment {s.get('slo_attainment')}")
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
equal = [job for job in a if a[job] == b.get(job)]
print(f"greedy tokens equal, fresh vs reused engine: {len(equal)} of {len(a)} jobs")
PY
}
say "# workloads study $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"
for part in ${PARTS:-reuse trace capacity}; do
  case "$part" in
    reuse)
      for mode in fresh reused; do
        reuse=$([ "$mode" = reused ] && echo true || echo false); start=$(date +%s%N)
        timeout 240 "$PY" run.py -m "${MODEL[@]}" "${SERVING[@]}" "workload.request_rate=$RATES" engine.reuse=$reuse \
          hydra.sweep.dir=/tmp/wl_$mode 'hydra.sweep.subdir=${hydra.job.num}' > "/tmp/wl_$mode.log" 2>&1
        say "6-point rate sweep, engine.reuse=$reuse: rc $? wall $(ms_since "$start") ms"
        grep -E "max rate|error" /tmp/wl_$mode/sweep_summary.md "/tmp/wl_$mode.log" 2>/dev/null | head -5 | tee -a "$LOG"
      done
      jobs_table /tmp/wl_fresh /tmp/wl_reused | tee -a "$LOG"
      same_tokens /tmp/wl_fresh /tmp/wl_reused | tee -a "$LOG"
      timeout 60 "$PY" -m nanoexp.experiment.report.compare /tmp/wl_fresh /tmp/wl_reused --out /tmp/wl_compare \
        --metrics mean_ttft_ms,p99_ttft_ms,mean_tpot_ms,output_throughput 2>&1 | tail -40 | tee -a "$LOG" ;;
    trace)
      "$PY" experiments/serving/make_mooncake_trace.py --out /tmp/mooncake.jsonl --seconds 8 --rate 6 | tee -a "$LOG"
      start=$(date +%s%N)
      timeout 200 "$PY" run.py -m "${MODEL[@]}" workload=trace workload.path=/tmp/mooncake.jsonl \
        scheduler.batching=prefill_first,mixed cache.enable_prefix_caching=true,false \
        metrics.slo.ttft_ms=1000 metrics.slo.tpot_ms=50 hydra.sweep.dir=/tmp/wl_trace \
        'hydra.sweep.subdir=${hydra.job.num}' > /tmp/wl_trace.log 2>&1
      say "Mooncake-format trace, batching x prefix caching: rc $? wall $(ms_since "$start") ms"
      grep -E "error" /tmp/wl_trace.log | head -5 | tee -a "$LOG"
      cat /tmp/wl_trace/sweep_summary.md 2>/dev/null | tee -a "$LOG" ;;
    capacity)
      start=$(date +%s%N)
      timeout 240 "$PY" run.py experiment=capacity "${MODEL[@]}" capacity.start_rate=128 capacity.precision=0.15 \
        hydra.run.dir=/tmp/wl_capacity > /tmp/wl_capacity.log 2>&1
      say "capacity search (serving workload: 256 requests, 2 repeats): rc $? wall $(ms_since "$start") ms"
      grep -E "^capacity|error" /tmp/wl_capacity.log | tee -a "$LOG"
      cat /tmp/wl_capacity/capacity.md 2>/dev/null | tee -a "$LOG" ;;
  esac
done
tar czf "$OUT/workloads.tgz" -C /tmp --exclude='*.jsonl' $(cd /tmp && ls -d wl_* 2>/dev/null) 2>/dev/null
say "done $(date -u +%FT%TZ)"
