"""What every scorer of raw rows does before it scores (batch, streaming, evaluation,
fine-tuning): the model's feature pipeline loaded, and the columns checked against the ones the
model was trained on."""

from __future__ import annotations

from collections.abc import Mapping

from sparkml_dist.data.features import ScoringPipeline
from sparkml_dist.errors import DataError
from sparkml_dist.inference.bundle import ModelBundle

__all__ = ["check_schema", "load_pipeline"]


def load_pipeline(bundle: ModelBundle) -> ScoringPipeline:
    """The model's feature pipeline, read from the driver's copy (compiled, nothing for executors
    to read), or loaded where executors can read it."""
    return ScoringPipeline.load(
        bundle.feature_pipeline_path or bundle.spark_pipeline, stages_at=bundle.pipeline_for_spark
    )


def check_schema(schema: Mapping[str, str], bundle: ModelBundle) -> None:
    """The feature columns to score (`schema`: column -> "type/role") must be the ones the model
    was trained on."""
    if not bundle.training_schema:
        return
    features = ("numeric", "categorical")
    now = {k: v for k, v in schema.items() if v.split("/")[1] in features}
    then = {k: v for k, v in bundle.training_schema.items() if v.split("/")[1] in features}
    if now != then:
        missing = sorted(set(then) - set(now))
        extra = sorted(set(now) - set(then))
        changed = sorted(k for k in set(now) & set(then) if now[k] != then[k])
        raise DataError(
            f"schema drift: {bundle.uri} was trained on feature columns {sorted(then)}; the scoring "
            f"config differs: missing {missing}, unexpected {extra}, changed type/role {changed}. "
            f"Score with the training config's data.columns, or retrain."
        )
