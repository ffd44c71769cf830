"""The suite's own time report (tests/timing.py): it records where a run's time went, across
xdist workers, and the scheduler gives the longest files out first by the last measured times."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import timing

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import test_times  # noqa: E402  (scripts/ is not a package)

SLOW_FIXTURE_FILE = """
import time
import pytest

@pytest.fixture(scope="module")
def built_once():
    time.sleep(0.4)
    return 1

def test_one(built_once):
    assert built_once

def test_two(built_once):
    time.sleep(0.2)
    assert built_once
"""


def test_a_run_under_two_workers_reports_each_test_fixture_and_worker(tmp_path):
    (tmp_path / "test_a.py").write_text(SLOW_FIXTURE_FILE)
    (tmp_path / "test_b.py").write_text("def test_quick():\n    assert True\n")
    report = tmp_path / "times.json"
    env = {
        **os.environ,
        "SPARKML_DIST_TEST_TIMES": str(report),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "timing",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[test-times] 3 tests" in done.stdout
    times = json.loads(report.read_text())
    assert times["tests"] == 3 and set(times["workers_s"]) == {"gw0", "gw1"}
    # the machine's CPU share over the run: whether more workers could have helped
    assert times["cpus"] == os.cpu_count() and 0.0 < times["cpu_busy"] <= 1.0
    assert f"CPU {times['cpu_busy']:.0%} busy on {os.cpu_count()} cores" in done.stdout
    assert times["fixtures_s"]["built_once (module)"]["count"] == 1, "a module fixture is built once"
    assert times["fixtures_s"]["built_once (module)"]["total"] >= 0.4
    slowest = next(iter(times["files_s"]))
    assert slowest.endswith("test_a.py") and times["files_s"][slowest] >= 0.6
    first = next(t for t in times["per_test"] if t["nodeid"].endswith("test_one"))
    assert first["setup_s"] >= 0.4 and "built_once (module)" in first["fixtures"]

    # the README's command keeps it: per-file times for the scheduler and the README's table
    clone = tmp_path / "clone"
    for name in ("scripts/test_times.py", "README.md", "tests/file_times.json"):
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, clone / name)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    (clone / "output").mkdir()
    shutil.copy(report, clone / "output" / "test_times.json")
    command = ".venv/bin/python scripts/test_times.py"
    assert command in (ROOT / "README.md").read_text()
    refused = subprocess.run(command, shell=True, cwd=clone, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "a partial run" in refused.stderr, (
        "3 tests do not replace the suite's times"
    )
    (clone / "tests" / "file_times.json").unlink()  # as before the first full run
    done = subprocess.run(command, shell=True, cwd=clone, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    kept = json.loads((clone / "tests" / "file_times.json").read_text())
    assert next(iter(kept["files_s"])) == "test_a.py" and kept["tests"] == 3
    readme = (clone / "README.md").read_text()
    assert "| `tests/test_a.py` |" in readme and "| `built_once (module)` | 1 |" in readme
    assert "on 2 workers" in readme and f"cores were {times['cpu_busy']:.0%} busy" in readme
    assert subprocess.run(f"{command} --check", shell=True, cwd=clone).returncode == 0


def test_the_longest_files_go_first_and_each_file_keeps_its_order():
    items = [
        SimpleNamespace(path=Path(f"/t/{name}"), name=f"{name}:{i}")
        for name, count in (("test_a.py", 2), ("test_b.py", 2), ("test_new.py", 1), ("test_c.py", 1))
        for i in range(count)
    ]
    ordered = timing.file_order(items, {"test_a.py": 5.0, "test_b.py": 50.0, "test_c.py": 20.0})
    assert [i.name for i in ordered] == [
        "test_b.py:0",
        "test_b.py:1",
        "test_new.py:0",
        "test_c.py:0",
        "test_a.py:0",
        "test_a.py:1",
    ], "an unmeasured file counts as the median"


def test_the_readmes_table_is_the_kept_times():
    assert test_times.main(["--check"]) == 0, "run scripts/test_times.py after a full `make test`"
    kept = json.loads(test_times.KEPT.read_text())
    files = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert set(kept["files_s"]) <= files, f"kept times of files that are gone: {set(kept['files_s']) - files}"
