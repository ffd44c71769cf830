"""The picklable description of one training run, sent to every rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkml_dist.config.schema import TrainConfig
from sparkml_dist.data.dataset import RowGroup
from sparkml_dist.tracking.client import RunHandle


@dataclass(frozen=True)
class TrainJob:
    data_root: str
    train_groups: tuple[RowGroup, ...]
    val_groups: tuple[RowGroup, ...]
    model_spec: dict[str, Any]
    train: TrainConfig
    checkpoint_dir: str
    run: RunHandle | None = None
