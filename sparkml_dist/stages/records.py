"""The JSON records a stage leaves for the next one (written atomically through storage): the
train stage's `train.json` and the evaluate stage's `evaluate.json`. Scheduled workflows run each
stage as its own job, so this is how `register` learns which model `train` produced."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkml_dist import storage
from sparkml_dist.tasks.base import Target
from sparkml_dist.train.records import EpochRecord


@dataclass(frozen=True)
class TrainRecord:
    run_id: str
    model_uri: str
    tracking_uri: str
    method: str
    records: tuple[EpochRecord, ...]

    @property
    def last_epoch(self) -> int:
        return self.records[-1].epoch if self.records else 0

    def save(self, uri: str) -> str:
        return storage.write_json(
            uri,
            {
                "run_id": self.run_id,
                "model_uri": self.model_uri,
                "tracking_uri": self.tracking_uri,
                "method": self.method,
                "records": [r.to_json() for r in self.records],
            },
        )

    @staticmethod
    def load(uri: str) -> TrainRecord | None:
        if not storage.exists(uri):
            return None
        raw = storage.read_json(uri)
        return TrainRecord(
            raw["run_id"],
            raw["model_uri"],
            raw["tracking_uri"],
            raw.get("method", ""),
            tuple(EpochRecord.from_json(r) for r in raw.get("records", [])),
        )


@dataclass(frozen=True)
class EvaluateRecord:
    model_uri: str
    metrics: dict[str, float]
    target: Target | None = None  # the model's (its task decides the gate's metric and direction)

    def save(self, uri: str) -> str:
        return storage.write_json(
            uri,
            {
                "model_uri": self.model_uri,
                "metrics": self.metrics,
                "target": self.target.to_json() if self.target else None,
            },
        )

    @staticmethod
    def load(uri: str) -> EvaluateRecord | None:
        if not storage.exists(uri):
            return None
        raw: dict[str, Any] = storage.read_json(uri)
        return EvaluateRecord(raw["model_uri"], raw["metrics"], Target.from_json(raw.get("target")))
