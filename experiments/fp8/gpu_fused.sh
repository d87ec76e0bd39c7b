#!/usr/bin/env bash
# Fused fp8 input quantization (add + RMSNorm and SwiGLU emitting e4m3 and scales) before/after, in one
# device call on one H100 (about 6-8 min; BUDGET caps it). Run from the repo root of the new tree, with the
# hydra/omegaconf/wandb wheels in .whl (carried: the GPU image lacks them; installed once into /tmp/site)
# and BASE a `git archive` of the tree to compare against (main without the fused producers), carried too:
#   mkdir -p .gpu/base && git -C /work/main archive main | tar -x -C .gpu/base     # on the CPU machine
#   BASE=.gpu/base BASE_LABEL=$(git -C /work/main rev-parse --short main) bash experiments/fp8/gpu_fused.sh
#   SMOKE=1 BASE=. OUT=/tmp/x PYTHON=.venv/bin/python bash experiments/fp8/gpu_fused.sh   # CPU, qwen3_tiny,
#                                             # a few tokens, the GPU tests only collected: checks the script
# Steps, in order, base before new in each measurement, each with its own timeout cut to what is left of
# BUDGET (s, default 470; a step with under 20 s left is skipped):
#   tests    pytest -m gpu tests/kernels/test_fp8_fused_inputs.py on the new tree -> $OUT/fused_tests.log
#   tpot     Qwen3-8B dummy weights, batch-1 TPOT with model.quantization=none,fp8: gpu_check.sh's command
#            (128 in, 128 out, 4 iterations), on base and on new
#   prefill  the same sweep at a 4,096-token prompt, 1 output token, prefix caching off (5 iterations): the
#            median 4,096-token prefill step from each job's steps.csv, on base and on new
#   bench    experiments/fp8/kernel_bench.py --fused on new -> $OUT/kernel_bench.log
#   gemv     the one-row GEMV candidate that sums once after its K loop (GemvConfig.deferred_sum, off in the
#            engine): its GPU test, then kernel_bench.py --gemv on new -> $OUT/gemv.log
# Writes $OUT/fused.log (progress in elapsed seconds, each step's rc and wall time, the before/after table),
# $OUT/fused_tests.log, $OUT/kernel_bench.log, $OUT/gemv.log and $OUT/fused_runs.tgz (the sweep dirs and
# run.py logs). PARTS="tpot prefill" runs a subset.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
WORK="${WORK:-/tmp/fp8_fused}"; rm -rf "$WORK"; mkdir -p "$WORK"
LOG="$OUT/fused.log"; : > "$LOG"
PY="${PYTHON:-python3}"
NEW=$PWD
[ -d "${BASE:-}/nanoexp" ] || { echo "BASE=<dir>: a tree (git archive) holding run.py and nanoexp/ (got '${BASE:-}')" | tee -a "$LOG"; exit 2; }
BASE=$(cd "$BASE" && pwd); BASE_LABEL="${BASE_LABEL:-$(basename "$BASE")}"
NEW_LABEL="${NEW_LABEL:-$(git rev-parse --short HEAD 2>/dev/null || echo new)}"  # the device's copy may lack .git
SITE="${PYTHONPATH:-}"  # the caller's path (hydra & co. found there are kept on it)
if ! "$PY" -c "import hydra" 2>/dev/null; then  # the GPU image lacks hydra & co.: the wheels in .whl
  if [ ! -d /tmp/site/hydra ] && [ -d "${WHEELS:-.whl}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "${WHEELS:-.whl}"/*.whl || { echo "wheel install failed" | tee -a "$LOG"; exit 1; }
  fi
  SITE=/tmp/site
fi
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
BUDGET="${BUDGET:-470}"; T0=$(date +%s)
if [ "${SMOKE:-0}" = 1 ]; then  # CPU: the tiny model, a few tokens, every override the GPU run uses
  MODEL=(model=qwen3_tiny cache.cpu_kv_cache_gib=0.05 logger=none engine.use_tqdm=false
         metrics.weight_quality.num_requests=0)
  TPOT=(workload.input_len=16 workload.output_len=4 workload.num_iters=2)
  PREFILL_LEN=64; PREFILL=(workload.num_iters=2); PYTEST_ARG=(--collect-only)
else
  MODEL=(model=qwen3_8b model.load_format=dummy model.dtype=bfloat16 logger=none metrics.weight_quality.num_requests=0)
  TPOT=(workload.input_len=128 workload.output_len=128 workload.num_iters=4)
  PREFILL_LEN=4096; PREFILL=(workload.num_iters=5); PYTEST_ARG=()
fi
LATENCY=(workload=latency workload.batch_size=1 scheduler.max_num_seqs=8 workload.num_iters_warmup=1
         model.quantization=none,fp8)
PREFILL+=(workload.input_len=$PREFILL_LEN workload.output_len=1 cache.enable_prefix_caching=false)
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "[+$(elapsed)s] $*" | tee -a "$LOG"; }
cap() { local left=$(( BUDGET - $(elapsed) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
budget_ok() { [ $(( BUDGET - $(elapsed) )) -ge 20 ] || { say "skipped $1: the budget of ${BUDGET}s is spent"; return 1; }; }
# One run.py sweep from a tree: sweep SIDE NAME CAP OVERRIDES... -> $WORK/SIDE_NAME (+ .log)
sweep() {
  local side=$1 name=$2 limit=$3; shift 3
  local tree=$NEW dir="$WORK/${side}_$name" start; [ "$side" = base ] && tree=$BASE
  budget_ok "$side $name" || return 0
  start=$(date +%s); say "start: $side $name ($tree)"
  (cd "$tree" && PYTHONPATH="$tree${SITE:+:$SITE}" timeout -k 10 "$(cap "$limit")" "$PY" run.py -m \
    "${MODEL[@]}" "${LATENCY[@]}" "$@" "hydra.sweep.dir=$dir" 'hydra.sweep.subdir=${hydra.job.num}' \
    > "$dir.log" 2>&1)
  say "$side $name: rc $? wall $(( $(date +%s) - start )) s"
  grep -hE "nanoexp: error|Error|Traceback" "$dir.log" 2>/dev/null | head -5 | tee -a "$LOG"
}
# The before/after table from the sweeps' results.json and steps.csv
table() { "$PY" - "$WORK" "$PREFILL_LEN" "$BASE_LABEL" "$NEW_LABEL" <<'PY'
import csv, json, pathlib, statistics, sys
work, prefill_len, base_label, new_label = pathlib.Path(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:5]
def jobs(sweep):  # weights -> (summary, median long-prefill step ms)
    out = {}
    for path in sorted((work / sweep).glob("*/results.json")):
        res = json.loads(path.read_text())
        s = res.get("summary", {})
        steps = path.parent / "steps.csv"
        long = [float(r["step_time_ms"]) for r in csv.DictReader(steps.open())
                if int(float(r.get("num_prefill_tokens") or 0)) >= prefill_len] if steps.exists() else []
        out[s.get("weight_quantization", path.parent.name)] = (res.get("status"), s, long)
    return out
def cell(v):
    return "-" if v is None else f"{v:.3f}"
def note(status, s, long, count):
    noise = (s.get("noise_warning") or "").split(":")[0].split("(")[0].strip()
    return f"{status}{f' n={len(long)}' if count else ''}{', ' + noise if noise else ''}"
print(f"| measurement | weights | base {base_label} | new {new_label} | new / base | status base / new |")
print("|---|---|---:|---:|---:|---|")
for name, key in (("tpot", "mean_tpot_ms"), ("tpot", "median_tpot_ms"), ("prefill", "long_prefill_ms")):
    base, new = jobs("base_" + name), jobs("new_" + name)
    label = f"{prefill_len}-token prefill step, median ms" if key == "long_prefill_ms" else f"batch-1 {key}"
    by_weights = {}
    for weights in ("none", "fp8"):
        vals, notes = [], []
        for side in (base, new):
            status, s, long = side.get(weights, (None, {}, []))
            vals.append(statistics.median(long) if key == "long_prefill_ms" and long else s.get(key))
            notes.append(note(status, s, long, key == "long_prefill_ms"))
        by_weights[weights] = vals
        ratio = vals[1] / vals[0] if None not in vals and vals[0] else None
        print(f"| {label} | {weights} | {cell(vals[0])} | {cell(vals[1])} | {cell(ratio)} | {' / '.join(notes)} |")
    ratios = [f / n if f is not None and n else None for f, n in zip(by_weights["fp8"], by_weights["none"])]
    print(f"| {label} | fp8 / none | {cell(ratios[0])} | {cell(ratios[1])} | | |")
PY
}
say "fused fp8 input quantization, before/after $(date -u +%FT%TZ) new $NEW_LABEL base $BASE_LABEL SMOKE=${SMOKE:-0} budget ${BUDGET}s"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
fi
for part in ${PARTS:-tests tpot prefill bench gemv}; do
  budget_ok "$part" || continue
  case "$part" in
    tests)  # straight to a file in $OUT: a timeout keeps what ran
      start=$(date +%s); say "start: GPU tests of the fused producers (new tree)"
      PYTHONPATH="$NEW${SITE:+:$SITE}" timeout -k 10 "$(cap 100)" "$PY" -m pytest -q -p no:cacheprovider -m gpu \
        --durations=10 "${PYTEST_ARG[@]}" tests/kernels/test_fp8_fused_inputs.py > "$OUT/fused_tests.log" 2>&1
      say "tests: rc $? wall $(( $(date +%s) - start )) s; $(tail -1 "$OUT/fused_tests.log")" ;;
    tpot)
      for side in base new; do sweep "$side" tpot 100 "${TPOT[@]}"; done ;;
    prefill)
      for side in base new; do sweep "$side" prefill 75 "${PREFILL[@]}"; done ;;
    bench)
      start=$(date +%s); say "start: kernel_bench.py --fused (new tree)"
      if [ "${SMOKE:-0}" = 1 ]; then  # no CUDA: its imports only
        PYTHONPATH="$NEW${SITE:+:$SITE}" "$PY" -c "import runpy; runpy.run_path('experiments/fp8/kernel_bench.py')" \
          > "$OUT/kernel_bench.log" 2>&1
      else
        PYTHONPATH="$NEW${SITE:+:$SITE}" timeout -k 10 "$(cap 150)" "$PY" experiments/fp8/kernel_bench.py --fused \
          > "$OUT/kernel_bench.log" 2>&1
      fi
      say "bench: rc $? wall $(( $(date +%s) - start )) s" ;;
    gemv)
      start=$(date +%s); say "start: the sum-once GEMV candidate: GPU test, kernel_bench.py --gemv (new tree)"
      PYTHONPATH="$NEW${SITE:+:$SITE}" timeout -k 10 "$(cap 60)" "$PY" -m pytest -q -p no:cacheprovider -m gpu \
        "${PYTEST_ARG[@]}" -k summing_once tests/kernels/test_fp8_kernels.py > "$OUT/gemv.log" 2>&1
      say "gemv tests: rc $? wall $(( $(date +%s) - start )) s; $(tail -1 "$OUT/gemv.log")"
      if [ "${SMOKE:-0}" != 1 ] && budget_ok "kernel_bench.py --gemv"; then
        PYTHONPATH="$NEW${SITE:+:$SITE}" timeout -k 10 "$(cap 120)" "$PY" experiments/fp8/kernel_bench.py --gemv \
          >> "$OUT/gemv.log" 2>&1
      fi
      say "gemv: rc $? wall $(( $(date +%s) - start )) s" ;;
    *) say "unknown part $part (tests, tpot, prefill, bench, gemv)" ;;
  esac
done
say "before/after (base $BASE_LABEL, new $NEW_LABEL)"
table 2>&1 | tee -a "$LOG"
tar czf "$OUT/fused_runs.tgz" -C "$(dirname "$WORK")" --exclude='*.jsonl' --exclude='*.png' "$(basename "$WORK")"
say "done $(date -u +%FT%TZ); files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
