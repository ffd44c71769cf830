"""Shared benchmark plumbing: alternate ours and the baseline, take medians, record ratios.

Absolute times on a shared machine are noise; ratios of runs interleaved in one process are not.
Each result is {"name", "ours", "baseline", "unit", "ratio", "better", "target", "met"} in
bench/results.json (ratio = ours / baseline), and for alternated rows `ours_runs` and
`baseline_runs`: the min, median and max of the rounds.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results.json"


class Measured(float):
    """A median that remembers the runs it is the median of (`entry` records their spread)."""

    runs: tuple[float, ...]

    def __new__(cls, runs: list[float]) -> Measured:
        value = super().__new__(cls, statistics.median(runs))
        value.runs = tuple(runs)
        return value


def alternate(
    ours: Callable[[], float], baseline: Callable[[], float], rounds: int = 3, warm_up: bool = False
) -> tuple[Measured, Measured]:
    """Run baseline and ours alternately `rounds` times; return (median ours, median baseline).
    `warm_up`: each side runs once first, unrecorded (a Python worker's first task, a model's
    first load: one-off costs that a second-long measurement would otherwise count once)."""
    if warm_up:
        baseline(), ours()
    a, b = [], []
    for i in range(rounds):
        if i % 2 == 0:
            b.append(baseline())
            a.append(ours())
        else:
            a.append(ours())
            b.append(baseline())
    return Measured(a), Measured(b)


def in_turn(items: list, round_index: int) -> list:
    """A round's order of several measurements taken in turn: as listed in even rounds, reversed in
    odd ones (the machine drifts between rounds; no measurement always goes first)."""
    return items if round_index % 2 == 0 else items[::-1]


def spread(value: float) -> dict[str, float] | None:
    """min, median and max of a `Measured` value's runs (None for a single figure or round)."""
    runs = getattr(value, "runs", None)
    if len(runs or ()) < 2:  # no runs, or one round: no spread
        return None
    return {
        "min": round(min(runs), 4),
        "median": round(float(value), 4),
        "max": round(max(runs), 4),
        "rounds": len(runs),
    }


def entry(
    name: str, ours: float, baseline: float, unit: str, better: str, target: float | None, note: str = ""
) -> dict:
    """`target=None`: a figure reported for the record, with nothing to meet."""
    ratio = ours / baseline if baseline else float("nan")
    met = None if target is None else (ratio >= target if better == "higher" else ratio <= target)
    row = {
        "name": name,
        "ours": round(ours, 4),
        "baseline": round(baseline, 4),
        "unit": unit,
        "ratio": round(ratio, 4),
        "better": better,
        "target": target,
        "met": met,
        "rounds": max(len(getattr(value, "runs", None) or ()) for value in (ours, baseline)) or 1,
    }
    for side, value in (("ours_runs", ours), ("baseline_runs", baseline)):
        if spread(value) is not None:
            row[side] = spread(value)
    if note:
        row["note"] = note
    mark = "info" if met is None else "ok " if met else "MISS"
    goal = "report" if target is None else f"target {'>=' if better == 'higher' else '<='} {target}"
    print(
        f"[{mark}] {name:34s} ours {ours:12.2f} {unit:10s} baseline {baseline:12.2f}  ratio {ratio:6.3f} "
        f"({goal})",
        flush=True,
    )
    return row


def record(rows: list[dict]) -> Path:
    """Merge rows into bench/results.json by name, atomically."""
    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"results": []}
    by_name = {r["name"]: r for r in existing.get("results", [])}
    stamp = {"measured": time.strftime("%Y-%m-%d", time.gmtime()), "commit": _commit()}
    by_name.update({r["name"]: {**r, **stamp} for r in rows})
    doc = {"machine": machine(), "results": sorted(by_name.values(), key=lambda r: r["name"])}
    fd, tmp = tempfile.mkstemp(dir=RESULTS.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=2)
    os.replace(tmp, RESULTS)
    return RESULTS


def _commit() -> str:
    """The checkout's commit, `+changes` when files differ from it: which code a row measured."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        )
    except OSError:  # no git: a copied tree
        return "unknown"
    return (
        head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
        if head.returncode == 0
        else "unknown"
    )


def machine() -> dict:
    import torch

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def unused_port() -> int:
    """A free TCP port on 127.0.0.1 (for a server a benchmark starts and stops itself)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cold_figures(module: str, kind: str, epochs: int, rows: int) -> dict[str, float]:
    """Run `python -m <module> --cold <kind>` (one job in a fresh process, with a Spark session
    of its own) and read the figures it prints on its `WALL ...` line: `KEY value` pairs."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", module, "--cold", kind, "--epochs", str(epochs), "--rows", str(rows)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=Path(__file__).resolve().parents[1],
    )
    lines = [line.split() for line in done.stdout.splitlines() if line.startswith("WALL ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{module} --cold {kind} failed: {done.stderr[-3000:]}")
    return {key: float(value) for key, value in zip(lines[0][::2], lines[0][1::2])}


def make_bench_importable() -> None:
    """Spark workers and TorchDistributor's torchrun children import `bench.*` by name: put the
    repository root on PYTHONPATH before the first Spark session starts its Python daemon."""
    root = str(Path(__file__).resolve().parents[1])
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, *paths) if p)


@functools.lru_cache(maxsize=1)
def _scratch_root() -> str:
    root = tempfile.mkdtemp(prefix="sparkml_dist_bench_")
    atexit.register(shutil.rmtree, root, True)
    return root


def scratch_dir() -> str:
    """A fresh folder for one measurement's checkpoints, removed when this process exits: a
    benchmark writes tens of MiB of checkpoints per run, and `make bench` starts dozens of runs."""
    return tempfile.mkdtemp(dir=_scratch_root())
