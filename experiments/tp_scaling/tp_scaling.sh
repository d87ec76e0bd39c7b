#!/usr/bin/env bash
# Tensor-parallel scaling on one multi-GPU host; logs, results and the report under $OUT.
# Usage (repo root, on the GPU machine; one device call may run 600 s, so split parts/models):
#   bash experiments/tp_scaling/tp_scaling.sh [parts]
# parts: any of smoke parity launcher throughput latency report (default: smoke parity launcher report)
# env:   MODELS (default: qwen3_0_6b qwen3_1_7b qwen3_4b qwen3_8b), TPS (default: 1 2 4 8 up to the GPU
#        count), DTYPE (bfloat16), EXTRA (more overrides for every run.py job), PART_TIMEOUT (s, 580)
# CPU dry run: NGPU=2 DTYPE=float32 MODELS=qwen3_tiny EXTRA="workload.num_requests=8 ..." bash ... parts
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if [ -d .whl ]; then  # the GPU image lacks hydra-core, omegaconf, antlr and submitit
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
fi
# NVLink multicast stays off on shared hosts; workers set the same defaults, this covers everything else.
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" TORCH_SYMM_MEM_DISABLE_MULTICAST="${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}"
export NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
NGPU="${NGPU:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}"
MODELS="${MODELS:-qwen3_0_6b qwen3_1_7b qwen3_4b qwen3_8b}"
TPS="${TPS:-$(for tp in 1 2 4 8; do [ "$tp" -le "$NGPU" ] || [ "$tp" -eq 1 ] && echo -n "$tp "; done)}"
DTYPE="${DTYPE:-bfloat16}"; EXTRA="${EXTRA:-}"; T="${PART_TIMEOUT:-580}"
PARALLEL="$(for tp in $TPS; do echo -n "tp$tp,"; done)"; PARALLEL="${PARALLEL%,}"
MULTI="$(for tp in $TPS; do [ "$tp" -gt 1 ] && echo -n "$tp "; done)"
parts="${*:-smoke parity launcher report}"
echo "GPUs: $NGPU  TP sizes: $TPS  models: $MODELS  parts: $parts" | tee -a "$OUT/machine.txt"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/machine.txt"
  nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
fi
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else '-')" | tee -a "$OUT/machine.txt"

dummy() { echo "model=$1 model.load_format=dummy model.dtype=$DTYPE"; }
SUBDIR='hydra.sweep.subdir=${hydra.job.num}'  # job dirs named by number: the override list is too long
top_tp() { echo "$TPS" | tr ' ' '\n' | grep . | tail -1; }

for part in $parts; do
  case "$part" in
    smoke)  # run.py end to end at the largest TP: workers, NCCL, CUDA graphs, KV agreement
      timeout "$T" python3 run.py parallel=tp"$(top_tp)" $(dummy "${MODELS%% *}") logger=none $EXTRA \
        hydra.run.dir="$OUT/smoke" 2>&1 | tee "$OUT/smoke.log" | tail -20 ;;
    parity)  # greedy TP=N vs TP=1 on one random checkpoint (see parity.py for the bf16 policy)
      [ -n "$MULTI" ] || { echo "parity: needs 2+ GPUs, skipped"; continue; }
      timeout "$T" python3 experiments/tp_scaling/parity.py --model "${MODELS%% *}" --dtype "$DTYPE" \
        --tp $MULTI --out "$OUT/parity.json" 2>&1 | tee "$OUT/parity.log" | tail -40 ;;
    launcher)  # parallel=tp1,tp2 as concurrent jobs, each narrowed to its own GPUs
      timeout "$T" python3 run.py -m parallel=tp1,tp2 $(dummy "${MODELS%% *}") logger=none $EXTRA \
        hydra/launcher=local_gpus hydra.launcher.gpus_per_node="$NGPU" launch.gpus_per_job=1 \
        hydra.sweep.dir="$OUT/launcher" "$SUBDIR" 2>&1 | tee "$OUT/launcher.log" | tail -20 ;;
    throughput)  # nano-vLLM's benchmark workload, one sweep over TP per model
      for model in $MODELS; do
        timeout "$T" python3 run.py -m experiment=nanovllm_bench $(dummy "$model") parallel="$PARALLEL" \
          logger=none $EXTRA hydra.sweep.dir="$OUT/throughput/$model" "$SUBDIR" 2>&1 \
          | tee "$OUT/throughput_$model.log" | tail -8
      done ;;
    latency)  # one batch of 1 or 64 requests (32 prompt, 128 output tokens), 10 timed iterations;
      # max_num_seqs=64 keeps graph capture to 8 sizes
      for model in $MODELS; do
        timeout "$T" python3 run.py -m $(dummy "$model") scheduler=nanovllm scheduler.max_num_seqs=64 workload=latency \
          workload.batch_size=1,64 parallel="$PARALLEL" logger=none $EXTRA \
          hydra.sweep.dir="$OUT/latency/$model" "$SUBDIR" 2>&1 | tee "$OUT/latency_$model.log" | tail -8
      done ;;
    report)
      python3 experiments/tp_scaling/report.py "$OUT" --models $MODELS 2>&1 | tee "$OUT/report.log" ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
