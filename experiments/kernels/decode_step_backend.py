"""experiments/nanovllm_bench/decode_step.py's decode-step table on one given attention backend.

decode_step.py builds its engine with attention_backend=auto; this narrows auto's CUDA candidates to
the one backend (still self-checked) and stops if auto would fall back to another.

    python experiments/kernels/decode_step_backend.py flash_attn --out decode_step_flash_attn.md
"""

from __future__ import annotations

import runpy
import sys

from nanoexp.kernels import select

backend_name = sys.argv.pop(1)
select.AUTO_CUDA_ORDER = (backend_name,)
choose_auto = select.choose_auto


def choose_only_the_named_backend(*args):
    backend = choose_auto(*args)
    print(f"attention backend: {backend.name} ({backend.selection})", flush=True)
    if backend.name != backend_name:
        raise SystemExit(f"{backend_name} was not usable here: {backend.selection}")
    return backend


select.choose_auto = choose_only_the_named_backend
sys.path.insert(0, "experiments/nanovllm_bench")  # decode_step.py imports its sibling cuda_timing
runpy.run_path("experiments/nanovllm_bench/decode_step.py", run_name="__main__")
