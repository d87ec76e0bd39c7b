#!/usr/bin/env bash
# The test suite (CPU by default; pass `-m gpu` on a CUDA machine): sets up .venv if needed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" test
cd "$root"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One torch thread per process: the suite's models are tiny, so a second thread per op costs more
# than it gives, and on a busy machine it waits for a core at every op (tests/test_engine_parity.py:
# 28 s on one thread, 87 s on two, at load 3 on 2 cores).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec python -m pytest -q "$@"
