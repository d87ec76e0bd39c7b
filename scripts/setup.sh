#!/usr/bin/env bash
# Creates .venv (once) with what nanoexp needs; sourced by run.sh (`run`) and test.sh (`test`).
# A torch already on the machine (e.g. a CUDA build) is reused. Otherwise the version that
# pyproject.toml's [tool.nanoexp] table names (the project's one torch pin) comes from PyPI where an
# NVIDIA driver is present and from PyTorch's CPU index elsewhere (PyPI's Linux x86-64 wheel is the
# multi-GB CUDA build). `run` installs the experiment layer (Hydra, W&B, the report's
# pandas/matplotlib/scipy), `test` that and the test tools. Triton is installed where it runs: on
# CUDA machines, and for the tests on any machine (the CPU suite runs the Triton kernels in
# Triton's interpreter).
# NANOEXP_TORCH_INDEX=<url> picks another index for that CPU build (empty: pip's own indexes);
# NANOEXP_SETUP_DRY_RUN=1 prints the install commands instead of running them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NANOEXP_VENV:-$root/.venv}"
purpose="${1:?setup.sh: say what the venv is for: run or test}"

# pyproject.toml's [tool.nanoexp] torch: the version installed where no torch is on the machine.
torch_version() {
  awk -F'"' '/^\[/ { section = $0 } section == "[tool.nanoexp]" && /^torch *=/ { print $2; exit }' \
    "$root/pyproject.toml"
}
torch_pin="torch==$(torch_version)"
[ "$torch_pin" != "torch==" ] || { echo "setup.sh: pyproject.toml names no [tool.nanoexp] torch" >&2; exit 2; }
cpu_index="${NANOEXP_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"  # empty: pip's own indexes

has_cuda() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

# The project's extras for `purpose` (run|test) on this machine, comma-separated.
extras_for() {
  case "$1" in
    run) has_cuda && echo "experiment,triton" || echo "experiment" ;;
    test) echo "experiment,test,triton" ;;
    *) echo "setup.sh: unknown purpose '$1' (run or test)" >&2; return 2 ;;
  esac
}

# The pip command that installs torch; nothing when python $1 already imports one.
torch_commands() {
  if "$1" -c "import torch" 2>/dev/null; then
    return 0
  fi
  if has_cuda || [ -z "$cpu_index" ]; then
    echo "$1 -m pip install -q $torch_pin"
  else
    # few retries: where the index cannot be reached pip falls back to its other sources at once
    echo "$1 -m pip install -q --retries 1 --index-url $cpu_index $torch_pin"
  fi
}

# Whether the stamp says the project was installed, after its last pyproject.toml change, with
# every extra in $1.
installed_with() {
  local stamp="$venv/.nanoexp-installed" extra
  [ -f "$stamp" ] && [ ! "$root/pyproject.toml" -nt "$stamp" ] || return 1
  for extra in ${1//,/ }; do
    grep -qx "$extra" "$stamp" || return 1
  done
}

# "torch <version> (<where from>)" after installing with command $2 (empty: torch was there).
torch_line() {
  local version
  version="$("$1" -c 'import torch; print(torch.__version__)')"
  case "$2" in
    "") echo "torch $version (already installed)" ;;
    *--index-url*) echo "torch $version (from $cpu_index)" ;;
    *) echo "torch $version (from pip's indexes)" ;;
  esac
}

run_or_print() {
  if [ "${NANOEXP_SETUP_DRY_RUN:-0}" = 1 ]; then echo "$*"; else eval "$*"; fi
}

set_up_venv() {
  local extras py="$venv/bin/python" torch_cmd spec
  extras="$(extras_for "$purpose")"
  if [ ! -x "$py" ]; then
    run_or_print "python3 -m venv --system-site-packages '$venv'"
  fi
  installed_with "$extras" && return 0
  torch_cmd="$(torch_commands "$py")"
  spec="$root${extras:+[$extras]}"
  run_or_print "$py -m pip install -q --upgrade pip"
  [ -z "$torch_cmd" ] || run_or_print "$torch_cmd"
  run_or_print "$py -m pip install -q -e '$spec'"
  [ "${NANOEXP_SETUP_DRY_RUN:-0}" = 1 ] && return 0
  printf '%s\n' ${extras//,/ } >"$venv/.nanoexp-installed"
  echo "setup: $(torch_line "$py" "$torch_cmd"), nanoexp${extras:+[$extras]} (editable) in $venv" >&2
}

set_up_venv
export PATH="$venv/bin:$PATH"
