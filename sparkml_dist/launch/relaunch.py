"""Relaunching a failed barrier stage. Spark never retries one, so the driver does: up to
`max_attempts` launches, each with a payload that knows its attempt number (rank programs resume
from their last checkpoint). A failure whose own type says a relaunch would meet it again (bad
data, a bad config: `retryable = False`) ends it after that attempt."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from pyspark.sql import SparkSession

from sparkml_dist.errors import RankFailure, TrainingFailed
from sparkml_dist.launch.backend import Backend
from sparkml_dist.launch.elastic import placeable_ranks
from sparkml_dist.launch.launcher import RankFn, run_barrier

log = logging.getLogger(__name__)
R = TypeVar("R")


@dataclass(frozen=True)
class Launched(Generic[R]):
    results: list[R]  # in rank order
    attempts: int  # launches it took (1: no failure)
    world_sizes: tuple[int, ...] = ()  # ranks of each launch, in order (elastic runs may shrink and grow)


def run_with_relaunch(
    spark: SparkSession,
    fn: RankFn,
    payload_for: Callable[[int], Any],
    num_ranks: int,
    backend: Backend,
    max_attempts: int,
    *,
    min_ranks: int | None = None,
    elastic_wait_s: float = 60.0,
    label: str = "train",
    **launch_options,
) -> Launched:
    """`fn(ctx, payload_for(attempt))` on `num_ranks` ranks until an attempt succeeds; `launch_options`
    go to `run_barrier` (stream_output, frame). With `min_ranks`, each launch takes as many ranks as
    can be placed within `elastic_wait_s`, at least `min_ranks` (launch.elastic). `label` starts the
    Spark UI's description of each launch, e.g. "train ddp: 2 ranks, attempt 1/3"."""
    sizes: list[int] = []

    def launch(attempt: int) -> list:
        ranks = placeable_ranks(spark, num_ranks, min_ranks, elastic_wait_s) if min_ranks else num_ranks
        sizes.append(ranks)
        return run_barrier(
            spark,
            fn,
            payload_for(attempt),
            ranks,
            backend,
            description=f"{label}: {ranks} ranks ({backend.name}), attempt {attempt + 1}/{max_attempts}",
            **launch_options,
        )

    return replace(relaunch(launch, max_attempts), world_sizes=tuple(sizes))


def relaunch(launch: Callable[[int], list[R]], max_attempts: int, wrap: bool = True) -> Launched[R]:
    """`launch(attempt)` until it returns; a `RankFailure` that a relaunch cannot help ends it at once.
    In the end a `TrainingFailed` that names the attempts, or with `wrap=False` the last `RankFailure`
    itself (the distributor API raises the per-rank report, as its callers catch it)."""
    failures: list[str] = []
    for attempt in range(max_attempts):
        try:
            results = launch(attempt)
        except RankFailure as failure:
            failures.append(f"attempt {attempt + 1} of {max_attempts}: {failure}")
            log.warning("attempt %d/%d failed: %s", attempt + 1, max_attempts, str(failure).splitlines()[0])
            if not wrap and (not failure.retryable or attempt + 1 == max_attempts):
                raise
            if not failure.retryable:
                raise TrainingFailed(attempt + 1, failures[-1], retryable=False) from None
            continue
        if failures:
            log.info("finished on attempt %d after %d failure(s)", attempt + 1, len(failures))
        return Launched(results, attempt + 1)
    raise TrainingFailed(max_attempts, failures[-1])
