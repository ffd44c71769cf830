"""Elastic world size: how many ranks a launch can have now. A lost host takes its executors'
task slots with it; a launch waits `wait_s` for the full count, then continues with what is
there if that is at least the minimum (data parallelism resumes at any world size)."""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession

from sparkml_dist.errors import SlotError
from sparkml_dist.spark.capacity import slot_gap
from sparkml_dist.spark.session import task_slots

log = logging.getLogger(__name__)


def placeable_ranks(spark: SparkSession, wanted: int, minimum: int, wait_s: float) -> int:
    """`wanted` if that many slots appear within `wait_s`, else the slots there are (>= `minimum`)."""

    slots = task_slots(spark, wanted=wanted, wait_s=wait_s)
    if slots >= wanted:
        return wanted
    if slots >= minimum:
        log.warning(
            "elastic: %d of %d ranks can be placed after waiting %.0f s (train.elastic_wait_s); training "
            "continues with %d ranks (train.min_ranks=%d) from the last checkpoint",
            slots,
            wanted,
            wait_s,
            slots,
            minimum,
        )
        return slots
    raise SlotError(slots, minimum, slot_gap(spark))
