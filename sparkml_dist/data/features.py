"""Feature engineering with Spark ML: impute, index (unseen-safe), one-hot, scale, assemble.

The fitted PipelineModel is saved next to the data and inside the MLflow model, so scoring
starts from raw columns exactly as training did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import (
    Imputer,
    ImputerModel,
    OneHotEncoder,
    OneHotEncoderModel,
    SQLTransformer,
    StandardScaler,
    StandardScalerModel,
    StringIndexer,
    StringIndexerModel,
    VectorAssembler,
)
from pyspark.ml.functions import vector_to_array
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparkml_dist import storage
from sparkml_dist.config.schema import DataConfig, FeatureConfig
from sparkml_dist.data.imputer import ImputedScaler, OnePassImputer
from sparkml_dist.data.indexer import MostFrequentIndexer
from sparkml_dist.data.ingest import LABEL, ROW_ID
from sparkml_dist.data.layout import VALUES, FeatureBlock, FeatureLayout
from sparkml_dist.data.packed import PACKED, packed_columns
from sparkml_dist.data.raw_features import (
    MISSING_CATEGORY,
    RAW_FEATURES_FILE,
    CategorySlot,
    NumericSlot,
    RawFeatures,
    Slot,
)
from sparkml_dist.data.sql import double, ident
from sparkml_dist.spark.rows import only_row

FEATURES = "features"
_VECTOR = "_features_vec"


def build_feature_pipeline(data: DataConfig, feats: FeatureConfig) -> Pipeline:
    cats = data.names_with_role("categorical")
    nums = data.names_with_role("numeric")
    stages: list = []
    parts: list[str] = []
    if nums:
        imputed = [f"{n}__imputed" for n in nums]
        imputer = Imputer(inputCols=nums, outputCols=imputed, strategy=feats.impute_strategy)
        one_pass = OnePassImputer(imputer)
        stages.append(one_pass)
        stages.append(VectorAssembler(inputCols=imputed, outputCol="_num_vec", handleInvalid="keep"))
        if feats.scale_numeric:
            scaler = StandardScaler(inputCol="_num_vec", outputCol="_num_scaled", withMean=True, withStd=True)
            stages.append(ImputedScaler(one_pass, scaler))  # its statistics come from the imputer's pass
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
        indexer = StringIndexer(
            inputCols=[f"{c}__filled" for c in cats],
            outputCols=indexed,
            handleInvalid="keep",
            stringOrderType="frequencyDesc",
        )
        stages.append(
            indexer if feats.max_categories is None else MostFrequentIndexer(indexer, feats.max_categories)
        )
        if feats.one_hot:
            encoded = [f"{c}__onehot" for c in cats]
            # the indexer already gives unseen categories their own index, so OHE needs no extra slot
            stages.append(
                OneHotEncoder(inputCols=indexed, outputCols=encoded, dropLast=False, handleInvalid="error")
            )
            parts.extend(encoded)
        else:
            parts.extend(indexed)
    stages.append(VectorAssembler(inputCols=parts, outputCol=_VECTOR))
    return Pipeline(stages=stages)


def to_feature_frame(
    model: PipelineModel, df: DataFrame, with_label: bool = True, extra: tuple[str, ...] = ()
) -> DataFrame:
    """Raw typed columns -> (row_id, [extra...,] features: array<float>[, label: float])."""
    out = model.transform(df)
    cols = [
        F.col(ROW_ID),
        *[F.col(c) for c in extra],
        vector_to_array(F.col(_VECTOR), "float32").alias(FEATURES),
    ]
    if with_label:
        cols.append(F.col(LABEL).cast("float").alias(LABEL))
    return out.select(*cols)


def feature_names(model: PipelineModel, sample: DataFrame) -> list[str]:
    """Names of the assembled vector's slots: the compiled slots' (`RawFeatures.names`), else
    Spark ML's attribute metadata, which a transform of `sample` computes (for a wide source,
    a plan of hundreds of columns analysed for a name each)."""
    raw = raw_features(model)
    if raw is not None:
        return raw.names
    meta = model.transform(sample.limit(1)).schema[_VECTOR].metadata.get("ml_attr", {})
    slots: list[tuple[int, str]] = []
    for group in meta.get("attrs", {}).values():
        slots.extend((a["idx"], a.get("name", f"f{a['idx']}")) for a in group)
    if slots:
        return [name for _, name in sorted(slots)]
    return [f"f{i}" for i in range(meta.get("num_attrs", 0))]


@dataclass(frozen=True)
class CompiledFeatures:
    """A fitted feature pipeline as plain SQL expressions, one per layout block."""

    layout: FeatureLayout
    columns: tuple[Column, ...]
    blocks: tuple[tuple[FeatureBlock, tuple[Slot, ...]], ...]  # what `columns` compile, block by block

    def frame(self, df: DataFrame, with_label: bool = True, extra: tuple[str, ...] = ()) -> DataFrame:
        """Raw typed columns -> row_id, [extra...,] one column per block[, label (float)]. A
        VALUES block whose numbers `df` carries packed (`data/packed.py`) is computed from the
        array, the same values in one expression."""
        label = [F.col(LABEL).cast("float").alias(LABEL)] if with_label else []
        packed = packed_columns(df)
        columns = [
            _packed_values_sql(block, slots) if _reads_packed(block, slots, packed) else column
            for (block, slots), column in zip(self.blocks, self.columns)
        ]
        return df.select(F.col(ROW_ID), *[F.col(c) for c in extra], *columns, *label)


def scoring_frame(
    model: PipelineModel, rows: DataFrame, with_label: bool = True, extra: tuple[str, ...] = ()
) -> tuple[DataFrame, FeatureLayout | None]:
    """Raw rows -> what `score_features` reads: the compiled per-feature columns with their
    layout (14 narrow columns cross to Python instead of a 116-float array), or, for a pipeline
    that does not compile, the dense `features` column and None."""
    return ScoringPipeline.of(model).frame(rows, with_label=with_label, extra=extra)


@dataclass(frozen=True)
class ScoringPipeline:
    """A fitted feature pipeline as scoring applies it: compiled to SQL when it compiles, else
    the Spark ML model itself (exactly one of the two is set)."""

    compiled: CompiledFeatures | None = None
    model: PipelineModel | None = None

    @staticmethod
    def of(model: PipelineModel) -> ScoringPipeline:
        compiled = compile_features(model)
        return ScoringPipeline(compiled) if compiled is not None else ScoringPipeline(model=model)

    @staticmethod
    def load(path: str, stages_at: str | None = None) -> ScoringPipeline:
        """A saved pipeline (a path or URI, read here on the driver; `stages_at`: the same
        pipeline where Spark's executors can read it, if elsewhere). Preprocess saves a compiling
        pipeline's slots as plain data beside its stages (`raw_features.json`, the values
        `raw_features` reads from the stages): they are all scoring needs, without Spark ML's
        load, which reads every stage's metadata and data with Spark jobs (docs/benchmarks.md,
        "Loading the feature pipeline"). Without that file, the stages are loaded."""
        raw = saved_raw_features(path)
        if raw is not None:
            return ScoringPipeline(compiled_from(raw))
        return ScoringPipeline.of(PipelineModel.load(storage.spark_path(stages_at or path)))

    def frame(
        self, rows: DataFrame, with_label: bool = True, extra: tuple[str, ...] = ()
    ) -> tuple[DataFrame, FeatureLayout | None]:
        """See `scoring_frame`."""
        if self.compiled is not None:
            return self.compiled.frame(rows, with_label=with_label, extra=extra), self.compiled.layout
        assert self.model is not None  # exactly one of the two is set
        return to_feature_frame(self.model, rows, with_label=with_label, extra=extra), None


def saved_raw_features(path: str) -> RawFeatures | None:
    """The slots preprocess saved beside a compiling pipeline's stages (`raw_features.json` in
    its directory, a path or URI); None for a pipeline saved without them."""
    saved = storage.join(path, RAW_FEATURES_FILE)
    return RawFeatures.from_json(storage.read_json(saved)) if storage.exists(saved) else None


def compile_features(model: PipelineModel) -> CompiledFeatures | None:
    """What `to_feature_frame` computes, stored compactly (see data/layout.py): the fitted stages
    become SQL expressions that reproduce Spark ML's arithmetic exactly (tests/test_features.py
    compares every slot), and skip the vector type's per-row conversions. None when the
    pipeline is not one `build_feature_pipeline` made."""
    raw = raw_features(model)
    return None if raw is None else compiled_from(raw)


def compiled_from(raw: RawFeatures) -> CompiledFeatures:
    """The slots as SQL columns, one per layout block."""
    blocks = raw.blocks()
    cols = [_block_sql(block, slots) for block, slots in blocks]
    return CompiledFeatures(FeatureLayout(tuple(block for block, _ in blocks)), tuple(cols), tuple(blocks))


def _reads_packed(block: FeatureBlock, slots: tuple[Slot, ...], packed: list[str] | None) -> bool:
    return block.kind == VALUES and packed is not None and [s.source for s in slots] == packed


def _packed_values_sql(block: FeatureBlock, slots: tuple[Slot, ...]) -> Column:
    """`_numeric_value` of each slot over the packed array: element i with slot i's surrogate,
    mean and inverse std taken from constant arrays. One lambda instead of hundreds of
    expressions, which Spark would analyse and compile for each plan (the same doubles, the
    same float: tests/test_features.py)."""
    numeric = [cast(NumericSlot, s) for s in slots]

    def constants(values: list[float | None]) -> str:
        return "array(" + ", ".join(double(cast(float, v)) for v in values) + ")"

    scaled = all(s.mean is not None and s.inv_std is not None for s in numeric)
    value = _imputed_scaled(
        "x",
        f"{constants([s.surrogate for s in numeric])}[i]",
        f"{constants([s.mean for s in numeric])}[i]" if scaled else None,
        f"{constants([s.inv_std for s in numeric])}[i]" if scaled else None,
    )
    return F.expr(f"transform({PACKED}, (x, i) -> {value}) AS {ident(block.column)}")


def _block_sql(block: FeatureBlock, slots: tuple[Slot, ...]) -> Column:
    if block.kind == VALUES:  # one array column: the numbers' expressions, in one SQL text
        values = ", ".join(_numeric_value(cast(NumericSlot, s)) for s in slots)
        return F.expr(f"array({values}) AS {ident(block.column)}")
    (slot,) = slots
    if isinstance(slot, NumericSlot):
        return F.expr(f"{_numeric_value(slot)} AS {ident(slot.name)}")
    return _category_sql(slot)


def raw_features(model: PipelineModel) -> RawFeatures | None:
    """The fitted stages as plain data (`data.raw_features`: the same arithmetic in numpy,
    for scoring raw rows without Spark), in the assembler's order; None when the pipeline is not
    one `build_feature_pipeline` made."""
    kinds = [type(s) for s in model.stages]
    stages: dict[type, Any] = {
        type(s): s for s in model.stages if kinds.count(type(s)) == 1
    }  # each fitted stage once
    assembler = model.stages[-1]
    if not isinstance(assembler, VectorAssembler):
        return None
    slots: list[NumericSlot | CategorySlot] = []
    for part in assembler.getInputCols():
        if part in ("_num_scaled", "_num_vec") and ImputerModel in stages:
            if not math.isnan(stages[ImputerModel].getMissingValue()):
                return None  # the slots treat null and NaN as missing, Imputer's default
            scaler = stages.get(StandardScalerModel) if part == "_num_scaled" else None
            slots.extend(_numeric_slots(stages[ImputerModel], scaler))
        elif part.endswith(("__onehot", "__index")) and StringIndexerModel in stages:
            slot = _category_slot(stages, part)
            if slot is None:
                return None
            slots.append(slot)
        else:
            return None
    return RawFeatures(tuple(slots))


def _numeric_slots(imputer: ImputerModel, scaler: StandardScalerModel | None) -> list[NumericSlot]:
    """The fitted vectors fetched once: a 784-pixel input would otherwise make thousands of JVM
    calls (data/sql.py)."""
    surrogates = only_row(imputer.surrogateDF).asDict()
    columns = list(zip(imputer.getInputCols(), imputer.getOutputCols()))
    if scaler is None:
        return [NumericSlot(out, source, float(surrogates[source])) for source, out in columns]
    means, stds = scaler.mean.toArray(), scaler.std.toArray()
    return [
        NumericSlot(
            f"{source}__scaled",
            source,
            float(surrogates[source]),
            float(means[i]),
            0.0 if float(stds[i]) == 0 else 1.0 / float(stds[i]),
        )
        for i, (source, _) in enumerate(columns)
    ]


def _category_slot(stages: dict, part: str) -> CategorySlot | None:
    indexer: StringIndexerModel = stages[StringIndexerModel]
    source = part.rsplit("__", 1)[0]
    filled, name = f"{source}__filled", f"{source}__index"
    if filled not in indexer.getInputCols() or indexer.getHandleInvalid() != "keep":
        return None
    labels = tuple(indexer.labelsArray[indexer.getInputCols().index(filled)])
    if not part.endswith("__onehot"):
        return CategorySlot(name, source, labels, False, 1)
    encoder = stages.get(OneHotEncoderModel)
    if encoder is None or encoder.getDropLast():
        return None
    return CategorySlot(name, source, labels, True, encoder.categorySizes[encoder.getInputCols().index(name)])


def _numeric_value(slot: NumericSlot) -> str:
    """Imputer then StandardScaler, as Spark ML computes them, as SQL text (data/sql.py). A null
    or NaN value takes the surrogate: `nanvl` makes NaN null and `coalesce` fills it, the same
    as a CASE over both tests in 11 expression nodes, not 16. A 784-pixel row is 784 of these,
    and the nodes are what Spark analyses and compiles for each plan that writes or scores the
    features: a cold write of MNIST's training split 8.4-9.1 s as a CASE, 5.7-6.5 s so."""
    scaled = slot.mean is not None and slot.inv_std is not None
    return _imputed_scaled(
        f"CAST({ident(slot.source)} AS DOUBLE)",
        double(slot.surrogate),
        double(cast(float, slot.mean)) if scaled else None,
        double(cast(float, slot.inv_std)) if scaled else None,
    )


def _imputed_scaled(x: str, surrogate: str, mean: str | None, inv_std: str | None) -> str:
    """SQL: the double `x` imputed with `surrogate`, then, with `mean` and `inv_std`, scaled, as
    a float; each argument SQL text (a column's, a constant's or an array element's)."""
    value = f"coalesce(nanvl({x}, NULL), {surrogate})"
    if mean is not None and inv_std is not None:
        value = f"(({value} - {mean}) * {inv_std})"
    return f"CAST({value} AS FLOAT)"


def identifier_like(raw: RawFeatures, rows: int) -> list[str]:
    """What to say about each categorical column with about as many values as `rows` (the
    training rows): a title or a key, each value its own one-hot slot, that the model can only
    memorise. Spark ML indexes them without a word; tail numbers that repeat are not flagged."""
    return [
        f"data.columns: '{s.source}' has {len(s.labels):,} distinct values in {rows:,} training rows, so "
        f"nearly every value is a one-hot slot of its own (the input is {raw.layout.dim:,} wide) that the "
        f"model can only memorise. If it names the row, give it role id (passed through to the predictions) "
        f"or ignore; else keep its most frequent values with features.max_categories"
        for s in raw.slots
        if isinstance(s, CategorySlot) and len(s.labels) >= max(1000, rows // 2)
    ]


_LABEL_SEPARATOR = "\x1f"  # ASCII unit separator: not a regex metacharacter


def _label_positions(labels: tuple[str, ...] | list[str]) -> Column:
    """label -> its position, as a map. A few labels are a literal pair each; many (ggplot2movies'
    titles: 45,798) are one string split and one sequence, which Spark folds to the same map
    constant. A pair each was 90,000 Py4J calls to build the column (60 s) and minutes of
    analysing the plan that holds it, in every job that read the features."""
    if len(labels) <= 64 or any(_LABEL_SEPARATOR in label for label in labels):
        return F.create_map(*[x for i, label in enumerate(labels) for x in (F.lit(label), F.lit(i))])
    return F.map_from_arrays(
        F.split(F.lit(_LABEL_SEPARATOR.join(labels)), _LABEL_SEPARATOR, -1),
        F.sequence(F.lit(0), F.lit(len(labels) - 1)),
    )


def _category_sql(slot: CategorySlot) -> Column:
    """The label's position over the filled column, len(labels) for a value never seen."""
    lookup = _label_positions(slot.labels)
    value = F.coalesce(F.col(slot.source).cast("string"), F.lit(MISSING_CATEGORY))
    index = F.coalesce(F.try_element_at(lookup, value), F.lit(len(slot.labels)))
    return index.cast("int" if slot.one_hot else "float").alias(slot.name)
