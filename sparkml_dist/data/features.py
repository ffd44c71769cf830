"""Feature engineering with Spark ML: impute, index (unseen-safe), one-hot, scale, assemble.

The fitted PipelineModel is saved next to the data and inside the MLflow model, so scoring
starts from raw columns exactly as training did.
"""

from __future__ import annotations

from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import (
    Imputer,
    OneHotEncoder,
    SQLTransformer,
    StandardScaler,
    StringIndexer,
    VectorAssembler,
)
from pyspark.ml.functions import vector_to_array
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkml_dist.config.schema import DataConfig, FeatureConfig
from sparkml_dist.data.ingest import LABEL, ROW_ID

FEATURES = "features"
MISSING_CATEGORY = "__missing__"
_VECTOR = "_features_vec"


def build_feature_pipeline(data: DataConfig, feats: FeatureConfig) -> Pipeline:
    cats = data.names_with_role("categorical")
    nums = data.names_with_role("numeric")
    stages: list = []
    parts: list[str] = []
    if nums:
        imputed = [f"{n}__imputed" for n in nums]
        stages.append(Imputer(inputCols=nums, outputCols=imputed, strategy=feats.impute_strategy))
        stages.append(VectorAssembler(inputCols=imputed, outputCol="_num_vec", handleInvalid="keep"))
        if feats.scale_numeric:
            stages.append(StandardScaler(inputCol="_num_vec", outputCol="_num_scaled", withMean=True, withStd=True))
            parts.append("_num_scaled")
        else:
            parts.append("_num_vec")
    if cats:
        filled = ", ".join(
            f"coalesce(CAST(`{c}` AS STRING), '{MISSING_CATEGORY}') AS `{c}__filled`" for c in cats
        )
        stages.append(SQLTransformer(statement=f"SELECT *, {filled} FROM __THIS__"))
        indexed = [f"{c}__index" for c in cats]
        # handleInvalid="keep": a category never seen in training gets its own slot, not an error
        stages.append(StringIndexer(inputCols=[f"{c}__filled" for c in cats], outputCols=indexed,
                                    handleInvalid="keep", stringOrderType="frequencyDesc"))
        if feats.one_hot:
            encoded = [f"{c}__onehot" for c in cats]
            # the indexer already gives unseen categories their own index, so OHE needs no extra slot
            stages.append(OneHotEncoder(inputCols=indexed, outputCols=encoded, dropLast=False, handleInvalid="error"))
            parts.extend(encoded)
        else:
            parts.extend(indexed)
    stages.append(VectorAssembler(inputCols=parts, outputCol=_VECTOR))
    return Pipeline(stages=stages)


def to_feature_frame(model: PipelineModel, df: DataFrame, with_label: bool = True,
                     extra: tuple[str, ...] = ()) -> DataFrame:
    """Raw typed columns -> (row_id, [extra...,] features: array<float>[, label: float])."""
    out = model.transform(df)
    cols = [F.col(ROW_ID), *[F.col(c) for c in extra], vector_to_array(F.col(_VECTOR), "float32").alias(FEATURES)]
    if with_label:
        cols.append(F.col(LABEL).cast("float").alias(LABEL))
    return out.select(*cols)


def feature_names(model: PipelineModel, sample: DataFrame) -> list[str]:
    """Names of the assembled vector's slots, from Spark ML's attribute metadata."""
    meta = model.transform(sample.limit(1)).schema[_VECTOR].metadata.get("ml_attr", {})
    slots: list[tuple[int, str]] = []
    for group in meta.get("attrs", {}).values():
        slots.extend((a["idx"], a.get("name", f"f{a['idx']}")) for a in group)
    if slots:
        return [name for _, name in sorted(slots)]
    return [f"f{i}" for i in range(meta.get("num_attrs", 0))]
