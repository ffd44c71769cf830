"""Relaunching a failed barrier stage. Spark never retries one, so the driver does: up to
`max_attempts` launches, each with a payload that knows its attempt number (rank programs resume
from their last checkpoint). A failure whose own type says a relaunch would meet it again (bad
data, a bad config: `retryable = False`) ends it after that attempt."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from pyspark.sql import SparkSession

from sparkml_dist.errors import RankFailure, TrainingFailed
from sparkml_dist.launch.backend import Backend
from sparkml_dist.launch.launcher import RankFn, run_barrier

log = logging.getLogger(__name__)
R = TypeVar("R")


@dataclass(frozen=True)
class Launched(Generic[R]):
    results: list[R]  # in rank order
    attempts: int  # launches it took (1: no failure)


def run_with_relaunch(spark: SparkSession, fn: RankFn, payload_for: Callable[[int], Any], num_ranks: int,
                      backend: Backend, max_attempts: int) -> Launched:
    """`fn(ctx, payload_for(attempt))` on `num_ranks` ranks until an attempt succeeds."""
    failures: list[str] = []
    for attempt in range(max_attempts):
        try:
            results = run_barrier(spark, fn, payload_for(attempt), num_ranks, backend)
        except RankFailure as failure:
            failures.append(str(failure))
            log.warning("training attempt %d/%d failed: %s", attempt + 1, max_attempts, str(failure).splitlines()[0])
            if not failure.retryable:
                raise TrainingFailed(attempt + 1, failures[-1], retryable=False) from None
            continue
        if failures:
            log.info("training finished on attempt %d after %d failure(s)", attempt + 1, len(failures))
        return Launched(results, attempt + 1)
    raise TrainingFailed(max_attempts, failures[-1])
