"""What scoring needs of a model: its spec, its weights and its feature pipeline."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.tasks.base import UNRECORDED_TARGET, Target


@dataclass(frozen=True)
class ModelBundle:
    spec: ModelSpec
    weights: bytes  # torch.save(state_dict); loaded with weights_only=True (models.weights)
    feature_pipeline_path: str | None = None
    uri: str = ""
    training_schema: dict[str, str] | None = None  # column -> "type/role" the model was trained on
    target: Target = UNRECORDED_TARGET  # what the outputs mean (models logged before targets: binary)
    code_paths: tuple[str, ...] = ()  # a custom model's code, as logged with it (models.custom.ship_code)
    # the feature pipeline where Spark's executors can read it (on a cluster: a copy under the
    # output root, since feature_pipeline_path is on the driver's own disk)
    executor_pipeline_path: str | None = None

    @property
    def pipeline_for_spark(self) -> str | None:
        return self.executor_pipeline_path or self.feature_pipeline_path

    @property
    def spark_pipeline(self) -> str:
        """`pipeline_for_spark`, for what encodes raw rows with it (scoring, fine-tuning)."""
        if self.pipeline_for_spark is None:
            raise ValueError(
                f"model {self.uri or '(in memory)'} carries no feature pipeline, so it cannot encode raw "
                f"rows; use a model that sparkml_dist registered (it logs the pipeline with the weights)"
            )
        return self.pipeline_for_spark

    @property
    def key(self) -> str:
        """Identifies the weights, so executors can cache one model per process per key."""
        return hashlib.sha256(self.weights).hexdigest()[:16]
