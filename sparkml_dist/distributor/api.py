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
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sparkml_dist.distributor.frames import frame_for_ranks
from sparkml_dist.distributor.job import UserJob, user_rank
from sparkml_dist.distributor.local import run_local
from sparkml_dist.distributor.objects import FunctionCall, TrainCall, train_call
from sparkml_dist.errors import ConfigError, PrerequisiteError, SlotError, UserCodeError
from sparkml_dist.launch.launcher import run_barrier
from sparkml_dist.launch.relaunch import relaunch
from sparkml_dist.launch.torch_backend import TorchBackend
from sparkml_dist.spark.kind import is_connect

log = logging.getLogger(__name__)

IGNORE_SSL_CONF = "pytorch.spark.distributor.ignoreSsl"  # pyspark's key to train unencrypted on a TLS cluster


class TorchDistributor:
    """Run torch training code on `num_processes` ranks.

    `local_mode=True` (pyspark's default): processes on the driver's host. `local_mode=False`:
    one rank per Spark task in a barrier stage on the executors. `use_gpu`: one GPU per rank
    (spark.task.resource.gpu.amount=1 on a cluster). Beyond pyspark's arguments, keyword-only:
    `max_attempts` launches in all (a relaunch after a rank failure, unless the failure says a
    relaunch would meet it again), `checkpoint_dir` for the function to resume from (default: a
    fresh temporary directory, removed after success), and the `spark` session to use."""

    def __init__(
        self,
        num_processes: int = 1,
        local_mode: bool = True,
        use_gpu: bool = True,
        _ssl_conf: str = IGNORE_SSL_CONF,
        *,
        max_attempts: int = 1,
        checkpoint_dir: str | None = None,
        spark=None,
        timeout_s: int = 1800,
    ):
        if not isinstance(num_processes, int) or num_processes < 1:
            raise ConfigError(f"num_processes has to be a positive integer, got {num_processes!r}")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError(f"max_attempts must be a positive integer, got {max_attempts!r}")
        self.spark = spark if spark is not None else _active_session(required=not local_mode)
        self.is_remote = is_connect(self.spark)  # pyspark's name: a Spark Connect session
        self.is_spark_local_master = _is_local_master(self.spark)
        self.logger = _distributor_logger()
        self.num_processes = num_processes
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        self.ssl_conf = _ssl_conf
        self.max_attempts = max_attempts
        self.checkpoint_dir = checkpoint_dir
        self.timeout_s = timeout_s
        self.attempts_used = 0  # launches the last run took
        self.num_tasks = self._get_num_tasks()
        # pyspark's record of the arguments (its tests and users read it)
        self.input_params = {
            "num_processes": self.num_processes,
            "local_mode": local_mode,
            "use_gpu": use_gpu,
            "num_tasks": self.num_tasks,
        }
        _show_rank_output()

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """`train_object(*args, **kwargs)` on every rank, or the script `train_object` with the
        command-line arguments `args`; returns rank 0's return value (None for a script)."""
        return self._launch(train_call(train_object, args, kwargs), frame=None)

    def run_on_dataframe(self, train_function: Callable[..., Any], df, *args: Any, **kwargs: Any) -> Any:
        """Like `run`, with `df`'s rows dealt to the ranks: inside `train_function`,
        `sparkml_dist.dataframe_loader(...)` iterates over this rank's share."""
        if self.local_mode:
            raise ConfigError(
                "run_on_dataframe needs local_mode=False: the rows reach the ranks through a "
                "barrier stage on the executors"
            )
        call = train_call(train_function, args, kwargs)
        if not isinstance(call, FunctionCall):
            raise UserCodeError("run_on_dataframe takes a function (a script cannot call dataframe_loader)")
        return self._launch(call, frame=frame_for_ranks(df))

    # pyspark's name for the same thing (private there)
    _train_on_dataframe = run_on_dataframe

    def _launch(self, call: TrainCall, frame) -> Any:
        self._check_encryption()
        with self._checkpoint_dir() as checkpoint_dir:

            def job(attempt: int) -> UserJob:
                return UserJob(call, attempt, self.max_attempts, checkpoint_dir, self.use_gpu)

            launched = relaunch(
                lambda attempt: self._attempt(job(attempt), frame), self.max_attempts, wrap=False
            )
        self.attempts_used = launched.attempts
        return launched.results[0]

    def _attempt(self, job: UserJob, frame) -> list[Any]:
        log.info(
            "%s on %d %s rank(s), attempt %d/%d",
            job.call.name,
            self.num_processes,
            "local" if self.local_mode else "barrier",
            job.attempt + 1,
            self.max_attempts,
        )
        if self.local_mode:
            gpus = _driver_gpus(self.spark)[: self.num_processes] if self.use_gpu else None
            return run_local(job, self.num_processes, gpus)
        backend = TorchBackend(
            device="cuda" if self.use_gpu else "cpu",
            timeout_s=self.timeout_s,
            init_group=False,
            needs_fresh_process=self.use_gpu,
        )
        try:
            return run_barrier(
                self.spark, user_rank, job, self.num_processes, backend, stream_output=True, frame=frame
            )
        except SlotError as exc:  # name the argument this API sets the ranks with
            raise SlotError(exc.available, exc.requested, exc.detail, key="num_processes") from None

    @contextmanager
    def _checkpoint_dir(self) -> Iterator[str]:
        if self.checkpoint_dir:
            yield str(self.checkpoint_dir)
            return
        scratch = tempfile.mkdtemp(prefix="sparkml-dist-checkpoints-")
        if not self.local_mode and not _is_local_master(self.spark):
            # a directory on the driver's own disk: ranks on other hosts neither see it nor share it
            log.warning(
                "no checkpoint_dir given: the scratch directory %s is on the driver's host only; on a "
                "cluster pass checkpoint_dir=<a path or URI every executor can reach> for relaunches "
                "to resume",
                scratch,
            )
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _get_num_tasks(self) -> int:
        """Barrier tasks to launch, checking GPUs as pyspark does: on the driver, the GPUs Spark
        gave it (`spark.driver.resource.gpu.*`; num_processes is lowered to their count, with a
        warning); on executors, one rank per `spark.task.resource.gpu.amount` GPUs."""
        if not self.use_gpu:
            return self.num_processes
        if not self.local_mode:
            key = "spark.task.resource.gpu.amount"
            per_task = int(float(_conf_value(self.spark, key) or "0"))
            if per_task < 1:
                raise PrerequisiteError(
                    f"'{key}' was unset, so gpu usage is unavailable. Set it (with "
                    f"spark.executor.resource.gpu.amount and a discovery script), or pass "
                    f"use_gpu=False to train on CPU"
                )
            if self.num_processes % per_task:
                raise PrerequisiteError(
                    f"TorchDistributor 'num_processes' value ({self.num_processes}) must be a "
                    f"multiple of '{key}' ({per_task}) value."
                )
            return self.num_processes // per_task
        available = len(_driver_gpus(self.spark))
        if available == 0:
            raise PrerequisiteError(
                "GPUs were unable to be found on the driver. Give the driver GPUs "
                "(spark.driver.resource.gpu.amount and its discovery script), or pass "
                "use_gpu=False to train on CPU"
            )
        if self.num_processes > available:
            self.logger.warning(
                "'num_processes' cannot be set to a value greater than the number of available GPUs "
                "on the driver, which is %d. 'num_processes' was reset to be equal to the number of "
                "available GPUs.",
                available,
            )
            self.num_processes = available
        return self.num_processes

    def _check_encryption(self) -> None:
        """Training traffic is not encrypted: on a cluster with `spark.ssl.enabled`, refuse unless
        the user set `ssl_conf` (pyspark's `pytorch.spark.distributor.ignoreSsl`) to true."""
        if not _conf_is_true(self.spark, "spark.ssl.enabled"):
            return
        if _conf_is_true(self.spark, self.ssl_conf):
            self.logger.warning(
                "This cluster has TLS encryption enabled; however, TorchDistributor does not support "
                "data encryption in transit. '%s' is true, so it goes on: model parameters and "
                "possibly training data are sent between nodes unencrypted.",
                self.ssl_conf,
            )
            return
        raise PrerequisiteError(
            f"This cluster has TLS encryption enabled; however, TorchDistributor does not support "
            f"data encryption in transit. To override this configuration and use TorchDistributor "
            f"anyway, you may set '{self.ssl_conf}' to 'true' in the Spark configuration. Please "
            f"note this will cause model parameters and possibly training data to be sent between "
            f"nodes unencrypted."
        )


def _conf_value(spark, key: str) -> str | None:
    """The context's value of `key` (what Spark schedules with, also when set on the SparkContext
    after the session was made), else the session's."""
    if is_connect(spark):  # no SparkContext on a Connect client: the session's conf is the server's
        return spark.conf.get(key, None)
    return spark.sparkContext.getConf().get(key, None) or spark.conf.get(key, None)


def _conf_is_true(spark, key: str) -> bool:
    """`key` is true in the session's conf or the context's (a value set on the SparkContext after
    the session was made reaches only the latter)."""
    if spark is None:
        return False
    values = (
        spark.conf.get(key, None),
        None if is_connect(spark) else spark.sparkContext.getConf().get(key, None),
    )
    return any((v or "").lower() == "true" for v in values)


def _is_local_master(spark) -> bool:
    master = spark.conf.get("spark.master", "") if spark is not None else ""
    return master == "local" or master.startswith("local[")


def _driver_gpus(spark) -> list[str]:
    """The GPUs the driver owns: Spark's driver resources (with CUDA_VISIBLE_DEVICES mapping
    their indices, as pyspark's get_gpus_owned does); without a session, the ones torch sees."""
    if spark is None or is_connect(spark):  # a Connect client's processes run on its own host
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    gpu = spark.sparkContext.resources.get("gpu")
    addresses = list(gpu.addresses) if gpu is not None else []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [visible.split(",")[int(a)] for a in addresses] if visible else addresses


def _active_session(required: bool):
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is None and required:
        raise ConfigError(
            "TorchDistributor(local_mode=False) needs an active SparkSession: create one first "
            "(SparkSession.builder...getOrCreate() or sparkml_dist.build_session), or pass spark="
        )
    return session


def _distributor_logger() -> logging.Logger:
    """pyspark's: the class's own logger at INFO, printing to stderr when nothing is configured."""
    logger = logging.getLogger("TorchDistributor")
    logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        logger.addHandler(logging.StreamHandler(sys.stderr))
    return logger


class _CurrentStdout(logging.StreamHandler):
    """Writes to whatever `sys.stdout` is when a line arrives (a notebook's, pytest's capture, a
    redirect made after the distributor was built), not the one it was created with."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _show_rank_output() -> None:
    """A rank's output lines go to the driver's stdout as they are written, as pyspark's
    distributor prints them, and stay INFO records of `sparkml_dist.ranks` for an application's
    own logging."""
    ranks = logging.getLogger("sparkml_dist.ranks")
    if not any(isinstance(h, _CurrentStdout) for h in ranks.handlers):
        ranks.addHandler(_CurrentStdout())
    ranks.setLevel(logging.INFO)
