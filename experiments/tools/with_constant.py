"""Run a Python command line with module constants patched in-process first: an A/B of one kernel choice on
the same tree, in one GPU call, without a knob in the product.

    python experiments/tools/with_constant.py 'nanoexp.kernels.fp8_cublas:WIDE_ONE_ROW=False' -- \
        run.py -m model=qwen3_8b model.quantization=fp8 ...
    python experiments/tools/with_constant.py 'nanoexp.kernels.fp8_cublas:MIN_ROWS=1' -- -m pytest -m gpu ...

Each patch is MODULE:NAME=EXPRESSION, the expression evaluated in the module's namespace (so it may name the
module's classes); the module must already define NAME. After `--`: a script and its arguments, or `-m` and
a module. Engines read these constants when they are built or called, so the patch holds for the whole run."""

from __future__ import annotations

import importlib
import runpy
import sys


def patch(spec: str) -> None:
    target, expression = spec.split("=", 1)
    module_name, name = target.split(":")
    module = importlib.import_module(module_name)
    if not hasattr(module, name):
        raise SystemExit(f"with_constant: {module_name} has no {name}")
    setattr(module, name, eval(expression, vars(module)))  # noqa: S307 - the caller's own expression
    print(f"with_constant: {module_name}.{name} = {getattr(module, name)!r}", flush=True)


def main(argv: list[str]) -> None:
    if "--" not in argv:
        raise SystemExit(__doc__)
    split = argv.index("--")
    for spec in argv[:split]:
        patch(spec)
    command = argv[split + 1 :]
    if command[:1] == ["-m"]:
        sys.argv = command[1:]
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = command
        runpy.run_path(command[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
