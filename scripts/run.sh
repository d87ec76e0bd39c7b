#!/usr/bin/env bash
# The main job: sets up .venv if needed, then `python run.py` with any Hydra overrides given.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" run
cd "$root"
export WANDB_MODE="${WANDB_MODE:-offline}" HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
exec python run.py "$@"
