#!/usr/bin/env bash
# The verdicts on a GPU (one call, < 5 min on an H100): experiment=nanovllm_bench (Qwen3-0.6B, dummy
# weights, 64 of its requests, 2 repeats a run) as an A/A over two sweep dirs whose trials interleave as
# separate processes (a0 b0 a1 b1 a2 b2), then compare (expected: within noise, interval widths printed);
# an A/B of cache.kv_cache_dtype=auto against fp8_e4m3 (3 trials, fresh engines); and how long a repeat
# must last on this GPU (within-run spread at 8 and 32 requests beside the A/A's 64).
# Run from the repo root with the wheels installed and PYTHONPATH set; writes $OUT/verdicts.log and
# $OUT/verdicts_tables.md.
set -u
OUT=${OUT:-/tmp/verdicts_out}
mkdir -p "$OUT"
LOG=$OUT/verdicts.log
TABLES=$OUT/verdicts_tables.md
WORK=$(mktemp -d)
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled
# VERDICTS_COMMON replaces the workload for a dry run elsewhere (e.g. "model=qwen3_tiny logger=none ...")
read -r -a COMMON <<<"${VERDICTS_COMMON:-experiment=nanovllm_bench logger=none workload.num_requests=64 repeats=2 metrics.kv_quality.num_requests=0}"
START=$(date +%s)
exec >"$LOG" 2>&1
elapsed() { echo "[$(($(date +%s) - START)) s] $*"; }

elapsed "commit $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) changed files"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader || echo "no nvidia-smi"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

job() {  # side trial overrides...
  local side=$1 trial=$2
  shift 2
  timeout 150 python run.py -m "trial=$trial" "${COMMON[@]}" "$@" "hydra.sweep.dir=$WORK/$side" append_to_sweep=true 2>&1 \
    | grep -E "^(output throughput|duration|TPOT|TTFT)|noisy|error" | sed "s/^/  $side$trial /"
  elapsed "side $side trial $trial done"
}

for trial in 0 1 2; do  # A/A, interleaved processes
  job a "$trial"
  job b "$trial"
done
elapsed "A/B: fp8_e4m3 KV cache, 3 trials in one process (fresh engine each)"
timeout 200 python run.py -m trial=0,1,2 "${COMMON[@]}" cache.kv_cache_dtype=fp8_e4m3 "hydra.sweep.dir=$WORK/c" 2>&1 \
  | grep -E "^(output throughput|duration)|noisy|error"
elapsed "compares"
{
  echo "# A/A: auto against auto (expected: within noise)"
  python -m nanoexp.experiment.report.compare "$WORK/a" "$WORK/b" --out "$WORK/ab"
  echo
  echo "# A/B: auto (A) against fp8_e4m3 (B)"
  python -m nanoexp.experiment.report.compare "$WORK/a" "$WORK/c" --out "$WORK/ac"
} | tee "$TABLES"
python - "$WORK/ab/compare.csv" "$WORK/ac/compare.csv" <<'PY' | tee -a "$TABLES"
import sys
import pandas as pd
for name, path in zip(("A/A", "A/B"), sys.argv[1:]):
    t = pd.read_csv(path)
    t["width_%"] = 100 * (t["ratio_ci95_high"] - t["ratio_ci95_low"]) / 2
    print(f"\n{name}: interval half-widths (% of the ratio) and verdicts")
    print(t[["metric", "ratio", "ratio_ci95_low", "ratio_ci95_high", "width_%", "verdict", "runs"]].to_string(index=False))
PY
if (($(date +%s) - START < 230)); then  # within the 5 minutes: the within-run spread of shorter repeats
  elapsed "minimum duration: within-run spread at 8 and 32 requests (one process, 4 repeats each)"
  timeout 90 python run.py -m "${COMMON[@]}" repeats=4 workload.num_requests=8,32 "hydra.sweep.dir=$WORK/md" >/dev/null 2>&1
else
  elapsed "minimum duration skipped (time); 64 requests are in the A/A above"
fi
python - "$WORK/md" "$WORK/a" <<'PY' | tee -a "$TABLES"
import json, sys
from pathlib import Path
import numpy as np
print("\nrequests | s a repeat | output tok/s | within-run CV of throughput (last 3 repeats at most)")
paths = [p for d in sys.argv[1:] for p in sorted(Path(d).glob("*/results.json"))]
for path in paths:
    s = json.loads(path.read_text())["summary"]
    tput = np.array([r["output_throughput"] for r in s["per_repeat"]][-3:])
    n = s.get("completed")
    print(f"{n} | {s['duration_s']:.3f} | {s['output_throughput']:,.0f} | {100 * tput.std(ddof=1) / tput.mean():.2f}%")
PY
for side in a b c; do
  echo "## sweep $side" >>"$TABLES"
  cat "$WORK/$side/sweep_summary.md" >>"$TABLES" 2>/dev/null
done
elapsed "done"
