"""Feature pipeline: fixed-width vectors, imputation, and unseen categories at scoring time."""

import contextlib
import math

import numpy as np
import pytest
from pyspark.sql import functions as F
from test_ingest import small_config

from sparkml_dist.config import FeatureConfig
from sparkml_dist.data.features import build_feature_pipeline, feature_names, raw_features, to_feature_frame
from sparkml_dist.data.ingest import ingest

pytestmark = pytest.mark.spark


def test_features_have_fixed_width_and_survive_unseen_categories(spark, tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("30, 1.0, Paris, yes\n40, 2.0, Rome, no\n?, 3.0, ?, no\n50, 4.0, Rome, yes\n")
    score = tmp_path / "score.csv"
    score.write_text("35, 2.5, Tokyo, yes\n")  # Tokyo never seen in training
    cfg = small_config(train)
    rows = ingest(spark, str(train), cfg).accepted
    model = build_feature_pipeline(cfg, FeatureConfig()).fit(rows)
    feats = to_feature_frame(model, rows, with_label=False).collect()
    # 2 scaled numerics + city one-hot over {Rome, Paris, __missing__} + 1 unseen slot
    assert {len(r["features"]) for r in feats} == {6}
    assert all(all(v == v for v in r["features"]) for r in feats), "no NaN after imputation"
    # each slot named by its column; the categories' names are Spark ML's own attribute names
    names = feature_names(model, rows)
    assert names[:2] == ["age__scaled", "score__scaled"]
    assert (
        names[2:]
        == spark_ml_slot_names(model, rows)[2:]
        == ["city__onehot_Rome", "city__onehot_Paris", "city__onehot___missing__", "city__onehot___unknown"]
    )
    unseen = to_feature_frame(model, ingest(spark, str(score), cfg).accepted, with_label=False).collect()
    assert len(unseen) == 1 and len(unseen[0]["features"]) == 6
    assert unseen[0]["features"][-1] == 1.0, "the unseen category lands in the extra slot"


def spark_ml_slot_names(model, rows) -> list[str]:
    """The assembled vector's slot names as Spark ML's attribute metadata gives them."""
    meta = model.transform(rows.limit(1)).schema["_features_vec"].metadata["ml_attr"]["attrs"]
    return [name for _, name in sorted((a["idx"], a["name"]) for group in meta.values() for a in group)]


def test_scaled_numerics_are_standardised(spark, tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("".join(f"{20 + i}, {i}.0, A, yes\n" for i in range(50)))
    cfg = small_config(train)
    rows = ingest(spark, str(train), cfg).accepted
    out = to_feature_frame(build_feature_pipeline(cfg, FeatureConfig()).fit(rows), rows, with_label=False)
    stats = out.select(
        F.avg(F.col("features")[0]).alias("m"), F.stddev(F.col("features")[0]).alias("s")
    ).first()
    assert abs(stats["m"]) < 1e-5 and abs(stats["s"] - 1) < 1e-5


def _dense_from_compact(model, rows):
    """What a rank reads: the compact columns, turned into vectors by the stored layout."""
    from sparkml_dist.data.features import compile_features

    compiled = compile_features(model)
    assert compiled is not None, "a pipeline build_feature_pipeline made must compile"
    table = compiled.frame(rows, with_label=False).orderBy("row_id").toArrow()
    return compiled.layout, compiled.layout.to_dense(table)


def _dense_from_spark_ml(model, rows):
    from sparkml_dist.data.loader import features_to_numpy

    return features_to_numpy(
        to_feature_frame(model, rows, with_label=False).orderBy("row_id").toArrow().column("features")
    )


@pytest.mark.parametrize(
    "one_hot,scale,impute", [(True, True, "median"), (False, False, "median"), (True, True, "mean")]
)
def test_compact_storage_rebuilds_spark_ml_vectors_exactly(spark, tmp_path, one_hot, scale, impute):
    """Every slot of every row equals Spark ML's own output, from the compiled SQL columns and from
    numpy over the raw rows: missing numbers and categories, a category never seen in training, a
    constant column (std 0), with and without one-hot/scaling."""
    train = tmp_path / "train.csv"
    train.write_text(
        "".join(f"{20 + i % 7}, 1.5, {['Paris', 'Rome', 'Oslo'][i % 3]}, yes\n" for i in range(30))
        + "?, 1.5, ?, no\n41, 1.5, Rome, no\n"
    )
    score = tmp_path / "score.csv"
    score.write_text("35, 1.5, Tokyo, yes\n?, 1.5, Paris, no\n33, 1.5, ?, no\n")
    cfg = small_config(train)
    model = build_feature_pipeline(
        cfg, FeatureConfig(one_hot=one_hot, scale_numeric=scale, impute_strategy=impute)
    ).fit(ingest(spark, str(train), cfg).accepted)
    for path in (train, score):
        rows = ingest(spark, str(path), cfg).accepted
        layout, compact = _dense_from_compact(model, rows)
        dense = _dense_from_spark_ml(model, rows)
        assert compact.shape == dense.shape and layout.dim == dense.shape[1]
        assert np.array_equal(compact, dense), f"{path.name}: compact storage differs from Spark ML"
        # and in numpy from the raw rows, as the logged model scores them without Spark
        raw = rows.orderBy("row_id").toPandas()
        assert np.array_equal(raw_features(model).dense(raw), dense), (
            f"{path.name}: numpy differs from Spark ML"
        )
    assert [b.kind for b in layout.blocks] == ["value", "value", "onehot" if one_hot else "value"]
    # the manifest's names: a category's are Spark ML's own, a number's its column's
    names = feature_names(model, rows)
    done = "scaled" if scale else "imputed"
    assert names[:2] == [f"age__{done}", f"score__{done}"] and len(names) == layout.dim
    assert names[2:] == spark_ml_slot_names(model, rows)[2:]


@pytest.mark.parametrize("one_hot", [True, False])
def test_a_category_with_thousands_of_values_compiles_at_once_and_matches_spark_ml(spark, tmp_path, one_hot):
    """3,000 cities (a title or a tail number column is tens of thousands) are looked up through
    a map Spark folds from one string, not a literal pair each: building the columns and planning
    a job over them took minutes at 45,798 values (ggplot2movies' titles). Values with regex
    metacharacters, a never-seen city and a missing one land where Spark ML puts them."""
    from sparkml_dist.data.features import compile_features

    cities = [f"c{i}" for i in range(3000)] + ["a.b", "(x|y)", "$ 1000", "[", "\\", "^x*"]
    train = tmp_path / "train.csv"
    train.write_text(
        "".join(f"{20 + i % 7}, 1.5, {city}, yes\n" for i, city in enumerate(cities)) + "?, 1.5, ?, no\n"
    )
    score = tmp_path / "score.csv"
    score.write_text(
        "35, 1.5, Tokyo, yes\n?, 1.5, (x|y), no\n33, 1.5, ?, no\n40, 2.5, c2999, no\n41, 1.5, ^x*, no\n"
    )
    cfg = small_config(train)
    model = build_feature_pipeline(cfg, FeatureConfig(one_hot=one_hot)).fit(
        ingest(spark, str(train), cfg).accepted
    )
    planned = spark.createDataFrame([("Oslo",)], "city string").select(compile_features(model).columns[-1])
    leaves = planned._jdf.queryExecution().analyzed().expressions().head().collectLeaves().size()
    assert leaves < 10, f"the city's lookup is {leaves} expressions (it was two literals a city)"
    for path in (train, score):
        rows = ingest(spark, str(path), cfg).accepted
        layout, compact = _dense_from_compact(model, rows)
        assert np.array_equal(compact, _dense_from_spark_ml(model, rows)), (
            f"{path.name}: differs from Spark ML"
        )
    assert layout.dim == (2 + len(cities) + 2 if one_hot else 3), (
        "every city, the missing one and the unseen slot"
    )


@pytest.mark.parametrize("one_hot", [True, False])
def test_max_categories_keeps_the_most_frequent_values_and_the_rest_share_the_unseen_slot(
    spark, tmp_path, one_hot
):
    """features.max_categories: 3 keeps the three most frequent cities (a tie broken
    alphabetically, as Spark's frequencyDesc order does); a rarer city, a missing one below the
    cut and one never seen all take the unseen slot. The compiled columns equal the capped Spark ML
    pipeline's own vectors, before and after it is saved and loaded, and so does numpy's."""
    from pyspark.ml import PipelineModel

    counts = {"Rome": 6, "Paris": 5, "Oslo": 4, "Bern": 4, "Kyiv": 2, "Lima": 1}
    train = tmp_path / "train.csv"
    train.write_text(
        "".join(f"{20 + i}, 1.5, {city}, yes\n" for city, n in counts.items() for i in range(n))
        + "?, 1.5, ?, no\n"
    )
    score = tmp_path / "score.csv"
    score.write_text(
        "35, 1.5, Tokyo, yes\n36, 1.5, Lima, no\n33, 1.5, ?, no\n40, 2.5, Oslo, no\n41, 2.5, Bern, no\n"
    )
    cfg = small_config(train)
    model = build_feature_pipeline(cfg, FeatureConfig(one_hot=one_hot, max_categories=3)).fit(
        ingest(spark, str(train), cfg).accepted
    )
    (cities,) = [s for s in raw_features(model).slots if s.source == "city"]
    assert cities.labels == ("Rome", "Paris", "Bern"), (
        "the three most frequent; Bern before Oslo at 4 rows each"
    )
    model.save(str(tmp_path / "pipeline"))
    for fitted in (model, PipelineModel.load(str(tmp_path / "pipeline"))):
        for path in (train, score):
            rows = ingest(spark, str(path), cfg).accepted
            layout, compact = _dense_from_compact(fitted, rows)
            assert np.array_equal(compact, _dense_from_spark_ml(fitted, rows)), (
                f"{path.name}: differs from Spark ML"
            )
            assert np.array_equal(raw_features(fitted).dense(rows.orderBy("row_id").toPandas()), compact), (
                "numpy"
            )
    assert layout.dim == (2 + 3 + 1 if one_hot else 3), "three cities and the slot the others share"
    city = compact[:, 2:]
    unseen = np.eye(4)[3] if one_hot else np.array([3.0])
    assert all(np.array_equal(row, unseen) for row in city[[0, 1, 2, 3]]), "Tokyo, Lima, missing and Oslo"
    assert not np.array_equal(city[4], unseen), "Bern keeps its own slot"
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        FeatureConfig(max_categories=0)


def test_compact_storage_matches_spark_ml_on_adult(spark, make_adult_config):
    cfg = make_adult_config()
    train = ingest(spark, cfg.data.train_path, cfg.data).accepted
    model = build_feature_pipeline(cfg.data, cfg.features).fit(train)
    test = ingest(spark, cfg.data.test_path, cfg.data).accepted
    layout, compact = _dense_from_compact(model, test)
    assert np.array_equal(compact, _dense_from_spark_ml(model, test))
    assert layout.dim == len(feature_names(model, train)) and layout.row_bytes * 8 < layout.dim * 4


def test_scoring_from_compiled_columns_gives_the_same_predictions(spark, tmp_path):
    """The score and evaluate stages send the compiled columns to Python and densify there: the
    probabilities must be exactly those of the Spark ML vector path."""
    import torch

    from sparkml_dist.data.features import scoring_frame
    from sparkml_dist.inference.bundle import ModelBundle
    from sparkml_dist.inference.udf import score_features
    from sparkml_dist.models.factory import build_model
    from sparkml_dist.models.spec import ModelSpec
    from sparkml_dist.models.weights import state_dict_to_bytes

    train = tmp_path / "train.csv"
    train.write_text(
        "".join(f"{20 + i}, {i % 5}.5, {['Paris', 'Rome', '?'][i % 3]}, yes\n" for i in range(40))
    )
    score = tmp_path / "score.csv"
    score.write_text("35, 2.5, Tokyo, yes\n?, 1.5, Paris, no\n33, ?, ?, no\n")
    cfg = small_config(train)
    model = build_feature_pipeline(cfg, FeatureConfig()).fit(ingest(spark, str(train), cfg).accepted)
    spec = ModelSpec("mlp", len(feature_names(model, ingest(spark, str(train), cfg).accepted)), hidden=(8,))
    torch.manual_seed(0)
    bundle = ModelBundle(spec=spec, weights=state_dict_to_bytes(build_model(spec).state_dict()))
    rows = ingest(spark, str(score), cfg, require_label=False).accepted
    frame, layout = scoring_frame(model, rows, with_label=False)
    assert layout is not None and "features" not in frame.columns
    compiled = score_features(frame, bundle, layout=layout).orderBy("row_id").toPandas()
    vectors = (
        score_features(to_feature_frame(model, rows, with_label=False), bundle).orderBy("row_id").toPandas()
    )
    assert len(compiled) == 3 and compiled["probability"].tolist() == vectors["probability"].tolist()


def test_a_pipeline_that_does_not_compile_falls_back_to_dense_vectors(spark, tmp_path):
    """A pipeline the compiler does not know (here a one-hot encoder that drops its last slot)
    keeps the Spark ML vector path rather than being compiled wrongly."""
    from pyspark.ml.feature import OneHotEncoder

    from sparkml_dist.data.features import compile_features, scoring_frame

    train = tmp_path / "train.csv"
    train.write_text("30, 1.0, Paris, yes\n40, 2.0, Rome, no\n50, 4.0, Rome, yes\n")
    cfg = small_config(train)
    pipeline = build_feature_pipeline(cfg, FeatureConfig())
    for stage in pipeline.getStages():
        if isinstance(stage, OneHotEncoder):
            stage.setDropLast(True)
    rows = ingest(spark, str(train), cfg).accepted
    model = pipeline.fit(rows)
    assert compile_features(model) is None
    frame, layout = scoring_frame(model, rows, with_label=False)
    assert layout is None and len(frame.first()["features"]) == len(feature_names(model, rows))


@pytest.mark.parametrize("strategy", ["mean", "median"])
def test_the_one_pass_imputer_is_spark_mls_imputer(spark, tmp_path, strategy):
    """Null and NaN are missing; the fitted model has Spark's surrogates, transforms the same and
    saves and loads as Spark's own ImputerModel, on the narrow (SQL) and wide (Summarizer) paths.
    A column with no value is named."""
    from pyspark.ml import PipelineModel
    from pyspark.ml.feature import Imputer

    from sparkml_dist.data import imputer as imputer_module
    from sparkml_dist.data.imputer import OnePassImputer
    from sparkml_dist.data.packed import packed_values
    from sparkml_dist.errors import DataError

    nan = float("nan")
    rows = spark.createDataFrame(
        [(1.0, 10, None), (nan, None, 2.5), (4.0, 30, 3.5), (None, 20, nan), (2.5, 5, 1.0)],
        "a double, b int, c double",
    )
    spark_ml = Imputer(inputCols=["a", "b", "c"], outputCols=["a_", "b_", "c_"], strategy=strategy).fit(rows)
    imputed = ["a_", "b_", "c_"]  # the inputs hold NaN, which never equals itself
    for width in (imputer_module._SQL_COLUMNS, 0):
        with narrow_sql_limit(imputer_module, width):
            ours = OnePassImputer(
                Imputer(inputCols=["a", "b", "c"], outputCols=imputed, strategy=strategy)
            ).fit(rows)
        assert ours.surrogateDF.first().asDict() == pytest.approx(
            spark_ml.surrogateDF.first().asDict(), rel=1e-12
        )
        assert (
            ours.transform(rows).select(imputed).collect()
            == spark_ml.transform(rows).select(imputed).collect()
        )
    packed = rows.select("*", packed_values(["a", "b", "c"]))  # the wide path over one array column
    with narrow_sql_limit(imputer_module, 0):
        from_array = OnePassImputer(Imputer(inputCols=["a", "b", "c"], outputCols=imputed, strategy=strategy))
        assert from_array.fit(packed).surrogateDF.first().asDict() == pytest.approx(
            spark_ml.surrogateDF.first().asDict(), rel=1e-12
        )
    PipelineModel([ours]).save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    assert loaded.transform(rows).select(imputed).collect() == ours.transform(rows).select(imputed).collect()

    empty = rows.withColumn("d", F.lit(None).cast("double"))
    with pytest.raises(DataError, match=r"numeric column\(s\) \['d'\] have no value in the training rows"):
        OnePassImputer(Imputer(inputCols=["a", "d"], outputCols=["a_", "d_"], strategy=strategy)).fit(empty)
    with pytest.raises(DataError, match="the training split is empty"):
        OnePassImputer(Imputer(inputCols=["a"], outputCols=["a_"], strategy=strategy)).fit(rows.limit(0))


@contextlib.contextmanager
def narrow_sql_limit(module, width: int):
    """Inputs wider than `width` columns take the Summarizer path."""
    original = module._SQL_COLUMNS
    module._SQL_COLUMNS = width
    try:
        yield
    finally:
        module._SQL_COLUMNS = original


@pytest.mark.parametrize("strategy", ["mean", "median"])
def test_the_scaler_fitted_from_the_imputers_pass_is_spark_mls_scaler(spark, tmp_path, strategy):
    """The StandardScaler after the imputer takes its mean and std from the imputer's one pass
    (no second pass over the rows), and they are what Spark ML's own Imputer -> VectorAssembler
    -> StandardScaler fit gives, with missing values in a column, a column of one value, a column
    with a single present value, and wide inputs (the Summarizer path). An int column (its
    imputed surrogate is cast to int) falls back to the scaler's own pass."""
    import numpy as np
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import Imputer, StandardScaler, StandardScalerModel, VectorAssembler

    from sparkml_dist.data import imputer as imputer_module
    from sparkml_dist.data.imputer import ImputedScaler, OnePassImputer

    nan = float("nan")
    rows = spark.createDataFrame(
        [
            (1.0, 10.0, None, 7.0, None),
            (nan, None, 2.5, 7.0, 3.0),
            (4.0, 30.0, 3.5, 7.0, None),
            (None, 20.0, nan, 7.0, None),
            (2.5, 5.0, 1.0, 7.0, None),
            (8.0, 1.0, 0.5, 7.0, None),
        ],
        "a double, b double, c double, d double, e double",
    )
    names = rows.columns
    imputed = [f"{n}_" for n in names]

    def fitted(rows):
        imputer = OnePassImputer(Imputer(inputCols=names, outputCols=imputed, strategy=strategy))
        scaler = StandardScaler(inputCol="v", outputCol="s", withMean=True, withStd=True)
        ours = Pipeline(
            stages=[
                imputer,
                VectorAssembler(inputCols=imputed, outputCol="v"),
                ImputedScaler(imputer, scaler),
            ]
        ).fit(rows)
        theirs = Pipeline(
            stages=[
                Imputer(inputCols=names, outputCols=imputed, strategy=strategy),
                VectorAssembler(inputCols=imputed, outputCol="v"),
                scaler,
            ]
        ).fit(rows)
        assert np.allclose(ours.stages[-1].mean.toArray(), theirs.stages[-1].mean.toArray(), rtol=1e-12)
        assert np.allclose(ours.stages[-1].std.toArray(), theirs.stages[-1].std.toArray(), rtol=1e-12)
        scaled = [list(r["s"]) for r in ours.transform(rows).select("s").collect()]
        assert np.allclose(
            scaled, [list(r["s"]) for r in theirs.transform(rows).select("s").collect()], rtol=1e-9
        )
        return ours, scaled

    for width in (imputer_module._SQL_COLUMNS, 0):  # SQL aggregates, then the Summarizer path
        with narrow_sql_limit(imputer_module, width):
            ours, scaled = fitted(rows)
        assert ours.stages[-1].std.toArray()[3] == 0.0 and ours.stages[-1].std.toArray()[4] == 0.0
    ours.save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    assert isinstance(loaded.stages[-1], StandardScalerModel) and loaded.stages[-1].getWithMean()
    assert [list(r["s"]) for r in loaded.transform(rows).select("s").collect()] == scaled
    fitted(rows.withColumn("b", F.col("b").cast("int")))


def test_a_saved_pipeline_scores_from_its_plain_data_exactly_as_from_its_stages(spark, adult_prep, tmp_path):
    """Evaluate and score read a saved pipeline's raw_features.json instead of loading its Spark
    ML stages: the same rows must come out, to the last bit. A pipeline saved without that file
    (by an older version, or one that does not compile) is loaded from its stages."""
    import shutil

    from pyspark.ml import PipelineModel

    from sparkml_dist.data.features import ScoringPipeline, scoring_frame
    from sparkml_dist.data.raw_features import RAW_FEATURES_FILE

    cfg, prep = adult_prep
    saved = f"{prep.path}/feature_pipeline"
    rows = ingest(spark, cfg.data.test_path, cfg.data).accepted.limit(2000)
    only_the_file = tmp_path / "only_the_file"
    only_the_file.mkdir()
    shutil.copy(f"{saved}/{RAW_FEATURES_FILE}", only_the_file)
    from_file = ScoringPipeline.load(str(only_the_file))  # would fail if it read the stages
    assert from_file.compiled is not None and from_file.model is None
    frame, layout = from_file.frame(rows, with_label=False)
    expected, expected_layout = scoring_frame(PipelineModel.load(saved), rows, with_label=False)
    assert layout == expected_layout
    got, want = (f.orderBy("row_id").toPandas() for f in (frame, expected))
    assert len(got) == 2000 and got.equals(want)

    without = tmp_path / "older_pipeline"
    shutil.copytree(saved, without)
    (without / RAW_FEATURES_FILE).unlink()
    from_stages = ScoringPipeline.load(str(without))
    assert from_stages.compiled is not None and from_stages.compiled.layout == layout, (
        "compiled from the stages"
    )
    assert from_stages.frame(rows, with_label=False)[0].orderBy("row_id").toPandas().equals(want)


def test_a_categorical_column_with_a_value_per_row_is_named_with_what_to_do():
    """ggplot2movies' `title`, left to its default role, was 45,798 one-hot slots for 52,909 rows;
    an airline's 4,000 tail numbers over 280,000 flights repeat, and are not flagged."""
    from sparkml_dist.data.features import identifier_like
    from sparkml_dist.data.raw_features import CategorySlot, NumericSlot, RawFeatures

    def raw(values: int) -> RawFeatures:
        return RawFeatures(
            (
                NumericSlot("year__scaled", "year", 1990.0, 1990.0, 0.1),
                CategorySlot(
                    "title__index", "title", tuple(f"t{i}" for i in range(values)), True, values + 1
                ),
            )
        )

    (said,) = identifier_like(raw(45_798), 52_909)
    assert said.startswith("data.columns: 'title' has 45,798 distinct values in 52,909 training rows")
    assert (
        "45,800 wide" in said and "role id" in said and "ignore" in said and "features.max_categories" in said
    )
    assert identifier_like(raw(4_043), 281_373) == [], "tail numbers repeat"
    assert identifier_like(raw(40), 60) == [], "a few values in a small table are ordinary categories"


@pytest.mark.parametrize("scale,packed", [(True, True), (False, False)])
def test_a_wide_run_of_numbers_is_stored_as_one_array_and_matches_spark_ml(spark, tmp_path, scale, packed):
    """70 numeric columns (MNIST has 784) and a category: the numbers are one VALUES block, a
    single array<float> Parquet column, and every slot of every row still equals Spark ML's own
    output, rebuilt in numpy, in torch (a GPU rank's expansion) and from numpy over the raw
    rows: missing numbers, a constant column, an unseen category. `packed`: ingested as
    preprocess ingests (the numbers one array column, data/packed.py), the statistics and the
    stored features computed from that array are still Spark ML's, slot for slot."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from sparkml_dist.config import parse_config
    from sparkml_dist.data.dataset import write_split
    from sparkml_dist.data.expand import DeviceExpander
    from sparkml_dist.data.features import compile_features
    from sparkml_dist.data.layout import VALUES
    from sparkml_dist.data.loader import dense_features, stored_features
    from sparkml_dist.data.packed import PACKED, packed_columns
    from sparkml_dist.errors import DataError

    width = 70
    rng = np.random.default_rng(7)
    rows = [
        (
            *[None if rng.random() < 0.05 else float(rng.normal(j, 1 + j % 3)) for j in range(width - 2)],
            math.inf if i == 5 else 1.0 + i,  # one reject
            2.5,  # constant: std 0
            ["Paris", "Rome", None][i % 3],
            "yes" if i % 2 else "no",
        )
        for i in range(200)
    ]
    schema = ", ".join(f"x{j} double" for j in range(width)) + ", city string, y string"
    path = str(tmp_path / "wide.parquet")
    spark.createDataFrame(rows, schema).write.parquet(path)
    cfg = parse_config(
        {
            "data": {
                "train_path": path,
                "test_path": path,
                "label": {"column": "y", "positive": "yes", "negative": "no"},
            }
        }
    ).data
    result = ingest(spark, path, cfg, pack_wide=packed)  # its config: the columns typed from the source
    rows_in = result.accepted
    assert (packed_columns(rows_in) is not None) == packed
    unpacked = ingest(spark, path, cfg) if packed else result
    assert (
        rows_in.drop(PACKED).orderBy("row_id").collect() == unpacked.accepted.orderBy("row_id").collect()
    ), "the same rows, every column by its name, packed or not"
    assert result.rejects.collect() == unpacked.rejects.collect() and result.rejected_rows == 1
    assert "'x68' (Infinity)" in result.rejects.first()["reason"]
    model = build_feature_pipeline(result.data, FeatureConfig(scale_numeric=scale)).fit(rows_in)
    if packed:
        plain = build_feature_pipeline(result.data, FeatureConfig(scale_numeric=scale))
        assert raw_features(model) == raw_features(plain.fit(unpacked.accepted)), (
            "the statistics from the array are those from the columns"
        )
    scored = rows_in.withColumn(
        "city", F.when(F.col("row_id") % 10 == 0, F.lit("Tokyo")).otherwise(F.col("city"))
    )

    layout, compact = _dense_from_compact(model, scored)
    dense = _dense_from_spark_ml(model, scored)
    assert [(b.kind, b.size) for b in layout.blocks] == [(VALUES, width), ("onehot", 4)]
    assert layout.compact_width == width + 1 and layout.dim == width + 4
    assert np.array_equal(compact, dense), "the array column rebuilds Spark ML's vectors"
    assert np.array_equal(raw_features(model).dense(scored.orderBy("row_id").toPandas()), dense)

    split = str(tmp_path / "split")
    compiled = compile_features(model)
    write_split(compiled.frame(scored, with_label=False), split, 1, 64, layout.row_bytes)
    table = pq.read_table(split).sort_by("row_id")
    assert table.column_names == ["row_id", layout.blocks[0].column, layout.blocks[1].column]
    assert np.array_equal(dense_features(table, layout, where=split), dense), "a rank reads the same rows"
    on_device = DeviceExpander(layout, "cpu", layout.dim)(
        torch.from_numpy(stored_features(table, layout, split))
    )
    assert np.array_equal(on_device.numpy(), dense), "a GPU rank's expansion gives the same rows"

    one_number = pa.array([[1.0]] * len(table), pa.list_(pa.float32()))
    broken = table.set_column(1, layout.blocks[0].column, one_number)
    with pytest.raises(DataError, match=f"'{layout.blocks[0].column}' does not hold {width} numbers"):
        stored_features(broken, layout, "a file")
