"""A trial's epoch sink: each epoch's record is logged on the trial's MLflow run (as every training
run's is) and its validation metric reported to the Optuna trial, whose pruner answers whether
the trial goes on. Rank 0 of the trial's barrier stage opens it, so the verdict comes at each
epoch end with no extra hop through the driver; every rank then stops together (`train.loop`)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkml_dist.tracking.client import EpochLogger
from sparkml_dist.train.records import EpochRecord
from sparkml_dist.tune.study import StudyRef

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialSink:
    logger: EpochLogger
    study: StudyRef
    trial_id: int  # Optuna's storage id of the trial (not its number)
    metric: str  # the epoch record's metric, e.g. val_accuracy
    may_stop: bool = True

    def __call__(self, record: EpochRecord) -> bool:
        """A driver-side method's epoch: logged and reported; its verdict is advisory there."""
        self.logger(record)
        return self.open_trial().report(record)

    def open(self) -> OpenTrialSink:
        return OpenTrialSink(self.logger.open(), self.open_trial())

    def open_trial(self) -> TrialReporter:
        import optuna

        return TrialReporter(optuna.trial.Trial(self.study.load(), self.trial_id), self.metric)


@dataclass
class TrialReporter:
    trial: optuna.trial.Trial
    metric: str

    def report(self, record: EpochRecord) -> bool:
        value = record.metrics().get(self.metric)
        if value is None or not math.isfinite(value):
            return False
        self.trial.report(value, record.epoch)
        pruned = bool(self.trial.should_prune())  # Optuna answers a numpy bool
        if pruned:
            log.info(
                "trial %d pruned after epoch %d (%s %.4f)",
                self.trial.number,
                record.epoch + 1,
                self.metric,
                value,
            )
        return pruned


class OpenTrialSink:
    """Rank 0's side: the run's background metric log plus the trial's reporter."""

    def __init__(self, background, reporter: TrialReporter):
        self._background, self._reporter = background, reporter

    def __call__(self, record: EpochRecord) -> bool:
        self._background(record)
        return self._reporter.report(record)

    def close(self) -> None:
        self._background.close()
