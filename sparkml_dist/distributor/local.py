"""`local_mode=True`: the ranks are fresh processes on the driver's host (as torchrun would start
them), not Spark tasks. Their output is logged on the driver as it comes; a failing rank ends the
launch after a short grace (its peers are usually stuck in a collective) with a `RankFailure`."""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sparkml_dist.distributor.child import RESULT_FILE, report_file
from sparkml_dist.distributor.job import UserJob
from sparkml_dist.distributor.objects import FunctionCall
from sparkml_dist.errors import RankFailure, RankReport
from sparkml_dist.launch.rendezvous import AGENT_STORE_ENV, BoundStore

log = logging.getLogger("sparkml_dist.ranks")
HOST = "127.0.0.1"
PEER_GRACE_S = 10.0  # after one rank fails, how long the others may take to notice before they are stopped
TAIL_LINES = 40


def run_local(job: UserJob, num_processes: int, visible_gpus: list[str] | None = None) -> list[Any]:
    """Run the job on `num_processes` local processes; rank 0's result first, then None per rank.
    `visible_gpus`: the GPUs every rank's CUDA_VISIBLE_DEVICES names (rank i uses cuda:i)."""
    from pyspark import cloudpickle

    # the ranks' rendezvous store lives here, bound to loopback only (launch.rendezvous)
    with (
        tempfile.TemporaryDirectory(prefix="sparkml-dist-local-") as work,
        BoundStore(HOST, num_processes) as store,
    ):  # mode 0700: only this user
        job_file = Path(work) / "job.pkl"
        job_file.write_bytes(cloudpickle.dumps(job))
        port = store.port
        tails: list[collections.deque[str]] = [
            collections.deque(maxlen=TAIL_LINES) for _ in range(num_processes)
        ]
        gpus = {} if visible_gpus is None else {"CUDA_VISIBLE_DEVICES": ",".join(visible_gpus)}
        procs = [
            _start(job, job_file, work, rank, num_processes, port, gpus) for rank in range(num_processes)
        ]
        readers = [
            threading.Thread(target=_relay, args=(p, r, tails[r]), daemon=True) for r, p in enumerate(procs)
        ]
        for reader in readers:
            reader.start()
        codes = _wait(procs)
        for reader in readers:
            reader.join(timeout=5)
        failed = [r for r, code in enumerate(codes) if code != 0]
        if failed:
            raise RankFailure([_report(work, r, codes[r], tails[r]) for r in failed])
        result_file = Path(work) / RESULT_FILE
        result = cloudpickle.loads(result_file.read_bytes()) if result_file.exists() else None
    return [result] + [None] * (num_processes - 1)


def _start(
    job: UserJob, job_file: Path, work: str, rank: int, world: int, port: int, gpus: dict[str, str]
) -> subprocess.Popen:
    env = {
        **os.environ,
        **job.env(),
        **_torchrun_env(rank, world, port),
        **gpus,
        "PYTHONUNBUFFERED": "1",
        # the child imports what the driver can (the user's modules, this package from a checkout)
        "PYTHONPATH": os.pathsep.join(p for p in [*sys.path, os.environ.get("PYTHONPATH", "")] if p),
    }
    if isinstance(job.call, FunctionCall):
        command = [sys.executable, "-m", "sparkml_dist.distributor.child", str(job_file), work]
    else:
        command = job.call.command(job.call.path)
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
    )


def _torchrun_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        "MASTER_ADDR": HOST,
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
        "GROUP_RANK": "0",
        **AGENT_STORE_ENV,
        "GLOO_SOCKET_IFNAME": "lo",
        "TP_SOCKET_IFNAME": "lo",
    }


def _relay(proc: subprocess.Popen, rank: int, tail: collections.deque) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        log.info("[rank %d] %s", rank, line)


def _wait(procs: list[subprocess.Popen]) -> list[int]:
    first_failure: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return [int(c) for c in codes]  # type: ignore[arg-type]
        if first_failure is None and any(c not in (None, 0) for c in codes):
            first_failure = time.monotonic()
        if first_failure is not None and time.monotonic() - first_failure > PEER_GRACE_S:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)


def _report(work: str, rank: int, code: int, tail: collections.deque) -> RankReport:
    output = "\n".join(tail)
    path = report_file(work, rank)
    if path.exists():
        raw = json.loads(path.read_text())
        raw["output_tail"] = output[-4000:]
        return RankReport.from_json(raw)
    why = f"killed after a peer failed (exit code {code})" if code < 0 else f"exited with code {code}"
    return RankReport(rank=rank, host=HOST, exc_type="ProcessExited", message=why, output_tail=output[-4000:])
