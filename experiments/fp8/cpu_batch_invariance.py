"""How far the CPU engine's fp8 log-probs sit from the W8A8 reference's on the tiny MoE test checkpoint
(tests/fp8_checkpoints.py): teacher-forced on the reference's greedy tokens, per prompt, the largest
|log-prob difference| over the vocabulary at each position, and the reference's top-2 gap beside it.

    python experiments/fp8/cpu_batch_invariance.py   # ~20 s on 2 cores
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests")]

from fp8_checkpoints import (  # noqa: E402
    GREEDY,
    MAX_TOKENS,
    PROMPTS,
    build_fp8_moe_checkpoint,
    greedy_reference,
    teacher_forced,
    w8a8_transformers_model,
)

from nanoexp import LLM  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        path = build_fp8_moe_checkpoint(Path(root) / "fp8")
        oracle = w8a8_transformers_model(path)
        reference = greedy_reference(oracle, PROMPTS, MAX_TOKENS)
        with LLM(path, device="cpu", dtype="float32", max_num_seqs=4, enable_prefix_caching=False) as llm:
            ours = [torch.from_numpy(x).float() for x in llm.prefill_log_probs(PROMPTS, reference)]
            tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    worst = 0.0
    for i, (prompt, want_tokens) in enumerate(zip(PROMPTS, reference, strict=True)):
        want = teacher_forced(oracle, prompt, want_tokens)
        diff = (want - ours[i]).abs().amax(-1)
        top2 = want.topk(2, -1).values
        worst = max(worst, float(diff.max()))
        print(
            f"prompt {i}: max |dlogp| {float(diff.max()):.2e}, smallest top-2 gap "
            f"{float((top2[:, 0] - top2[:, 1]).min()):.3f}, greedy equal: {tokens[i] == want_tokens}"
        )
    print(f"largest |dlogp| over {len(PROMPTS) * MAX_TOKENS} positions: {worst:.2e}")


if __name__ == "__main__":
    main()
