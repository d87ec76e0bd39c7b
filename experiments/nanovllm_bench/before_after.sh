#!/usr/bin/env bash
# One GPU call: nano-vLLM's benchmark on a baseline tree (BASE, e.g. an older commit unpacked with
# `git archive <commit> nanoexp conf run.py | tar -x -C .base`) and on this tree, alternating
# base/this ROUNDS times; this tree's rounds sweep engine.attention_backend (triton, flash_attn when
# importable). Results: $OUT/before_after.md (one row per job) and $OUT/bench.tar.gz (the job dirs).
# Usage (repo root, GPU machine, .whl carried): BASE=.base ROUNDS=2 bash experiments/nanovllm_bench/before_after.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; BASE="${BASE:-.base}"; ROUNDS="${ROUNDS:-2}"
site=/tmp/site
[ -d "$site/hydra" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target "$site" .whl/*.whl
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
backends=triton
python3 -c "import torch, flash_attn_2_cuda" 2>/dev/null && backends=triton,flash_attn
work="$OUT/bench"; mkdir -p "$work"
for round in $(seq "$ROUNDS"); do
  (cd "$BASE" && PYTHONPATH="$site:$PWD" timeout 200 python3 run.py experiment=nanovllm_bench logger=none \
    hydra.run.dir="$work/base_$round") 2>&1 | tail -3
  PYTHONPATH="$site:$PWD:${PYTHONPATH:-}" timeout 300 python3 run.py -m experiment=nanovllm_bench logger=none \
    engine.attention_backend="$backends" hydra.sweep.dir="$work/this_$round" 'hydra.sweep.subdir=${hydra.job.num}' \
    2>&1 | tail -3
done
python3 - "$work" > "$OUT/before_after.md" <<'PY'
import json, pathlib, sys
rows = []
for f in sorted(pathlib.Path(sys.argv[1]).rglob("results.json")):
    r = json.loads(f.read_text()); s = r.get("summary", {})
    rows.append((str(f.parent.relative_to(sys.argv[1])), s.get("attention_backend", "?"),
                 s.get("output_throughput", float("nan")), s.get("mean_tpot_ms", float("nan")),
                 s.get("load_s", 0) + s.get("warmup_s", 0) + s.get("graph_capture_s", 0)))
print("| job | attention | output tok/s | mean TPOT ms | start-up s |\n|---|---|---:|---:|---:|")
for job, backend, tput, tpot, start in rows:
    print(f"| {job} | {backend} | {tput:,.0f} | {tpot:.2f} | {start:.1f} |")
PY
cat "$OUT/before_after.md"
tar -czf "$OUT/bench.tar.gz" -C "$OUT" --exclude=wandb bench && rm -rf "$work"
