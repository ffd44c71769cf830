"""Typed, picklable errors. Each one says what is wrong and what to do about it.

Whether a failure is worth another attempt is a property of its type (`retryable`), not of its
name: a rank that met bad data or a bad config would meet it again on every relaunch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar


class SparkMLDistError(Exception):
    """Base class for every error this library raises on purpose."""

    retryable: ClassVar[bool] = True  # may another attempt of the same job succeed?


class ConfigError(SparkMLDistError, ValueError):
    """A config value is missing, unknown or out of range. The message names the key path."""

    retryable = False


class PrerequisiteError(SparkMLDistError, RuntimeError):
    """Something the machine must provide (Java 17, a package) is missing."""

    retryable = False


class DataError(SparkMLDistError, ValueError):
    """Input data is structurally unusable (missing columns, empty input, schema drift)."""

    retryable = False


class UserCodeError(SparkMLDistError, ValueError):
    """The user's training function, script or model factory cannot be used as given (not picklable,
    not found, not importable, the wrong output shape). The message names it and the fix."""

    retryable = False


class StorageError(SparkMLDistError, OSError):
    """A location cannot be read or written (unknown scheme, missing file system support)."""

    retryable = False


class OutputInUseError(SparkMLDistError, RuntimeError):
    """Another live job is writing the same output; the second writer is refused (never retried:
    a relaunch would only meet the first one again or race it)."""

    retryable = False


class RendezvousError(SparkMLDistError, RuntimeError):
    """A rank could not join its launch's process group (torch.distributed's or Horovod's init).
    It never ran its function and no other rank can have got past its first collective, so the
    launcher launches the stage once more (launch.launcher)."""


class SlotError(SparkMLDistError, RuntimeError):
    """The cluster has fewer task slots than the barrier stage needs ranks."""

    def __init__(self, available: int | None, requested: int, detail: str = "", key: str = "train.num_ranks"):
        self.available = available  # None: not known here (a Spark Connect client sees no executors)
        self.requested = requested
        self.detail = detail
        self.key = key  # what the caller set the rank count with
        known = available is not None
        have = f"{available} task slots available" if known else "fewer task slots than ranks"
        limit = f" to at most {available}" if known else ""
        super().__init__(
            f"{have}, {requested} ranks requested: lower {key}{limit}, or give the cluster more cores "
            f"(local[N] / more executors).{detail}"
        )

    def __reduce__(self):
        return (SlotError, (self.available, self.requested, self.detail, self.key))


def is_retryable(exc: BaseException) -> bool:
    """An exception's own verdict; errors that are not ours (a lost peer, a crash) may pass on retry."""
    return bool(getattr(exc, "retryable", True))


@dataclass(frozen=True)
class RankReport:
    """What one failed rank says about itself; travels from the rank to the driver as JSON."""

    rank: int
    host: str
    exc_type: str
    message: str
    traceback: str = ""
    output_tail: str = ""
    retryable: bool = True

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(raw: dict) -> RankReport:
        return RankReport(**{k: raw[k] for k in RankReport.__dataclass_fields__ if k in raw})


class RankFailure(SparkMLDistError, RuntimeError):
    """One or more ranks of a barrier stage raised. Carries each rank's report."""

    def __init__(self, reports: list[RankReport], stage_error: str = ""):
        self.reports = list(reports)
        self.stage_error = stage_error
        super().__init__(self._describe(self.reports, stage_error))

    @staticmethod
    def _describe(reports: list[RankReport], stage_error: str) -> str:
        if not reports:
            return (
                "the barrier stage failed and no rank sent a report (if the rank code never started, "
                f"look for an import or pickling problem): {stage_error}"
            )
        lines = []
        for r in reports:
            where = f" (host {r.host})" if r.host else ""
            lines.append(f"rank {r.rank}{where} failed: {r.exc_type}: {r.message}")
            if r.output_tail:
                lines.append(f"--- last output of rank {r.rank} ---\n{r.output_tail.rstrip()}")
            if r.traceback:
                lines.append(f"--- traceback of rank {r.rank} ---\n{r.traceback.rstrip()}")
        return "\n".join(lines)

    @property
    def ranks(self) -> list[int]:
        return [r.rank for r in self.reports]

    @property
    def retryable(self) -> bool:  # type: ignore[override]  # per instance: decided by the ranks' own errors
        """False when a rank failed on the data or the config (the others then fail waiting for it)."""
        return all(r.retryable for r in self.reports)

    @property
    def in_rendezvous(self) -> bool:
        """True when every reporting rank failed to join the process group, before its function ran."""
        return bool(self.reports) and all(r.exc_type == RendezvousError.__name__ for r in self.reports)

    def __reduce__(self):
        return (RankFailure, (self.reports, self.stage_error))


class TrainingFailed(SparkMLDistError, RuntimeError):
    """Training failed on every attempt; carries the last attempt's rank failure."""

    def __init__(self, attempts: int, last_failure: str, retryable: bool = True):
        self.attempts = attempts
        self.last_failure = last_failure
        self.retryable = retryable  # type: ignore[misc]  # per instance: was the last failure worth retrying
        advice = (
            "raise train.max_attempts or fix the cause"
            if retryable
            else "not relaunched: a rank failed on the data or the config, which a relaunch would meet "
            "again; fix the cause"
        )
        super().__init__(
            f"training failed after {attempts} attempt(s), each resumed from the last checkpoint; "
            f"{advice}. Last failure:\n{last_failure}"
        )

    def __reduce__(self):
        return (TrainingFailed, (self.attempts, self.last_failure, self.retryable))
