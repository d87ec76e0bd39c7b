#!/usr/bin/env bash
# The test suite (CPU by default; pass `-m gpu` on a CUDA machine): sets up .venv if needed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" test
cd "$root"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec python -m pytest -q "$@"
