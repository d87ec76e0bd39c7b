#!/usr/bin/env bash
# Build flash-attn 2 from its PyPI sdist with only the kernels nanoexp calls (forward, paged KV,
# fp16/bf16, head dim 128, sm90), offline, and install it as a plain directory on PYTHONPATH.
#
#   experiments/kernels/build_flash_attn.sh [SDIST] [TARGET]
#     SDIST   default .fa/flash_attn-2.8.3.tar.gz (fetched with: pip download --no-deps
#             --no-binary :all: --no-build-isolation flash-attn==2.8.3, FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE)
#     TARGET  default /tmp/fa; afterwards: export PYTHONPATH=TARGET:$PYTHONPATH
#   env: FA_HEAD_DIMS ("128"; "64 128" adds Qwen2.5-0.5B's), FA_CUDA_ARCHS ("90"), MAX_JOBS (nproc),
#        PYTHON (python), OUT (log directory; the log is $OUT/flash_attn_build.log)
#
# Needs only torch, setuptools, ninja and nvcc: flash-attn's own setup.py is not run (it would
# try to download a prebuilt wheel, fetch git submodules and need psutil/wheel); the sdist already
# ships csrc/cutlass. See flash_attn_lean_setup.py for which kernel files are kept and why.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SDIST="${1:-.fa/flash_attn-2.8.3.tar.gz}"
TARGET="${2:-/tmp/fa}"
PYTHON="${PYTHON:-python}"
LOG="${OUT:-/tmp}/flash_attn_build.log"
WORK="$(mktemp -d /tmp/fa-build.XXXXXX)"

export FA_HEAD_DIMS="${FA_HEAD_DIMS:-128}" FA_CUDA_ARCHS="${FA_CUDA_ARCHS:-90}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}" NVCC_THREADS="${NVCC_THREADS:-1}"
if [[ -z "${CUDA_HOME:-}" ]]; then
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then CUDA_HOME=/usr/local/cuda
  else CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"; fi
fi
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"

{
  echo "flash-attn lean build: sdist=$SDIST head_dims=$FA_HEAD_DIMS archs=$FA_CUDA_ARCHS jobs=$MAX_JOBS"
  echo "nvcc: $(nvcc --version | tail -1); torch: $("$PYTHON" -c 'import torch; print(torch.__version__, torch.version.cuda)')"
  date -u +"start %FT%TZ"
} | tee "$LOG"

tar -xzf "$SDIST" -C "$WORK"
SRC="$(echo "$WORK"/flash_attn-*)"
start=$SECONDS
(cd "$SRC" && "$PYTHON" "$HERE/flash_attn_lean_setup.py" build_ext --inplace) >>"$LOG" 2>&1 || {
  echo "flash-attn build FAILED after $((SECONDS - start)) s; last lines of $LOG:"
  grep -m 20 -E "error|Error" "$LOG" || tail -n 40 "$LOG"
  exit 1
}
echo "compiled in $((SECONDS - start)) s" | tee -a "$LOG"

rm -rf "$TARGET" && mkdir -p "$TARGET"
cp -r "$SRC/flash_attn" "$TARGET/"
cp "$SRC"/flash_attn_2_cuda*.so "$TARGET/"
ls -la "$TARGET" | tee -a "$LOG"
PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c \
  'import flash_attn, flash_attn_2_cuda; print("import ok:", flash_attn.__version__, flash_attn_2_cuda.__file__)' \
  2>&1 | tee -a "$LOG"
rm -rf "$WORK"
