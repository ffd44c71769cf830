"""Progress lines with throughput and ETA, printed by rank 0."""

from __future__ import annotations

import logging
import time

from sparkml_dist.train.records import EpochRecord

log = logging.getLogger("sparkml_dist.train")


def _clock(seconds: float) -> str:
    seconds = max(round(seconds), 0)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    def __init__(self, enabled: bool, epochs: int, steps_per_epoch: int, world_size: int, label: str = ""):
        self.enabled = enabled
        self.prefix = f"{label}: " if label else ""  # which run, where several train at once (tune trials)
        self.epochs = epochs
        self.steps_per_epoch = max(steps_per_epoch, 1)
        self.world_size = world_size
        self.start = time.perf_counter()
        self.steps_done = 0

    def advance(self) -> None:
        """One more step taken (every step, logged or not: the ETA's pace is per step)."""
        self.steps_done += 1

    def step(self, epoch: int, step: int, loss: float, samples_per_s: float) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        remaining = (self.epochs - epoch - 1) * self.steps_per_epoch + (self.steps_per_epoch - step - 1)
        eta = elapsed / self.steps_done * remaining
        shown = "n/a" if loss != loss else f"{loss:.4f}"  # NaN: a pipeline stage without the loss
        log.info(
            "%sepoch %d/%d step %d/%d loss %s %.0f samples/s (x%d ranks) eta %s",
            self.prefix,
            epoch + 1,
            self.epochs,
            step + 1,
            self.steps_per_epoch,
            shown,
            samples_per_s,
            self.world_size,
            _clock(eta),
        )

    def epoch_end(self, record: EpochRecord) -> None:
        if not self.enabled:
            return
        shown = f"train_loss {record.train_loss:.4f} samples_per_s {record.samples_per_s:.1f}"
        if record.evaluation is not None:
            e = record.evaluation
            shown += "".join(f" {name} {value:.4f}" for name, value in e.metrics().items())
        log.info(
            "%sepoch %d/%d done: %s (%d samples)",
            self.prefix,
            record.epoch + 1,
            self.epochs,
            shown,
            record.samples,
        )
        if record.stragglers:
            log.warning(
                "%sepoch %d: straggler rank(s) %s: median step time above the straggler factor x the ranks' "
                "median",
                self.prefix,
                record.epoch + 1,
                list(record.stragglers),
            )
