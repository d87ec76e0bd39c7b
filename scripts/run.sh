#!/usr/bin/env bash
# The main job: sets up .venv if needed, then `python run.py` with any Hydra overrides given.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" run
cd "$root"
export WANDB_MODE="${WANDB_MODE:-offline}" HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
# a busy machine makes timings that the job will flag as noisy (metrics.noise): say what helps up front
cores=$(nproc 2>/dev/null || echo 1)
load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
if awk -v l="$load" -v c="$cores" 'BEGIN { exit !(l > (c - 2 > 0.5 ? c - 2 : 0.5)) }'; then  # few free cores
  echo "nanoexp: note: the machine is busy (load $load on $cores cores): timed jobs will likely be flagged" \
    "noisy and left out of verdicts; what helps: a quieter machine, OMP_NUM_THREADS=$((cores > 1 ? cores - 1 : 1))," \
    "a longer workload (workload.num_requests), trials interleaved (-m trial=0,1,2 ...)" >&2
fi
exec python run.py "$@"
