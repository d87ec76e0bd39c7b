#!/usr/bin/env bash
# The test suite (CPU by default; pass `-m gpu` on a CUDA machine): sets up .venv if needed.
# The CPU suite runs on every core through pytest-xdist: one worker per core (worker_count), one torch
# thread each. A run given test files or ids, `-m gpu` or its own `-n` / `--dist` / `-p no:xdist`
# runs as asked (one process: no worker start-up), and so does a venv without xdist.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" test
cd "$root"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One torch thread per process: the suite's models are tiny, so a second thread per op costs more
# than it gives, and on a busy machine it waits for a core at every op (tests/engine/test_parity.py:
# 28 s on one thread, 87 s on two, at load 3 on 2 cores).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Bytecode of the project's own modules is kept (in __pycache__, which git ignores): where the
# environment says not to write it, each of the suite's processes (run.py jobs, TP workers) compiled
# nanoexp again, ~0.2 s of CPU each.
unset PYTHONDONTWRITEBYTECODE

# Whether the arguments ask for the GPU tests (-m gpu, -m gpu_quick, -m "gpu and ...").
asks_for_gpu() {
  local arg previous=""
  for arg in "$@"; do
    case "$arg" in -mgpu*) return 0 ;; esac
    if [ "$previous" = -m ] && [[ "$arg" == *gpu* && "$arg" != *"not gpu"* ]]; then return 0; fi
    previous="$arg"
  done
  return 1
}

# Whether the arguments leave the worker count to this script: no test files or ids (a few tests
# run faster in one process), no GPU marker (the GPU tests share one device), no debugger (xdist
# refuses it), no -n/--dist/-p of the caller's own.
wants_parallel() {
  local arg previous=""
  if asks_for_gpu "$@"; then return 1; fi
  for arg in "$@"; do
    case "$arg" in
      -n*|--numprocesses*|--dist*|-pno:xdist|--pdb|--trace) return 1 ;;
    esac
    [ "$previous" != -p ] || [ "$arg" != no:xdist ] || return 1
    [ ! -f "${arg%%::*}" ] || return 1
    previous="$arg"
  done
  python -c "import xdist" 2>/dev/null
}

# One worker per core this process may use: the cores it may run on, fewer where a cgroup's CPU quota
# says so, at most 8 (each worker's subprocess jobs and TP workers need memory too).
worker_count() {
  local cores quota period
  cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"  # nproc reports OMP_NUM_THREADS where set
  if read -r quota period 2>/dev/null < /sys/fs/cgroup/cpu.max && [ "$quota" != max ]; then
    cores=$(( (quota + period - 1) / period < cores ? (quota + period - 1) / period : cores ))
  fi
  echo $(( cores < 1 ? 1 : cores > 8 ? 8 : cores ))
}

# The default suite is the CPU suite also on a CUDA machine: its tests take the CPU path and Triton's
# interpreter there, as in CI (on a device they would run the GPU kernels at the CPU tests' tolerances).
asks_for_gpu "$@" || export CUDA_VISIBLE_DEVICES=""

# worksteal: idle workers take queued tests from busy ones, so one slow test does not end the run alone
parallel=()
if wants_parallel "$@"; then
  workers="$(worker_count)"
  [ "$workers" -le 1 ] || parallel=(-n "$workers" --dist worksteal)
fi
exec python -m pytest -q "${parallel[@]}" "$@"
