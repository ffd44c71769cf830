"""The one SparkSession builder. Loopback by default, fail-fast barrier checks, Java checked first."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from sparkml_dist.config.schema import SparkConfig
from sparkml_dist.errors import PrerequisiteError
from sparkml_dist.spark.capacity import registered_executors, wait_for_executors
from sparkml_dist.spark.kind import is_connect, runs_in_this_process, session_master

__all__ = [
    "build_session",
    "check_java",
    "describe_session",
    "is_connect",
    "job_group",
    "job_phase",
    "runs_in_this_process",
    "session_master",
    "set_job_group",
    "task_slots",
]

MIN_JAVA = 17

# Barrier stages wait 10 min by default when slots are short; we check slots ourselves and
# want Spark's own check to give up quickly too (SPARK-24819).
_DEFAULT_CONF = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "3",
    "spark.ui.showConsoleProgress": "false",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.python.worker.reuse": "true",
}
_LOOPBACK = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
# local[*]: the driver is the only executor; Spark's 1g default heap runs out caching a few
# hundred thousand wide rows (MNIST's 785 columns). A cluster sizes its own (conf/spark/*.conf).
_LOCAL_CONF = {"spark.driver.memory": "4g"}
# Executors on this host run this interpreter, which has this package: their Python workers import
# pyspark's compiled package instead of compiling the zip Spark puts first on their path (0.64 s
# against 0.13 s to import the daemon and the worker, sparkml_dist/pyspark_daemon.py). A remote
# cluster keeps Spark's own, and so does a session whose conf names another daemon.
_SAME_HOST_CONF = {"spark.python.daemon.module": "sparkml_dist.pyspark_daemon"}


def check_java(min_major: int = MIN_JAVA) -> int:
    """Return Java's major version, or raise a PrerequisiteError that says how to install it."""
    java = (
        os.path.join(os.environ["JAVA_HOME"], "bin", "java")
        if os.environ.get("JAVA_HOME")
        else shutil.which("java")
    )
    hint = f"install Java {min_major}+ (Debian: apt-get install openjdk-{min_major}-jre-headless) and/or set JAVA_HOME"
    if not java or not os.path.exists(java):
        raise PrerequisiteError(f"Java not found: pyspark 4 needs Java {min_major}+; {hint}")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        raise PrerequisiteError(
            f"could not read the Java version from `{java} -version`: {out.strip()!r}; {hint}"
        )
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8" style
        major = int(match.group(2))
    if major < min_major:
        raise PrerequisiteError(
            f"Java {major} found at {java}, but pyspark 4 needs Java {min_major}+; {hint}"
        )
    return major


def driver_jvm_exit(wait_s: float = 2.0) -> str | None:
    """How the driver JVM this process launched ended ("was killed by signal 9"), or None while
    it runs (after `wait_s`: its sockets close a moment before it can be reaped) or when this
    process did not launch it (spark-submit's JVM launches Python)."""
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    if process is None:
        return None
    try:
        code = process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return None
    return f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"


def build_session(cfg: SparkConfig | None = None, extra_conf: dict[str, str] | None = None):
    """Get or create the session. spark-submit's --master/--conf win over the config file;
    SPARK_REMOTE (pyspark's own switch) or spark.remote asks for a Spark Connect session."""
    cfg = cfg or SparkConfig()
    remote = os.environ.get("SPARK_REMOTE") or cfg.remote
    if remote:
        return _connect_session(remote, cfg, extra_conf or {})
    check_java()
    from pyspark.sql import SparkSession

    submitted = _submitted_conf()
    builder = SparkSession.builder.appName(cfg.app_name)
    if not submitted.contains("spark.master"):
        builder = builder.master(cfg.master)
    master = submitted.get("spark.master", cfg.master)
    conf = dict(_DEFAULT_CONF)
    if _is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python workers on this host use this interpreter (the project's venv), not `python3`.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        conf.update(_LOOPBACK)
        if master.startswith("local"):
            conf.update(_LOCAL_CONF)
    conf.update(cfg.conf)
    conf.update(extra_conf or {})
    python = submitted.get("spark.pyspark.python", None) or conf.get("spark.pyspark.python")
    if _is_local_master(master) and _workers_run_this_interpreter(python):
        for key, value in _SAME_HOST_CONF.items():
            conf.setdefault(key, value)
    for key, value in conf.items():
        if not submitted.contains(key):
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    wait_for_executors(spark, cfg.executor_wait_s)
    return spark


def _connect_session(remote: str, cfg: SparkConfig, extra_conf: dict[str, str]):
    """A Spark Connect session. `local[...]` starts pyspark's own local Connect server in this
    process, on loopback only and with the settings a classic local session gets; a server at
    sc://host:port is the cluster's, whose static settings are its own: only the job's conf goes."""
    from pyspark.sql import SparkSession

    conf = dict(cfg.conf)
    if remote.startswith("local"):
        check_java()
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        conf = {
            **_DEFAULT_CONF,
            **_LOOPBACK,
            **_LOCAL_CONF,
            **_SAME_HOST_CONF,
            "spark.connect.grpc.binding.address": "127.0.0.1",
            **conf,
        }
    conf.update(extra_conf)
    builder = SparkSession.builder.appName(cfg.app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    if not os.environ.get("SPARK_REMOTE"):  # pyspark's builder reads the variable itself
        builder = builder.remote(remote)
    with warnings.catch_warnings():
        # the client sets every option again as a session conf after the local server started with
        # them; the static ones (ports, binding, memory) are refused there with a warning each
        warnings.filterwarnings("ignore", message="Failed to set", category=UserWarning)
        return builder.getOrCreate()


def _submitted_conf():
    """What spark-submit passed (--master, --conf, --properties-file). Under spark-submit those are
    JVM system properties, which SparkConf() only sees once the gateway is up: bring it up first,
    or the config file's master would silently replace the cluster's."""
    from pyspark import SparkConf, SparkContext

    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # launched by spark-submit: the JVM is already there
        SparkContext._ensure_initialized()
    return SparkConf()


def _workers_run_this_interpreter(configured: str | None) -> bool:
    """Whether this host's Python workers run this interpreter (which has this package): not when
    spark.pyspark.python (`configured`) or PYSPARK_PYTHON names another."""
    chosen = configured or os.environ.get("PYSPARK_PYTHON") or sys.executable
    # not resolved through symlinks: another virtualenv's python links to the same base interpreter
    return os.path.abspath(shutil.which(chosen) or chosen) == os.path.abspath(sys.executable)


def _is_local_master(master: str) -> bool:
    return master.startswith("local") or "127.0.0.1" in master or "localhost" in master


def task_slots(spark, wanted: int = 0, wait_s: float = 60.0) -> int:
    """How many tasks can run at once (what a barrier stage can get). On a cluster, executors
    register a few seconds after the session starts: wait up to `wait_s` for `wanted` slots.
    A Spark Connect client cannot see the cluster's executors: a local server's master says how many
    slots it has; for another server `wanted` is returned, and Spark itself refuses a barrier stage
    that does not fit (the launcher names that as a SlotError)."""
    if is_connect(spark):
        return _connect_slots(spark, wanted)
    sc = spark.sparkContext
    deadline = time.monotonic() + wait_s
    while True:
        slots = _current_slots(sc)
        if slots >= wanted or sc.master.startswith("local") or time.monotonic() > deadline:
            return slots
        time.sleep(0.5)


def _connect_slots(spark, wanted: int) -> int:
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]|local", session_master(spark))
    if match is None:
        return wanted
    cores = match.group(1) or "1"
    total = (os.cpu_count() or 1) if cores == "*" else int(cores)
    return int(total // float(spark.conf.get("spark.task.cpus", "1") or "1"))


def _current_slots(sc) -> int:
    conf = sc.getConf()
    cpus_per_task = float(conf.get("spark.task.cpus", "1"))
    if sc.master.startswith("local"):
        return int(sc.defaultParallelism // cpus_per_task)
    executors = registered_executors(sc)
    if executors <= 0:
        return 0  # defaultParallelism says 2 before any executor registers
    executor_cores = conf.get("spark.executor.cores", None)
    # defaultParallelism is at least 2 whatever is registered; the executors' own cores, when the
    # profile fixes them, count a lost executor at once
    slots = (
        int(executors * int(executor_cores) // cpus_per_task)
        if executor_cores
        else int(sc.defaultParallelism // cpus_per_task)
    )
    task_gpus = float(conf.get("spark.task.resource.gpu.amount", "0"))
    if task_gpus > 0:
        executor_gpus = float(conf.get("spark.executor.resource.gpu.amount", "0"))
        slots = min(slots, int(executors * executor_gpus // task_gpus))
    return slots


def describe_session(spark) -> str:
    """`master local[*]`, or Spark Connect and its server's master, for the job's first log line."""
    if is_connect(spark):
        return f"Spark Connect, server master {session_master(spark) or 'not given'}"
    return f"master {spark.sparkContext.master}"


@contextmanager
def job_phase(spark, description: str) -> Iterator[None]:
    """Label the Spark jobs started in the block (Spark UI, event logs, bench/preprocess_profile.py)."""
    if is_connect(spark):  # a Connect client labels its jobs with tags
        with _tagged(spark, description):
            yield
        return
    context = spark.sparkContext
    previous = context.getLocalProperty("spark.job.description")
    context.setJobDescription(description)
    try:
        yield
    finally:
        context.setLocalProperty("spark.job.description", previous)


@contextmanager
def job_group(spark, group: str, description: str) -> Iterator[None]:
    """Put the Spark jobs started in the block under `group` (the Spark UI's job group, what
    `sc.cancelJobGroup` stops) with `description`; the thread's previous group comes back after."""
    if is_connect(spark):
        with _tagged(spark, group):
            yield
        return
    context = spark.sparkContext
    keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    previous = {k: context.getLocalProperty(k) for k in keys}
    context.setJobGroup(group, description)
    try:
        yield
    finally:
        for key, value in previous.items():
            context.setLocalProperty(key, value)


def set_job_group(spark, group: str, description: str) -> None:
    """This thread's later Spark jobs under `group` (until another is set): Spark's job group, or
    on Spark Connect this thread's one tag."""
    if is_connect(spark):
        spark.clearTags()
        spark.addTag(_tag(group))
        return
    spark.sparkContext.setJobGroup(group, description)


def _tag(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]+", "_", label)[:100]


@contextmanager
def _tagged(spark, label: str) -> Iterator[None]:
    """Spark Connect's job label: a tag (no commas; `spark.interruptTag` stops its jobs)."""
    tag = _tag(label)
    spark.addTag(tag)
    try:
        yield
    finally:
        spark.removeTag(tag)
