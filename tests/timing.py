"""Where the suite's time goes: a pytest plugin that records every test's set-up, call and
tear-down, every fixture's set-up, and each xdist worker's share, then writes them to
`output/test_times.json` and prints one summary line (the CI log's record of the run).

`scripts/test_times.py` turns a full run's report into the per-file times the scheduler orders
files by (`tests/file_times.json`) and into the README's table.

Fixture set-ups are timed on the worker that runs them and travel to the controller in the test
report's `user_properties`, the one field xdist carries back unchanged.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "output" / "test_times.json"
FILE_TIMES = Path(__file__).resolve().parent / "file_times.json"
FIXTURE_TAG = "fixture-setup-s"


@dataclass
class TestTime:
    nodeid: str
    worker: str
    setup_s: float = 0.0
    call_s: float = 0.0
    teardown_s: float = 0.0
    outcome: str = "passed"
    fixtures: dict[str, float] = field(default_factory=dict)

    @property
    def file(self) -> str:
        return self.nodeid.split("::", 1)[0]

    @property
    def total_s(self) -> float:
        return self.setup_s + self.call_s + self.teardown_s


# ---- worker side: time each fixture's set-up and attach it to the test that caused it ----------

_running: list[pytest.Item] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    start = time.perf_counter()
    yield
    if _running:
        name = f"{fixturedef.argname} ({fixturedef.scope})"
        _running[-1].user_properties.append((FIXTURE_TAG, name, round(time.perf_counter() - start, 3)))


# ---- controller side (or the only process without xdist): gather the reports -------------------


def cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of every core since boot: what the suite's processes (and anything
    beside them) ran, and all there was."""
    import psutil

    from sparkml_dist.observe.system import busy_seconds

    times = psutil.cpu_times()
    busy = busy_seconds(times)
    return busy, busy + times.idle + getattr(times, "iowait", 0.0)


def busy_fraction(start: tuple[float, float], end: tuple[float, float]) -> float | None:
    """The share of the machine's CPU time that was busy between two `cpu_seconds` readings (within
    [0, 1], which float rounding of the sums could overstep): near 1.0, the suite is bound by the
    cores, and more xdist workers cannot make it faster."""
    if end[1] <= start[1]:
        return None
    return min(1.0, max(0.0, (end[0] - start[0]) / (end[1] - start[1])))


class TimingReport:
    def __init__(self) -> None:
        self.tests: dict[str, TestTime] = {}
        self.started = time.time()
        self.cpu_at_start = cpu_seconds()

    def pytest_runtest_logreport(self, report) -> None:
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main")
        test = self.tests.setdefault(report.nodeid, TestTime(report.nodeid, worker))
        setattr(test, f"{report.when}_s", round(report.duration, 3))
        if report.outcome != "passed":
            test.outcome = report.outcome
        for tag, name, seconds in report.user_properties:
            if tag == FIXTURE_TAG:
                test.fixtures[name] = seconds

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.tests:
            return
        summary = self.summary()
        out = Path(os.environ.get("SPARKML_DIST_TEST_TIMES", REPORT))
        write_report(summary, out)
        slowest = ", ".join(f"{Path(f).name} {s:.0f}s" for f, s in list(summary["files_s"].items())[:5])
        workers = ", ".join(f"{w} {s:.0f}s" for w, s in summary["workers_s"].items())
        busy = summary["cpu_busy"]
        cpu = f", CPU {busy:.0%} busy on {summary['cpus']} cores" if busy is not None else ""
        terminalreporter.write_line(
            f"[test-times] {summary['tests']} tests, {summary['wall_s']:.0f}s wall{cpu}, {summary['test_s']:.0f}s of "
            f"test time (workers: {workers}); slowest files: {slowest}; report: {out}"
        )

    def summary(self) -> dict:
        files: dict[str, float] = defaultdict(float)
        workers: dict[str, float] = defaultdict(float)
        fixtures: dict[str, list[float]] = defaultdict(list)
        for test in self.tests.values():
            files[test.file] += test.total_s
            workers[test.worker] += test.total_s
            for name, seconds in test.fixtures.items():
                fixtures[name].append(seconds)
        return {
            "date": time.strftime("%Y-%m-%d"),
            "wall_s": round(time.time() - self.started, 1),
            "cpus": os.cpu_count(),
            "cpu_busy": _rounded(busy_fraction(self.cpu_at_start, cpu_seconds())),
            "tests": len(self.tests),
            "test_s": round(sum(t.total_s for t in self.tests.values()), 1),
            "workers_s": {w: round(s, 1) for w, s in sorted(workers.items())},
            "files_s": {f: round(s, 1) for f, s in sorted(files.items(), key=lambda kv: -kv[1])},
            "fixtures_s": {
                n: {"count": len(v), "total": round(sum(v), 1)}
                for n, v in sorted(fixtures.items(), key=lambda kv: -sum(kv[1]))
                if sum(v) >= 0.1
            },
            "per_test": [asdict(t) for t in sorted(self.tests.values(), key=lambda t: -t.total_s)],
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller, or the only process without xdist
        config.pluginmanager.register(TimingReport(), "sparkml-dist-test-times")


def write_report(summary: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, out)


# ---- scheduling: the longest files first, by the last measured times ----------------------------


def file_order(items: list[pytest.Item], times: dict[str, float] | None = None) -> list[pytest.Item]:
    """Items sorted so whole files run longest first (each file's own order kept): with
    `--dist loadfile --no-loadscope-reorder` each idle worker takes the next file, which is the
    longest-processing-time-first rule, so no worker is left alone with a long file at the end.
    A file with no measured time yet counts as the median file."""
    times = load_file_times() if times is None else times
    default = sorted(times.values())[len(times) // 2] if times else 0.0

    def seconds(item):
        return times.get(Path(item.path).name, default)

    return sorted(items, key=lambda item: -seconds(item))  # stable: each file's own order kept


def load_file_times() -> dict[str, float]:
    """Seconds per test file's name, as scripts/test_times.py kept them from the last full run."""
    return json.loads(FILE_TIMES.read_text())["files_s"] if FILE_TIMES.exists() else {}
