"""CPU time Spark's executors spent on the jobs of one job group: the JVM side of a Spark stage's
cost (its task threads' `executorCpuTime`), read from Spark's status store. The Python workers'
CPU is not in it; `inference.udf` counts that with an accumulator."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def job_ids(spark, group: str) -> set[int]:
    return set(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def executor_cpu_seconds(spark, jobs: set[int]) -> float:
    """Executor CPU seconds of every stage attempt of `jobs` (nan when the store cannot say)."""
    context = spark.sparkContext
    tracker = context.statusTracker()
    try:
        # AppStatusStore is Spark's own (the UI and REST API read it); pyspark has no wrapper for it
        store = context._jsc.sc().statusStore()
        gateway = context._gateway
        nanos = 0
        for job in jobs:
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info else ():
                attempts = store.stageData(
                    stage,
                    False,
                    gateway.jvm.java.util.ArrayList(),
                    False,
                    gateway.new_array(gateway.jvm.double, 0),
                )
                nanos += sum(attempts.apply(i).executorCpuTime() for i in range(attempts.size()))
        return nanos / 1e9
    except Exception as exc:
        log.info("executor CPU time not readable from Spark's status store: %s", exc)
        return float("nan")
