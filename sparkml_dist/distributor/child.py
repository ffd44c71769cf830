"""A rank of a local-mode launch (`TorchDistributor(local_mode=True)`): a fresh Python process on
the driver's host, started by `local.run_local` with the torchrun environment.

    python -m sparkml_dist.distributor.child JOB_FILE OUT_DIR

Runs the pickled job; rank 0 leaves its return value in OUT_DIR/result.pkl, a failing rank its
report in OUT_DIR/rank-<N>.json (the parent turns those into the result or a RankFailure)."""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from sparkml_dist.errors import RankReport, is_retryable
from sparkml_dist.launch.context import env_scope
from sparkml_dist.launch.pg_guard import process_groups_outlive_the_call

RESULT_FILE = "result.pkl"


def report_file(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank-{rank}.json"


def main(job_file: str, out_dir: str) -> int:
    from pyspark import cloudpickle

    rank = int(os.environ["RANK"])
    try:
        job = cloudpickle.loads(
            Path(job_file).read_bytes()
        )  # written by this job's parent, in its private dir

        with _env(job.env()), process_groups_outlive_the_call():  # see launch.pg_guard
            result = job.call.call()
        if rank == 0:
            _write_atomically(Path(out_dir) / RESULT_FILE, cloudpickle.dumps(result))
        return 0
    except BaseException as exc:
        text = traceback.format_exc()
        sys.stderr.write(text)
        report = RankReport(
            rank=rank,
            host="127.0.0.1",
            exc_type=type(exc).__name__,
            message=str(exc)[:2000],
            traceback=text[-4000:],
            retryable=is_retryable(exc),
        )
        _write_atomically(report_file(out_dir, rank), json.dumps(report.to_json()).encode())
        return 1


def _env(values):
    return env_scope(values)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
