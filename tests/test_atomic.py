"""Outputs are committed atomically: a failed write leaves the previous good output readable."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sparkml_dist.errors import OutputInUseError
from sparkml_dist.storage.hadoop import HadoopFS, Writer, _process_start, atomic_dir, recover

pytestmark = pytest.mark.spark


def write_rows(spark, path, n):
    spark.range(n).write.mode("overwrite").parquet(path)


def test_failed_write_keeps_the_previous_output_and_rerun_replaces_it(spark, tmp_path):
    final = str(tmp_path / "predictions")
    with atomic_dir(spark, final) as staging:
        write_rows(spark, f"{staging}/scored", 10)
    with pytest.raises(RuntimeError, match="killed mid-write"), atomic_dir(spark, final) as staging:
        write_rows(spark, f"{staging}/scored", 99)
        raise RuntimeError("killed mid-write")
    assert spark.read.parquet(f"{final}/scored").count() == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions"], "no staging leftovers"
    with atomic_dir(spark, final) as staging:
        write_rows(spark, f"{staging}/scored", 5)
    assert spark.read.parquet(f"{final}/scored").count() == 5, "a re-run replaces, never appends"


def test_crash_between_the_two_renames_is_recovered(spark, tmp_path):
    final = tmp_path / "out"
    backup = tmp_path / "out.old-deadbeef"
    write_rows(spark, str(backup / "scored"), 7)  # state after rename #1, before rename #2
    (tmp_path / "out.staging-cafebabe").mkdir()
    recover(HadoopFS(spark), str(final))
    assert spark.read.parquet(str(final / "scored")).count() == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


KILLED_WRITER = r"""
import os, signal, sys
from sparkml_dist.config import SparkConfig
from sparkml_dist.storage.hadoop import atomic_dir
from sparkml_dist.spark import build_session

spark = build_session(SparkConfig(master="local[1]"))
final = sys.argv[1]
with atomic_dir(spark, final) as staging:
    spark.range(10).write.parquet(staging + "/scored")
with atomic_dir(spark, final) as staging:
    spark.range(99).write.parquet(staging + "/scored")
    os.kill(os.getpid(), signal.SIGKILL)  # the job dies mid-write, before the commit
"""


def test_a_job_killed_mid_write_leaves_the_previous_output_readable(spark, tmp_path):
    final = tmp_path / "predictions"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(final)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -9
    assert spark.read.parquet(str(final / "scored")).count() == 10
    # the next run cleans the dead run's staging directory and replaces the output
    with atomic_dir(spark, str(final)) as staging:
        write_rows(spark, f"{staging}/scored", 3)
    assert spark.read.parquet(str(final / "scored")).count() == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions"]


def test_a_second_writer_of_one_output_is_refused_and_the_first_one_commits(spark, tmp_path):
    final = str(tmp_path / "predictions")
    with atomic_dir(spark, final) as first:
        write_rows(spark, f"{first}/scored", 10)
        refused = rf"being written by another job \(pid {os.getpid()} on host {socket.gethostname()}.*delete .*predictions.lock"
        with pytest.raises(OutputInUseError, match=refused), atomic_dir(spark, final):
            pass
        assert Path(first.removeprefix("file:")).is_dir(), (
            "the refused writer left the first one's staging alone"
        )
    assert spark.read.parquet(f"{final}/scored").count() == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions"], "the lock is released"


def test_the_lock_of_a_live_process_holds_and_a_dead_ones_is_taken_over(spark, tmp_path):
    final = tmp_path / "out"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        owner = Writer(socket.gethostname(), other.pid, _process_start(other.pid), "2026-01-01T00:00:00")
        (tmp_path / "out.lock").write_text(json.dumps(owner.__dict__))
        with pytest.raises(OutputInUseError, match=rf"pid {other.pid}"), atomic_dir(spark, str(final)):
            pass
    finally:
        other.kill()
        other.wait()
    with atomic_dir(spark, str(final)) as staging:  # its writer died: the re-run takes over
        write_rows(spark, f"{staging}/scored", 4)
    assert spark.read.parquet(str(final / "scored")).count() == 4
    assert not (tmp_path / "out.lock").exists()
