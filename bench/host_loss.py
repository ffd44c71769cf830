"""What losing a whole host costs a training run (root on Linux: the emulated cluster of
sparkml_dist.services.hosts, master + 2 worker hosts, one rank on each, Adult).

Alternated: an uninterrupted `jobs/train.py` run (the baseline) and the same run where every
process of worker host 2 is killed when epoch 3 starts (train.min_ranks=1: the run continues on
host 1). Reported, from the driver's log and the checkpoint directory:

- detect: kill -> the driver logs the failed attempt;
- relaunch: the failed attempt -> the next barrier stage starts (includes train.elastic_wait_s,
  the wait for the lost host's slot to come back);
- resume: kill -> the relaunched rank's first checkpoint (training is running again);
- the whole run with the loss vs without (ratio).

    .venv/bin/python -m bench.host_loss
"""

from __future__ import annotations

import datetime as dt
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import entry, record
from sparkml_dist.services.hosts import EmulatedHosts, create_hosts, start_spark

ROOT = Path(__file__).resolve().parents[1]
WORKDIR, SHARED = Path("/tmp/sparkml_dist-bench-hosts"), Path("/tmp/sparkml_dist-bench-shared")
ELASTIC_WAIT_S = 10
EPOCHS = 6


def submit(cluster: EmulatedHosts, job: str, *overrides: str) -> list[str]:
    return [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        cluster.master_url,
        "--load-spark-defaults",
        "--properties-file",
        str(ROOT / "conf/spark/cluster.conf"),
        str(ROOT / job),
        "--config",
        str(ROOT / "conf/adult.yaml"),
        "--set",
        f"output.root={SHARED / 'out'}",
        "--set",
        f"tracking.tracking_uri=sqlite:///{SHARED / 'mlflow.db'}",
        *[a for o in overrides for a in ("--set", o)],
    ]


def train_argv(cluster: EmulatedHosts) -> list[str]:
    return submit(
        cluster,
        "jobs/train.py",
        f"train.epochs={EPOCHS}",
        "train.min_ranks=1",
        f"train.elastic_wait_s={ELASTIC_WAIT_S}",
        "train.checkpoint_every_steps=20",
    )


def uninterrupted(cluster: EmulatedHosts) -> float:
    start = time.monotonic()
    done = cluster.run(0, train_argv(cluster), capture_output=True, text=True, cwd=SHARED, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return time.monotonic() - start


def with_host_loss(cluster: EmulatedHosts) -> dict[str, float]:
    """One run with host 2 killed at the start of epoch 3; its timings, then host 2 restarted."""
    checkpoints = SHARED / "out" / "checkpoints"
    before = set(checkpoints.glob("*")) if checkpoints.exists() else set()
    start = time.monotonic()
    job = cluster.popen(
        0, train_argv(cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=SHARED
    )
    run_dir = _wait_for(lambda: next(iter(set(checkpoints.glob("*")) - before), None), job)
    _wait_for(lambda: (run_dir / "ckpt-e00002-s0000000.pt").exists() or None, job)
    killed_at, killed_wall = time.monotonic(), dt.datetime.now()
    cluster.kill_host(2)
    seen = {p.name for p in run_dir.glob("ckpt-*")}
    _wait_for(lambda: next((p for p in run_dir.glob("ckpt-*") if p.name not in seen), None), job)
    resumed = time.monotonic() - killed_at
    stdout, stderr = job.communicate(timeout=900)
    total = time.monotonic() - start
    if job.returncode != 0:
        raise RuntimeError(stderr[-3000:])
    failed, launched = _log_times(stdout + stderr, killed_wall)
    _restart_host(cluster)
    return {"total": total, "detect": failed, "relaunch": launched - failed, "resume": resumed}


def _log_times(log: str, killed: dt.datetime) -> tuple[float, float]:
    """Seconds after the kill at which the driver logged the failed attempt and the relaunch."""

    def seconds_after(pattern: str) -> float:
        for line in log.splitlines():
            m = re.match(r"^(\d\d:\d\d:\d\d) .*" + pattern, line)
            if m:
                at = dt.datetime.combine(killed.date(), dt.time.fromisoformat(m[1]))
                if at >= killed.replace(microsecond=0):
                    return (at - killed).total_seconds()
        raise RuntimeError(f"no driver log line matching {pattern!r}")

    return max(seconds_after(r"attempt 1/\d+ failed"), 0.0), seconds_after(r"launching 1 ranks")


def _wait_for(probe, job: subprocess.Popen, timeout_s: float = 600):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found is not None:
            return found
        if job.poll() is not None:
            raise RuntimeError(f"the job ended first: {job.stderr.read()[-3000:] if job.stderr else ''}")
        time.sleep(0.1)
    raise TimeoutError("waited too long")


def _restart_host(cluster: EmulatedHosts) -> None:
    from sparkml_dist.services.hosts import start_worker

    start_worker(cluster, 2)
    deadline = time.monotonic() + 60
    while cluster.alive_workers() < 2 and time.monotonic() < deadline:
        time.sleep(1)


def main(rounds: int = 2) -> list[dict]:
    cluster = create_hosts(WORKDIR, 3, SHARED, keep=[str(ROOT), sys.prefix])
    try:
        start_spark(cluster)
        prep = cluster.run(
            0, submit(cluster, "jobs/preprocess.py"), capture_output=True, text=True, cwd=SHARED
        )
        if prep.returncode != 0:
            raise RuntimeError(prep.stderr[-3000:])
        clean, lossy = [], []
        for i in range(rounds):  # alternated, baseline first on even rounds
            if i % 2 == 0:
                clean.append(uninterrupted(cluster))
                lossy.append(with_host_loss(cluster))
            else:
                lossy.append(with_host_loss(cluster))
                clean.append(uninterrupted(cluster))
    finally:
        cluster.stop()
    med = {k: statistics.median(r[k] for r in lossy) for k in ("total", "detect", "relaunch", "resume")}
    note = (
        f"host 2 killed at the start of epoch 3 of {EPOCHS}; detect {med['detect']:.0f} s, relaunch "
        f"{med['relaunch']:.0f} s (of which train.elastic_wait_s={ELASTIC_WAIT_S}), training again "
        f"{med['resume']:.0f} s after the kill; the run continues on 1 rank"
    )
    rows = [
        entry(
            "host_loss_run_vs_uninterrupted", med["total"], statistics.median(clean), "s", "lower", None, note
        ),
        entry(
            "host_loss_resume_s",
            med["resume"],
            ELASTIC_WAIT_S,
            "s",
            "lower",
            None,
            "seconds from the kill to the relaunched rank's first checkpoint; baseline: the elastic wait",
        ),
    ]
    record(rows)
    return rows


if __name__ == "__main__":
    main()
