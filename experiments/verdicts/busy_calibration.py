"""How much a neighbour's CPU load slows a job: jobs on qwen3_tiny while a neighbour process burns a
duty cycle of one core; each timed repeat's `other_cpu_cores` (repeats.LoadMeter) against its throughput.

    python experiments/verdicts/busy_calibration.py OUT_DIR [--duties 0,0.1,0.2,0.4,1.0] [--repeats 8]

Prints one line per repeat and, per bin of other_cpu_cores, the median throughput relative to the
quiet repeats; writes OUT_DIR/busy_calibration.csv.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from nanoexp.experiment.runtime import atomic_files

ROOT = Path(__file__).resolve().parents[2]


def burn(duty: float, period_s: float = 0.01) -> None:
    """Busy for `duty` of every period, asleep for the rest (a neighbour using `duty` of one core)."""
    while True:
        end = time.perf_counter() + duty * period_s
        while time.perf_counter() < end:
            pass
        time.sleep((1 - duty) * period_s)


def job(out: Path, repeats: int, requests: int, threads: str | None) -> list[dict]:
    env = dict(os.environ, WANDB_MODE="disabled", HF_HUB_OFFLINE="1")
    if threads:
        env["OMP_NUM_THREADS"] = threads
    overrides = ["model=qwen3_tiny", "logger=none", f"repeats={repeats}", f"workload.num_requests={requests}"]
    subprocess.run(
        [sys.executable, "run.py", *overrides, f"hydra.run.dir={out}"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    return json.loads((out / "results.json").read_text())["summary"]["per_repeat"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--duties", default="0,0.1,0.2,0.4,1.0")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", default=None, help="OMP_NUM_THREADS of the job (default: unset)")
    args = parser.parse_args()
    rows = []
    for round_ in range(args.rounds):
        for duty in [float(d) for d in args.duties.split(",")]:
            neighbour = mp.Process(target=burn, args=(duty,), daemon=True) if duty > 0 else None
            if neighbour:
                neighbour.start()
            try:
                out = args.out / f"r{round_}_duty{duty}"
                for r, rep in enumerate(job(out, args.repeats, args.requests, args.threads)):
                    rows.append({"round": round_, "duty": duty, "repeat": r} | rep)
                    print(
                        f"duty {duty:.1f} r{r}: other {rep['other_cpu_cores']:.2f} cores, "
                        f"{rep['output_throughput']:.0f} tok/s",
                        flush=True,
                    )
            finally:
                if neighbour:
                    neighbour.terminate()
                    neighbour.join()
    table = pd.DataFrame(rows)
    table = table[table["repeat"] > 0]  # repeat 0 follows the warm-up
    atomic_files.write_table(table, args.out / "busy_calibration.csv")
    quiet = table[table["other_cpu_cores"] < 0.05]["output_throughput"].median()
    bins = [0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0]
    table["bin"] = pd.cut(table["other_cpu_cores"], bins, include_lowest=True)
    summary = table.groupby("bin", observed=True)["output_throughput"].agg(["count", "median"])
    summary["relative"] = summary["median"] / quiet
    print(f"quiet median (other < 0.05 cores): {quiet:.0f} tok/s")
    print(summary.to_string())
    print(
        "corr(other_cpu_cores, throughput):",
        np.corrcoef(table["other_cpu_cores"], table["output_throughput"])[0, 1],
    )


if __name__ == "__main__":
    main()
