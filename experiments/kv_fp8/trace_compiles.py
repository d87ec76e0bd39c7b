"""Runs `run.py` with its arguments and prints, in one timeline, each engine step (index, kind,
sequences, milliseconds), each Triton kernel compile or torch.compile recompile and each full
garbage collection, so that a step made slow by one of them shows up beside it.

    python experiments/kv_fp8/trace_compiles.py [--no-freeze] model=qwen3_tiny_trained ... > trace.log

--no-freeze: the engine does not freeze its start-up objects (gc.freeze becomes a no-op), for an A/B.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
import time

import torch
import triton

from nanoexp.engine.llm_engine import LLMEngine

START = time.perf_counter()
steps = 0
collection_start = 0.0


def stamp() -> str:
    return f"[{time.perf_counter() - START:9.3f} s]"


def on_triton_compile(*, repr: str, **_) -> None:  # noqa: A002  (Triton's keyword)
    print(f"{stamp()} triton compile after step {steps}: {repr[:240]}", flush=True)


def on_gc(phase: str, info: dict) -> None:
    global collection_start
    if info["generation"] != 2:
        return
    if phase == "start":
        collection_start = time.perf_counter()
        return
    ms = (time.perf_counter() - collection_start) * 1e3
    print(f"{stamp()} full garbage collection after step {steps}: {ms:.1f} ms", flush=True)


def traced_step(step):
    def wrapper(self):
        global steps
        start = time.perf_counter()
        outputs, stats = step(self)
        ms = (time.perf_counter() - start) * 1e3
        print(f"{stamp()} step {steps} {stats.phase} seqs {stats.num_seqs} {ms:.2f} ms", flush=True)
        steps += 1
        return outputs, stats

    return wrapper


def main() -> None:
    triton.knobs.runtime.jit_post_compile_hook = on_triton_compile
    torch._logging.set_logs(recompiles=True)
    gc.callbacks.append(on_gc)
    LLMEngine.step = traced_step(LLMEngine.step)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = sys.argv[1:]
    if {"-h", "--help"} & set(args):
        print(__doc__)  # then run.py's own help
    if "--no-freeze" in args:
        args.remove("--no-freeze")
        gc.freeze = lambda: None
    sys.argv = [os.path.join(root, "run.py"), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
