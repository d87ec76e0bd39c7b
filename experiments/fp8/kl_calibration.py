"""What the GPU fp8 test's KL criterion can tell apart, measured on the CPU: the test's FP8 checkpoint and
prompts, the engine's activation quantization perturbed (a) by relative noise of a given size before
rounding, as a GPU's other summation orders and approximate exp/rsqrt perturb it, and (b) by a systematic
scale error, as a kernel bug would. Prints KL(reference || engine) over KL(reference || unrounded
activations) per case. CPU, float32, ~3 minutes on 2 cores:

    python experiments/fp8/kl_calibration.py
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from fp8_checkpoints import build_fp8_checkpoint, mean_kl, teacher_forced, w8a8_transformers_model  # noqa: E402

import nanoexp.kernels.fp8_reference as fp8_reference  # noqa: E402
from nanoexp import LLM, SamplingParams  # noqa: E402

LENGTHS = [1, 2, 15, 16, 17, 63, 129, 300, 40]  # tests/e2e/test_fp8_gpu.py's
SHAPE = dict(
    hidden_size=256, intermediate_size=320, num_attention_heads=4, num_key_value_heads=2, head_dim=64
)
EXACT = fp8_reference.quantize_activation


def noisy(relative: float):
    def quantize(x, layout, amax=None):
        return EXACT(x * (1 + relative * torch.randn_like(x)), layout, amax)

    return quantize


def last_block_scaled(factor: float):
    def quantize(x, layout, amax=None):
        q, scales = EXACT(x, layout, amax)
        scales = scales.clone()
        scales[:, -1] *= factor
        return q, scales

    return quantize


CASES = {
    "exact (the CPU engine)": EXACT,
    **{f"noise {r:g}": noisy(r) for r in (1e-6, 1e-5, 1e-4, 1e-3)},
    "last K block's scale x1.02": last_block_scaled(1.02),
    "last K block's scale x1.1": last_block_scaled(1.1),
}


def main() -> None:
    torch.manual_seed(0)
    path = build_fp8_checkpoint(tempfile.mkdtemp(), shape=SHAPE)
    rng = random.Random(0)
    prompts = [[rng.randrange(150) for _ in range(n)] for n in LENGTHS]
    reference = w8a8_transformers_model(path)
    unrounded = w8a8_transformers_model(path, quantize_activations=False)
    print("| engine's activation quantization | KL(ref \\|\\| engine) | KL(ref \\|\\| unrounded) | ratio |")
    print("|---|---:|---:|---:|")
    for name, quantize in CASES.items():
        fp8_reference.quantize_activation = quantize
        try:
            with LLM(path, kv_block_size=16, max_model_len=1024, max_num_seqs=16, dtype="float32") as llm:
                params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
                tokens = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
                ours = [torch.from_numpy(x).float() for x in llm.prefill_log_probs(prompts, tokens)]
        finally:
            fp8_reference.quantize_activation = EXACT
        kl, rounding = kl_pair(reference, unrounded, prompts, tokens, ours)
        print(f"| {name} | {kl:.2e} | {rounding:.2e} | {kl / rounding:.3f} |", flush=True)


def kl_pair(reference, unrounded, prompts, tokens, ours) -> tuple[float, float]:
    kl = mean_kl(reference, prompts, tokens, lambda i: ours[i])
    rounding = mean_kl(reference, prompts, tokens, lambda i: teacher_forced(unrounded, prompts[i], tokens[i]))
    return kl, rounding


if __name__ == "__main__":
    main()
