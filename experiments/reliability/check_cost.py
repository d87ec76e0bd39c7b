"""What the non-finite checks cost on the GPU (experiments/reliability/README.md).

python experiments/reliability/check_cost.py load [--dir /tmp/qwen3_8b_zeros]
    Loading a Qwen3-8B-shaped bf16 checkpoint (a sparse safetensors file of zeros: written in no time,
    read at page-cache speed, so the load is as fast as a load gets and the check's share an upper
    bound) through the loader without its check, then the check alone, in one process.
python experiments/reliability/check_cost.py step [--trials 5]
    Qwen3-0.6B (dummy bf16 weights, CUDA graphs): batch-1 TPOT (greedy: torch path; temperature 0.6:
    one-pass kernel) and the nano-vLLM benchmark's throughput, with the run-time checks and without
    them (the greedy path's flag a no-op, its max one reduction as argmax was; the kernel without its
    scan),
    the two interleaved trial by trial in one process.
--smoke (CPU, seconds): both on qwen3_tiny's shape, a handful of tokens; checks the script, times nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import time
from pathlib import Path

import torch
import yaml

QWEN3_TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=1024,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
QWEN3_8B = dict(
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
)


def checkpoint_tensors(shape: dict) -> dict[str, list[int]]:
    h, i, v, d = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"], shape["head_dim"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h], "lm_head.weight": [v, h]}
    for layer in range(shape["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "self_attn.q_proj.weight": [q, h],
            p + "self_attn.k_proj.weight": [kv, h],
            p + "self_attn.v_proj.weight": [kv, h],
            p + "self_attn.o_proj.weight": [h, q],
            p + "self_attn.q_norm.weight": [d],
            p + "self_attn.k_norm.weight": [d],
            p + "mlp.gate_proj.weight": [i, h],
            p + "mlp.up_proj.weight": [i, h],
            p + "mlp.down_proj.weight": [h, i],
            p + "input_layernorm.weight": [h],
            p + "post_attention_layernorm.weight": [h],
        }
    return shapes


def write_sparse_checkpoint(path: Path, shape: dict) -> int:
    """config.json and model.safetensors (header, then a hole of zeros); the file's size in bytes."""
    from transformers import Qwen3Config

    path.mkdir(parents=True, exist_ok=True)
    config = Qwen3Config(**shape, torch_dtype="bfloat16", architectures=["Qwen3ForCausalLM"])
    config.save_pretrained(path)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dims in checkpoint_tensors(shape).items():
        size = 2 * int(torch.tensor(dims).prod())
        header[name] = {"dtype": "BF16", "shape": dims, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    return 8 + len(text) + offset


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def load_cost(directory: Path, repeats: int, smoke: bool) -> None:
    from nanoexp.loader import check_loaded_finite, load_hf_config, load_safetensors
    from nanoexp.models.registry import model_class

    size = write_sparse_checkpoint(directory, QWEN3_TINY if smoke else QWEN3_8B)
    config = load_hf_config(str(directory), None)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = model_class(config)(config, 4096).eval()
    torch.set_default_dtype(torch.float32)
    params = dict(model.named_parameters(remove_duplicate=False))
    sources = {name: [(name, str(directory / "model.safetensors"))] for name in params}
    loads, checks = [], []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        load_safetensors(model, str(directory), check_finite=False)
        sync()
        loads.append(time.perf_counter() - start)
        for _ in range(5):
            start = time.perf_counter()
            check_loaded_finite(params, sources)  # ends with its one host sync
            checks.append(time.perf_counter() - start)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    load_s, check_s = statistics.median(loads), statistics.median(checks)
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"checkpoint {size / 2**30:.2f} GiB, weights on the {where} {weights / 2**30:.2f} GiB")
    print(f"load without the check: {' '.join(f'{t:.2f}' for t in loads)} s (median {load_s:.2f} s)")
    print(f"the check alone: {' '.join(f'{t * 1e3:.1f}' for t in checks)} ms (median {check_s * 1e3:.1f} ms)")
    print(f"check / load: {check_s / load_s:.3%}; the check reads {weights / check_s / 1e9:.0f} GB/s")


def without_checks() -> None:
    """The sampler without the checks: no flag on greedy rows, the kernel without its scan."""
    from nanoexp.kernels import triton_sampler
    from nanoexp.layers import sampler

    sampler.flag_non_finite = lambda row_max, tokens: tokens
    triton_sampler.CHECK_FINITE = False


def with_checks(saved) -> None:
    from nanoexp.kernels import triton_sampler
    from nanoexp.layers import sampler

    sampler.flag_non_finite = saved
    triton_sampler.CHECK_FINITE = True


def step_cost(trials: int, smoke: bool) -> None:
    from nanoexp import LLM, SamplingParams
    from nanoexp.experiment.measure.workloads import nanovllm_bench_prompts
    from nanoexp.layers import sampler

    name, dtype, tokens = ("qwen3_tiny", "float32", 8) if smoke else ("qwen3_0_6b", "bfloat16", 256)
    with open(f"conf/model/{name}.yaml") as f:
        arch = yaml.safe_load(f)["arch"]
    llm = LLM("Qwen/Qwen3-0.6B", hf_config=arch, load_format="dummy", dtype=dtype, use_tqdm=False)
    prompts, max_tokens = nanovllm_bench_prompts()
    if smoke:
        prompts, max_tokens = [[t % 1000 for t in p[:32]] for p in prompts[:4]], [8] * 4
    bench = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for m in max_tokens]
    prompt = [[7] * 128]

    def tpot_ms(temperature: float) -> float:
        params = SamplingParams(temperature=temperature, ignore_eos=True, max_tokens=tokens)
        return llm.generate(prompt, params)[0].tpot * 1e3

    def bench_tok_s() -> float:
        start = time.perf_counter()
        outs = llm.generate(prompts, bench)
        return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)

    saved = sampler.flag_non_finite
    modes = {"with checks": lambda: with_checks(saved), "without": without_checks}
    for apply in modes.values():  # compile every variant before anything is timed
        apply()
        tpot_ms(0.0), tpot_ms(0.6)
    results = {mode: {"greedy": [], "t=0.6": [], "bench": []} for mode in modes}
    for trial in range(trials):
        for mode, apply in modes.items() if trial % 2 == 0 else reversed(modes.items()):
            apply()
            results[mode]["greedy"].append(tpot_ms(0.0))
            results[mode]["t=0.6"].append(tpot_ms(0.6))
            if trial == 0:  # one nano-vLLM benchmark each: ~10 s a run
                results[mode]["bench"].append(bench_tok_s())
    with_checks(saved)
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"{where}; {trials} interleaved trials; medians with [min, max]")
    for key, unit in (("greedy", "ms"), ("t=0.6", "ms"), ("bench", "tok/s")):
        cells = []
        for mode in modes:
            v = results[mode][key]
            cells.append(f"{mode}: {statistics.median(v):.4g} [{min(v):.4g}, {max(v):.4g}] {unit}")
        ratio = statistics.median(results["with checks"][key]) / statistics.median(results["without"][key])
        label = "batch-1 TPOT " + key if key != "bench" else "nanovllm_bench output throughput"
        print(f"{label}: {'; '.join(cells)}; with/without {ratio:.4f}")
    llm.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=("load", "step"))
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "qwen3_8b_zeros")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="qwen3_tiny's shape, a few tokens: CPU, seconds")
    args = parser.parse_args()
    if args.what == "load":
        load_cost(args.dir, args.repeats, args.smoke)
    else:
        step_cost(args.trials, args.smoke)


if __name__ == "__main__":
    main()
