"""Tables and a plot of the TP scaling runs, from every results.json under a directory.

    python experiments/tp_scaling/report.py OUT_DIR [--md tp_scaling.md] [--png tp_scaling.png]

Throughput rows come from workload=nanovllm_bench jobs, decode latency rows from workload=latency
jobs (TPOT: time per output token after the first, i.e. one decode step at that batch size),
launcher rows from jobs run with launch.gpus_per_job > 0. Cells with no job read "not run".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nanoexp.experiment.runtime import atomic_files

MODELS = ["qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b"]
TPS = [1, 2, 4, 8]
NOT_RUN = "not run"


def load_rows(root: Path) -> list[dict]:
    """One flat row per job: what was run, where, and the numbers this study reads."""
    return [row_of(json.loads(p.read_text()), p.parent) for p in sorted(root.rglob("results.json"))]


def row_of(results: dict, job_dir: Path) -> dict:
    config, summary = results.get("config", {}), results.get("summary", {})
    workload = config.get("workload", {})
    resolved = config.get("resolved", {})
    return {
        "dir": str(job_dir),
        "job_num": results.get("job", {}).get("job_num"),
        "device": summary.get("device"),
        "status": results.get("status", "failed"),
        "error": summary.get("error", ""),
        "model": config.get("model", {}).get("name", summary.get("model")),
        "tp": config.get("parallel", {}).get("tensor_parallel_size"),
        "workload": workload.get("name", summary.get("workload")),
        "batch_size": workload.get("batch_size"),
        "gpus_per_job": config.get("launch", {}).get("gpus_per_job", 0),
        "cuda_visible_devices": resolved.get("cuda_visible_devices"),
        "claimed_at": resolved.get("gpus_claimed_at"),
        "finished_at": results.get("finished_at") or (job_dir / "results.json").stat().st_mtime,
        "output_throughput": summary.get("output_throughput"),
        "median_tpot_ms": summary.get("median_tpot_ms"),
        "mean_latency_ms": summary.get("mean_latency_ms"),
    }


def lookup(rows: list[dict], value: str, **where) -> float | str:
    """The value of the last ok job matching `where`; the error of a failed one; else NOT_RUN."""
    hits = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    ok = [r for r in hits if r["status"] == "ok" and r[value] is not None]
    if ok:
        return ok[-1][value]
    return f"failed: {hits[-1]['error'][:60]}" if hits else NOT_RUN


def cell(value: float | str, base: float | str | None = None, digits: int = 0) -> str:
    if isinstance(value, str):
        return value
    text = f"{value:,.{digits}f}"
    if isinstance(base, int | float) and base:
        text += f" ({value / base:.2f}x)"
    return text


def throughput(rows: list[dict], model: str, tp: int) -> float | str:
    return lookup(rows, "output_throughput", model=model, tp=tp, workload="nanovllm_bench")


def tpot(rows: list[dict], model: str, tp: int, batch: int) -> float | str:
    return lookup(rows, "median_tpot_ms", model=model, tp=tp, workload="latency", batch_size=batch)


def header(columns: list[str]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]


def throughput_table(rows: list[dict], models: list[str], tps: list[int]) -> str:
    lines = header(["model"] + [f"TP={tp}" for tp in tps])
    for model in models:
        base = throughput(rows, model, 1)
        cells = [cell(throughput(rows, model, tp), base) for tp in tps]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def latency_table(rows: list[dict], models: list[str], tps: list[int], batches: tuple = (1, 64)) -> str:
    lines = header(["model", "batch"] + [f"TP={tp}" for tp in tps])
    for model in models:
        for batch in batches:
            cells = [cell(tpot(rows, model, tp, batch), digits=2) for tp in tps]
            lines.append(f"| {model} | {batch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def launcher_table(rows: list[dict]) -> str:
    jobs = [r for r in rows if r["gpus_per_job"]]
    if not jobs:
        return NOT_RUN
    lines = header(["job", "TP", "device", "CUDA_VISIBLE_DEVICES", "status"])
    for r in jobs:
        cells = [r["job_num"], r["tp"], r["device"], r["cuda_visible_devices"], r["status"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines + ["", f"GPUs held by two jobs at once: {'; '.join(collisions(jobs)) or 'none'}"])


def collisions(jobs: list[dict]) -> list[str]:
    """Pairs of CUDA jobs that held a GPU in common at the same time (claim to results.json)."""
    found = []
    for i, a in enumerate(jobs):
        for b in jobs[i + 1 :]:
            shared = sorted(set(gpus_of(a)) & set(gpus_of(b)))
            if shared and overlap(a, b):
                found.append(f"GPU {','.join(shared)}: jobs {a['job_num']} and {b['job_num']}")
    return found


def gpus_of(row: dict) -> list[str]:
    return [g for g in (row["cuda_visible_devices"] or "").split(",") if g] if row["device"] == "cuda" else []


def overlap(a: dict, b: dict) -> bool:
    start_a, start_b = a["claimed_at"] or 0.0, b["claimed_at"] or 0.0
    return start_a < b["finished_at"] and start_b < a["finished_at"]


def markdown(rows: list[dict], models: list[str], tps: list[int]) -> str:
    parts = [
        "## Output throughput, nanovllm_bench (tok/s, speedup over TP=1)",
        throughput_table(rows, models, tps),
        "## Decode step (median TPOT, ms), workload=latency",
        latency_table(rows, models, tps),
        "## local_gpus launcher: GPUs per job",
        launcher_table(rows),
    ]
    return "\n\n".join(parts) + "\n"


def plot(rows: list[dict], models: list[str], tps: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for model in models:
        thr = numeric([(tp, throughput(rows, model, tp)) for tp in tps])
        if thr:
            left.plot(*zip(*thr), marker="o", label=model)
        for batch, style in ((1, "--"), (64, "-")):
            lat = numeric([(tp, tpot(rows, model, tp, batch)) for tp in tps])
            if lat:
                right.plot(*zip(*lat), style, marker="o", label=f"{model} bs={batch}")
    for ax, ylabel in ((left, "output tok/s (nanovllm_bench)"), (right, "decode step, median TPOT (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(tps, [str(tp) for tp in tps])
        ax.set_xlabel("tensor parallel size")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_files.save_figure(fig, path, dpi=120)
    plt.close(fig)


def numeric(pairs: list[tuple]) -> list[tuple]:
    return [(x, y) for x, y in pairs if not isinstance(y, str)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path, help="searched recursively for results.json")
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--tps", nargs="+", type=int, default=TPS)
    parser.add_argument("--md", type=Path, default=None, help="default: ROOT/tp_scaling.md")
    parser.add_argument("--png", type=Path, default=None, help="default: ROOT/tp_scaling.png")
    args = parser.parse_args()
    rows = load_rows(args.root)
    text = markdown(rows, args.models, args.tps)
    atomic_files.write_atomically(args.md or args.root / "tp_scaling.md", text)
    plot(rows, args.models, args.tps, args.png or args.root / "tp_scaling.png")
    print(text)


if __name__ == "__main__":
    main()
