"""Where each stage writes, under `output.root` (a path or a URI, see `storage.store`)."""

from __future__ import annotations

from dataclasses import dataclass

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.storage.store import absolute, join


@dataclass(frozen=True)
class OutputPaths:
    root: str

    @staticmethod
    def of(cfg: JobConfig) -> OutputPaths:
        return OutputPaths(absolute(cfg.output.root))

    def under(self, *parts: str) -> str:
        return join(self.root, *parts)

    @property
    def preprocess(self) -> str:
        return self.under("preprocess")

    @property
    def predictions(self) -> str:
        return self.under("predictions")

    @property
    def plots(self) -> str:
        return self.under("plots")

    @property
    def train_record(self) -> str:
        """JSON record of the last train stage (run id, model URI, epochs), read by later stages."""
        return self.under("train.json")

    @property
    def evaluate_record(self) -> str:
        """JSON record of the last evaluate stage (model URI, test metrics), read by register."""
        return self.under("evaluate.json")

    @property
    def summary(self) -> str:
        return self.under("summary.json")

    @property
    def models(self) -> str:
        """On a cluster: copies of logged models' feature pipelines, where executors read them."""
        return self.under("models")

    def checkpoints(self, run_id: str) -> str:
        return self.under("checkpoints", run_id)
