"""`TorchDistributor`: a drop-in for `pyspark.ml.torch.distributor.TorchDistributor` that starts
the ranks with this project's barrier launcher (no torchrun, no pickled-function files: each rank
runs in its Spark Python worker), and adds what that class lacks:

- a failing rank raises `RankFailure` with every failed rank's exception, traceback and last output;
- every rank's output is logged on the driver as it is written (`sparkml_dist.ranks` logger);
- `max_attempts` relaunches after a failure, with `checkpoint_dir` and the attempt number
  available to the function (`launch_info()`);
- `run_on_dataframe(fn, df, ...)` feeds the ranks a DataFrame's rows through the barrier stage.

    from sparkml_dist import TorchDistributor          # was: from pyspark.ml.torch.distributor import ...
    model = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, 1e-3)
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from sparkml_dist.distributor.frames import frame_for_ranks
from sparkml_dist.distributor.job import UserJob, user_rank
from sparkml_dist.distributor.local import run_local
from sparkml_dist.distributor.objects import FunctionCall, TrainCall, train_call
from sparkml_dist.errors import ConfigError, UserCodeError
from sparkml_dist.launch.launcher import run_barrier
from sparkml_dist.launch.relaunch import relaunch
from sparkml_dist.launch.torch_backend import TorchBackend
from sparkml_dist.spark.session import refuse_spark_connect

log = logging.getLogger(__name__)


class TorchDistributor:
    """Run torch training code on `num_processes` ranks.

    `local_mode=True` (pyspark's default): processes on the driver's host. `local_mode=False`:
    one rank per Spark task in a barrier stage on the executors. `use_gpu`: one GPU per rank
    (spark.task.resource.gpu.amount=1 on a cluster). Beyond pyspark's arguments, keyword-only:
    `max_attempts` launches in all (a relaunch after a rank failure, unless the failure says a
    relaunch would meet it again), `checkpoint_dir` for the function to resume from (default: a
    fresh temporary directory, removed after success), and the `spark` session to use."""

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True, *,
                 max_attempts: int = 1, checkpoint_dir: str | None = None, spark=None, timeout_s: int = 1800):
        if not isinstance(num_processes, int) or num_processes < 1:
            raise ConfigError(f"num_processes must be a positive integer, got {num_processes!r}")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError(f"max_attempts must be a positive integer, got {max_attempts!r}")
        self.num_processes = num_processes
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        self.max_attempts = max_attempts
        self.checkpoint_dir = checkpoint_dir
        self.timeout_s = timeout_s
        self.spark = spark if spark is not None else _active_session(required=not local_mode)
        refuse_spark_connect(self.spark)
        self.attempts_used = 0  # launches the last run took
        _show_rank_output()
        self._check_gpus()

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """`train_object(*args, **kwargs)` on every rank, or the script `train_object` with the
        command-line arguments `args`; returns rank 0's return value (None for a script)."""
        return self._launch(train_call(train_object, args, kwargs), frame=None)

    def run_on_dataframe(self, train_function: Callable[..., Any], df, *args: Any, **kwargs: Any) -> Any:
        """Like `run`, with `df`'s rows dealt to the ranks: inside `train_function`,
        `sparkml_dist.dataframe_loader(...)` iterates over this rank's share."""
        if self.local_mode:
            raise ConfigError("run_on_dataframe needs local_mode=False: the rows reach the ranks through a "
                              "barrier stage on the executors")
        call = train_call(train_function, args, kwargs)
        if not isinstance(call, FunctionCall):
            raise UserCodeError("run_on_dataframe takes a function (a script cannot call dataframe_loader)")
        return self._launch(call, frame=frame_for_ranks(df))

    # pyspark's name for the same thing (private there)
    _train_on_dataframe = run_on_dataframe

    def _launch(self, call: TrainCall, frame) -> Any:
        with self._checkpoint_dir() as checkpoint_dir:
            launched = relaunch(lambda attempt: self._attempt(UserJob(call, attempt, self.max_attempts, checkpoint_dir),
                                                              frame), self.max_attempts,
                                wrap=False)
        self.attempts_used = launched.attempts
        return launched.results[0]

    def _attempt(self, job: UserJob, frame) -> list[Any]:
        log.info("%s on %d %s rank(s), attempt %d/%d", job.call.name, self.num_processes,
                 "local" if self.local_mode else "barrier", job.attempt + 1, self.max_attempts)
        if self.local_mode:
            return run_local(job, self.num_processes)
        backend = TorchBackend(device="cuda" if self.use_gpu else "cpu", timeout_s=self.timeout_s, init_group=False,
                               needs_fresh_process=self.use_gpu)
        return run_barrier(self.spark, user_rank, job, self.num_processes, backend, stream_output=True, frame=frame)

    @contextmanager
    def _checkpoint_dir(self) -> Iterator[str]:
        if self.checkpoint_dir:
            yield str(self.checkpoint_dir)
            return
        scratch = tempfile.mkdtemp(prefix="sparkml-dist-checkpoints-")
        if not self.local_mode and not self.spark.sparkContext.master.startswith("local"):
            # a directory on the driver's own disk: ranks on other hosts neither see it nor share it
            log.warning("no checkpoint_dir given: the scratch directory %s is on the driver's host only; on a "
                        "cluster pass checkpoint_dir=<a path or URI every executor can reach> for relaunches "
                        "to resume", scratch)
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _check_gpus(self) -> None:
        if not self.use_gpu:
            return
        if self.local_mode:
            import torch

            if torch.cuda.device_count() < self.num_processes:
                raise ConfigError(f"use_gpu=True with local_mode=True needs {self.num_processes} GPU(s) on the driver; "
                                  f"torch sees {torch.cuda.device_count()}. Pass use_gpu=False to train on CPU")
            return
        amount = self.spark.sparkContext.getConf().get("spark.task.resource.gpu.amount", "0")
        if float(amount) != 1:
            raise ConfigError(f"use_gpu=True needs spark.task.resource.gpu.amount=1 (one GPU per rank), got "
                              f"{amount}. Set it (with spark.executor.resource.gpu.amount and a discovery script), "
                              f"or pass use_gpu=False to train on CPU")


def _active_session(required: bool):
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is None and required:
        raise ConfigError("TorchDistributor(local_mode=False) needs an active SparkSession: create one first "
                          "(SparkSession.builder...getOrCreate() or sparkml_dist.build_session), or pass spark=")
    return session


def _show_rank_output() -> None:
    """Rank lines are INFO records of `sparkml_dist.ranks`; print them when the application has not
    configured logging (a notebook, a plain script), as pyspark's distributor does."""
    ranks = logging.getLogger("sparkml_dist.ranks")
    if ranks.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    ranks.addHandler(handler)
    ranks.setLevel(logging.INFO)
    ranks.propagate = False
