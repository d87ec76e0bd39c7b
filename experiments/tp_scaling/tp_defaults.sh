#!/usr/bin/env bash
# Device calls on 2 GPUs for the tensor-parallel acceptance runs with the current defaults (async
# scheduling at every TP size, parallel.all_reduce=auto, the shared-memory step ring); each table is
# one sweep. Sweep summaries land in $OUT/<part>.md.
# Usage (repo root, GPU machine, .whl carried): bash experiments/tp_scaling/tp_defaults.sh [parts]
#   bench8b      Qwen3-8B nanovllm_bench, parallel=tp1,tp2 x parallel.all_reduce=nccl,auto
#                (the two TP=1 jobs are the same setting twice: the run-to-run spread)
#   tp8b         Qwen3-8B nanovllm_bench, parallel=tp1,tp2 (all defaults)
#   latency      batch-1 decode, Qwen3-8B and 0.6B, parallel=tp1,tp2
#   async8b      Qwen3-8B nanovllm_bench at TP=2, scheduler.async_scheduling=false,true
#   bench_small  Qwen3-1.7B and 4B nanovllm_bench, parallel=tp1,tp2
#   sampling     batch-1 decode, Qwen3-0.6B, parallel=tp1,tp2 x parallel.sharded_sampling=false,true
#   sampling8b   Qwen3-8B nanovllm_bench, parallel=tp1,tp2 x parallel.sharded_sampling=false,true
#   latency8b    batch-1 decode, Qwen3-8B, parallel=tp1,tp2
#   push_tests   the push all-reduce's GPU tests on 2 GPUs (kernel against NCCL, TP=2 float32 parity
#                with push forced, bf16 push against NCCL token for token); one call
#   push         bench_all_reduce.py with the push columns, then batch-1 decode of Qwen3-0.6B at
#                parallel=tp1,tp2 x parallel.all_reduce=auto,push (the TP=1 pair is the spread) and of
#                Qwen3-8B at TP=2 x auto,push; a call of its own
#   gpu_tests    pytest -m gpu tests/ (both GPUs: the TP=2 parity tests run; ~9 min in all, so
#                split in two calls: gpu_tests_engine (engine, all-reduce, KV quality files) and
#                gpu_tests_rest (the others), each one pytest process)
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dummy=(model.load_format=dummy model.dtype=bfloat16)
sweep() {  # name, timeout, overrides...
  local name=$1 t=$2; shift 2
  timeout "$t" python3 run.py -m "$@" logger=none hydra.sweep.dir="$OUT/$name" \
    'hydra.sweep.subdir=${hydra.job.num}' > "$OUT/$name.log" 2>&1
  cp "$OUT/$name/sweep_summary.md" "$OUT/$name.md" 2>/dev/null || tail -5 "$OUT/$name.log"
}
for part in ${*:-bench8b latency}; do
  case "$part" in
    bench8b) sweep bench8b 300 experiment=nanovllm_bench model=qwen3_8b "${dummy[@]}" \
      parallel=tp1,tp2 parallel.all_reduce=nccl,auto ;;
    tp8b) sweep tp8b 300 experiment=nanovllm_bench model=qwen3_8b "${dummy[@]}" parallel=tp1,tp2 ;;
    latency) sweep latency 420 model=qwen3_8b,qwen3_0_6b "${dummy[@]}" workload=latency \
      workload.batch_size=1 scheduler.max_num_seqs=8 parallel=tp1,tp2 ;;
    async8b) sweep async8b 200 experiment=nanovllm_bench model=qwen3_8b "${dummy[@]}" parallel=tp2 \
      scheduler.async_scheduling=false,true ;;
    sampling) sweep sampling 360 model=qwen3_0_6b "${dummy[@]}" workload=latency workload.batch_size=1 \
      scheduler.max_num_seqs=8 parallel=tp1,tp2 parallel.sharded_sampling=false,true ;;
    sampling8b) sweep sampling8b 420 experiment=nanovllm_bench model=qwen3_8b "${dummy[@]}" \
      parallel=tp1,tp2 parallel.sharded_sampling=false,true ;;
    latency8b) sweep latency8b 300 model=qwen3_8b "${dummy[@]}" workload=latency workload.batch_size=1 \
      scheduler.max_num_seqs=8 parallel=tp1,tp2 ;;
    gpu_tests|gpu_tests_engine|gpu_tests_rest)
      engine_files="tests/test_gpu_engine.py tests/test_gpu_all_reduce.py tests/test_kv_quality.py"
      case "$part" in
        gpu_tests) files=tests/ ;;
        gpu_tests_engine) files=$engine_files ;;
        gpu_tests_rest) files=$(ls tests/test_*.py | grep -v -e test_gpu_engine -e test_gpu_all_reduce \
                                  -e test_kv_quality) ;;
      esac
      timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -m gpu -rfs $files > "$OUT/$part.log" 2>&1
      grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/$part.log" | tail -25 ;;
    push_tests) timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_all_reduce.py \
            tests/test_push_all_reduce.py tests/test_gpu_engine.py -k "all_reduce or push" > "$OUT/push_tests.log" 2>&1
          tail -3 "$OUT/push_tests.log" ;;
    push) timeout 120 python3 experiments/tp_scaling/bench_all_reduce.py --world 2 --rows 1 16 64 128 256 \
            --hidden 1024 4096 --out "$OUT/all_reduce_push.md" > "$OUT/bench_ar.log" 2>&1 || tail -5 "$OUT/bench_ar.log"
          sweep push06b 240 model=qwen3_0_6b "${dummy[@]}" workload=latency workload.batch_size=1 \
            scheduler.max_num_seqs=8 parallel=tp1,tp2 parallel.all_reduce=auto,push
          sweep push8b 200 model=qwen3_8b "${dummy[@]}" workload=latency workload.batch_size=1 \
            scheduler.max_num_seqs=8 parallel=tp2 parallel.all_reduce=auto,push ;;
    bench_small) sweep bench_small 300 experiment=nanovllm_bench model=qwen3_1_7b,qwen3_4b "${dummy[@]}" \
      parallel=tp1,tp2 ;;
  esac
  date
done
tar -czf "$OUT/runs.tgz" -C "$OUT" --exclude=wandb --exclude='*.csv' $(cd "$OUT" && ls -d */ 2>/dev/null)
