#!/usr/bin/env bash
# Creates .venv (once) with everything nanoexp needs; sourced by run.sh and test.sh.
# A torch already on the machine (e.g. a CUDA build) is reused; otherwise the CPU build is installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$venv"
fi
py="$venv/bin/python"
stamp="$venv/.nanoexp-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$py" -m pip install -q --upgrade pip
  if ! "$py" -c "import torch" 2>/dev/null; then
    "$py" -m pip install -q "torch==2.13.0"
  fi
  "$py" -m pip install -q -e "$root[test,triton]"
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
