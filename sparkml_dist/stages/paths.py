"""Where each stage writes, under `output.root`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparkml_dist.config.schema import JobConfig


@dataclass(frozen=True)
class OutputPaths:
    root: Path

    @staticmethod
    def of(cfg: JobConfig) -> "OutputPaths":
        return OutputPaths(Path(cfg.output.root).resolve())

    @property
    def preprocess(self) -> Path:
        return self.root / "preprocess"

    @property
    def predictions(self) -> Path:
        return self.root / "predictions"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def last_train(self) -> Path:
        """JSON record of the last train stage (run id, model URI), read by later stages."""
        return self.root / "train.json"

    @property
    def last_evaluate(self) -> Path:
        """JSON record of the last evaluate stage (model URI, test metrics), read by register."""
        return self.root / "evaluate.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    def checkpoints(self, run_id: str) -> Path:
        return self.root / "checkpoints" / run_id
