"""Typed, picklable errors. Each one says what is wrong and what to do about it."""

from __future__ import annotations


class SparkMLDistError(Exception):
    """Base class for every error this library raises on purpose."""


class ConfigError(SparkMLDistError, ValueError):
    """A config value is missing, unknown or out of range. The message names the key path."""


class PrerequisiteError(SparkMLDistError, RuntimeError):
    """Something the machine must provide (Java 17, a package) is missing."""


class DataError(SparkMLDistError, ValueError):
    """Input data is structurally unusable (missing columns, empty input, schema drift)."""


class SlotError(SparkMLDistError, RuntimeError):
    """The cluster has fewer task slots than the barrier stage needs ranks."""

    def __init__(self, available: int, requested: int):
        self.available = available
        self.requested = requested
        super().__init__(
            f"{available} task slots available, {requested} ranks requested: "
            f"lower train.num_ranks to at most {available}, or give the cluster more cores "
            f"(local[N] / more executors)."
        )

    def __reduce__(self):
        return (SlotError, (self.available, self.requested))


# A rank that raised one of these met bad data or a bad config: a relaunch would meet it again.
NOT_RETRIED = frozenset({"DataError", "ConfigError"})


class RankFailure(SparkMLDistError, RuntimeError):
    """One or more ranks of a barrier stage raised. Carries each rank's report."""

    def __init__(self, reports: list[dict], stage_error: str = ""):
        self.reports = reports
        self.stage_error = stage_error
        super().__init__(self._describe(reports, stage_error))

    @staticmethod
    def _describe(reports: list[dict], stage_error: str) -> str:
        if not reports:
            return ("the barrier stage failed before any rank could report (rank code did not start: "
                    f"look for an import or pickling problem): {stage_error}")
        lines = []
        for r in reports:
            lines.append(
                f"rank {r['rank']} (host {r.get('host', '?')}) failed: "
                f"{r['exc_type']}: {r['message']}"
            )
            tail = r.get("output_tail") or ""
            if tail:
                lines.append(f"--- last output of rank {r['rank']} ---\n{tail.rstrip()}")
            tb = r.get("traceback") or ""
            if tb:
                lines.append(f"--- traceback of rank {r['rank']} ---\n{tb.rstrip()}")
        return "\n".join(lines)

    @property
    def ranks(self) -> list[int]:
        return [r["rank"] for r in self.reports]

    @property
    def retryable(self) -> bool:
        """False when a rank failed on the data or the config (the others then fail waiting for it)."""
        return not any(r["exc_type"] in NOT_RETRIED for r in self.reports)

    def __reduce__(self):
        return (RankFailure, (self.reports, self.stage_error))


class TrainingFailed(SparkMLDistError, RuntimeError):
    """Training failed on every attempt; carries the last attempt's rank failure."""

    def __init__(self, attempts: int, last_failure: str, retryable: bool = True):
        self.attempts = attempts
        self.last_failure = last_failure
        self.retryable = retryable
        advice = ("raise train.max_attempts or fix the cause" if retryable else
                  "not relaunched: a rank failed on the data or the config, which a relaunch would meet "
                  "again; fix the cause")
        super().__init__(
            f"training failed after {attempts} attempt(s), each resumed from the last checkpoint; "
            f"{advice}. Last failure:\n{last_failure}"
        )

    def __reduce__(self):
        return (TrainingFailed, (self.attempts, self.last_failure, self.retryable))
