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


def qwen3_8b_tensors() -> dict[str, list[int]]:
    h, i, v, d = QWEN3_8B["hidden_size"], QWEN3_8B["intermediate_size"], QWEN3_8B["vocab_size"], 128
    q, kv = QWEN3_8B["num_attention_heads"] * d, QWEN3_8B["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h], "lm_head.weight": [v, h]}
    for layer in range(QWEN3_8B["num_hidden_layers"]):
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


def write_sparse_checkpoint(path: Path) -> int:
    """config.json and model.safetensors (header, then a hole of zeros); the file's size in bytes."""
    from transformers import Qwen3Config

    path.mkdir(parents=True, exist_ok=True)
    config = Qwen3Config(**QWEN3_8B, torch_dtype="bfloat16", architectures=["Qwen3ForCausalLM"])
    config.save_pretrained(path)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in qwen3_8b_tensors().items():
        size = 2 * int(torch.tensor(shape).prod())
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    return 8 + len(text) + offset


def load_cost(directory: Path, repeats: int) -> None:
    from nanoexp.loader import check_loaded_finite, load_hf_config, load_safetensors
    from nanoexp.models.registry import model_class

    size = write_sparse_checkpoint(directory)
    config = load_hf_config(str(directory), None)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = model_class(config)(config, 4096).eval()
    torch.set_default_dtype(torch.float32)
    params = dict(model.named_parameters(remove_duplicate=False))
    sources = {name: [(name, str(directory / "model.safetensors"))] for name in params}
    loads, checks = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        load_safetensors(model, str(directory), check_finite=False)
        torch.cuda.synchronize()
        loads.append(time.perf_counter() - start)
        for _ in range(5):
            start = time.perf_counter()
            check_loaded_finite(params, sources)  # ends with its one host sync
            checks.append(time.perf_counter() - start)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    load_s, check_s = statistics.median(loads), statistics.median(checks)
    print(f"checkpoint {size / 2**30:.2f} GiB, weights on the GPU {weights / 2**30:.2f} GiB")
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


def step_cost(trials: int) -> None:
    from nanoexp import LLM, SamplingParams
    from nanoexp.experiment.measure.workloads import nanovllm_bench_prompts
    from nanoexp.layers import sampler

    arch = yaml.safe_load(open("conf/model/qwen3_0_6b.yaml"))["arch"]
    llm = LLM("Qwen/Qwen3-0.6B", hf_config=arch, load_format="dummy", dtype="bfloat16", use_tqdm=False)
    prompts, max_tokens = nanovllm_bench_prompts()
    bench = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for m in max_tokens]
    prompt = [[7] * 128]

    def tpot_ms(temperature: float) -> float:
        params = SamplingParams(temperature=temperature, ignore_eos=True, max_tokens=256)
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
    print(f"{torch.cuda.get_device_name()}; {trials} interleaved trials; medians with [min, max]")
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
    args = parser.parse_args()
    load_cost(args.dir, args.repeats) if args.what == "load" else step_cost(args.trials)


if __name__ == "__main__":
    main()
