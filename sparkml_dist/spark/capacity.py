"""What a cluster application asks for versus what the cluster manager offers.

A standalone application whose executors fit no worker waits forever with zero cores and says
nothing; a barrier stage with more ranks than slots waits for slots that never come. These
helpers bound that wait and name the gap, reading the offer from the standalone master's JSON
(its web UI: `spark.master.ui.port`, 8080 by default, the port Spark's own scripts use)."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlparse

from sparkml_dist.errors import SparkMLDistError


@dataclass(frozen=True)
class ExecutorAsk:
    """One executor's size and the application's total, from the application's Spark conf."""

    cores: int
    memory_mb: int
    cores_max: int | None

    def describe(self) -> str:
        total = f", spark.cores.max={self.cores_max}" if self.cores_max else ""
        return f"executors of spark.executor.cores={self.cores} and spark.executor.memory={self.memory_mb}m{total}"


@dataclass(frozen=True)
class WorkerOffer:
    host: str
    cores_free: int
    memory_free_mb: int

    def fits(self, ask: ExecutorAsk) -> bool:
        return self.cores_free >= ask.cores and self.memory_free_mb >= ask.memory_mb


@dataclass(frozen=True)
class MasterOffer:
    """ALIVE workers of a standalone master and what each has free."""

    master: str
    workers: tuple[WorkerOffer, ...]

    def describe(self) -> str:
        if not self.workers:
            return f"the master {self.master} has no ALIVE worker"
        each = ", ".join(f"{w.host}: {w.cores_free} cores / {w.memory_free_mb}m free" for w in self.workers)
        return f"the master {self.master} has {len(self.workers)} ALIVE workers ({each})"


class CapacityError(SparkMLDistError, RuntimeError):
    """The cluster grants this application too little: no executor, or too few task slots."""

    retryable = False


def executor_ask(conf) -> ExecutorAsk:
    cores_max = conf.get("spark.cores.max", None)
    return ExecutorAsk(
        cores=int(conf.get("spark.executor.cores", "1")),
        memory_mb=memory_mb(conf.get("spark.executor.memory", "1g")),
        cores_max=int(cores_max) if cores_max else None,
    )


def memory_mb(size: str) -> int:
    """Spark's memory strings (512m, 4g, 1t; a bare number is MiB) in MiB."""
    size = size.strip().lower().removesuffix("b")
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    if size and size[-1] in units:
        return int(float(size[:-1]) * units[size[-1]])
    return int(size)


def master_offer(master: str, ui_port: int, timeout_s: float = 3.0) -> MasterOffer | None:
    """The standalone master's ALIVE workers, or None if its JSON cannot be read."""
    if not master.startswith("spark://"):
        return None
    host = urlparse(master.split(",")[0]).hostname
    try:
        with urllib.request.urlopen(f"http://{host}:{ui_port}/json/", timeout=timeout_s) as resp:
            state = json.load(resp)
    except (OSError, ValueError):
        return None
    workers = tuple(
        WorkerOffer(w.get("host", "?"), int(w.get("coresfree", 0)), int(w.get("memoryfree", 0)))
        for w in state.get("workers", [])
        if w.get("state") == "ALIVE"
    )
    return MasterOffer(master, workers)


def gap_advice(ask: ExecutorAsk, offer: MasterOffer | None) -> str:
    if offer is None:
        return (
            "(the cluster manager's offer could not be read; check its UI for free cores and memory "
            "per worker)"
        )
    if not offer.workers:
        return "; start workers and register them with this master"
    if any(w.fits(ask) for w in offer.workers):
        return "; a worker has room, so another application may hold the cores, or spark.cores.max is too low"
    best_mem = max(w.memory_free_mb for w in offer.workers)
    best_cores = max(w.cores_free for w in offer.workers)
    fixes = []
    if best_mem < ask.memory_mb:
        fixes.append(
            f"lower spark.executor.memory to at most {best_mem}m or give workers more memory "
            f"(SPARK_WORKER_MEMORY; `spark_cluster start --memory`)"
        )
    if best_cores < ask.cores:
        fixes.append(f"lower spark.executor.cores to at most {best_cores} or give workers more cores")
    return "; no worker can host one executor: " + ", or ".join(fixes)


def registered_executors(sc) -> int:
    return len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1  # the driver is listed too


def needs_executor_wait(conf, master: str) -> bool:
    """Cluster masters with a fixed set of executors; local modes run tasks in the driver."""
    if master.startswith("local"):
        return False
    return conf.get("spark.dynamicAllocation.enabled", "false").lower() != "true"


def wait_for_executors(spark, timeout_s: float) -> int:
    """Block until an executor registers; after `timeout_s` raise a CapacityError naming the gap."""
    sc = spark.sparkContext
    conf = sc.getConf()
    if not needs_executor_wait(conf, sc.master):
        return 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = registered_executors(sc)
        if found > 0:
            return found
        time.sleep(0.5)
    ask = executor_ask(conf)
    offer = master_offer(sc.master, int(conf.get("spark.master.ui.port", "8080")))
    raise CapacityError(
        f"no executor was granted within {timeout_s:.0f} s (spark.executor_wait_s): the application "
        f"asks for {ask.describe()}; {offer.describe() if offer else 'master ' + sc.master}"
        f"{gap_advice(ask, offer)}"
    )


def slot_gap(spark) -> str:
    """The master's side of a slot shortage, for the barrier stage's SlotError."""
    sc = spark.sparkContext
    conf = sc.getConf()
    offer = master_offer(sc.master, int(conf.get("spark.master.ui.port", "8080")))
    ask = executor_ask(conf)
    return (
        f" The application asks for {ask.describe()}; {offer.describe()}{gap_advice(ask, offer)}."
        if offer
        else ""
    )
