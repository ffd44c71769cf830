"""Ingest: every input line is either accepted or quarantined with a reason; counts reconcile."""

import pytest
from pyspark.sql import functions as F

from sparkml_dist.config import parse_config
from sparkml_dist.data.ingest import ingest
from sparkml_dist.errors import DataError

pytestmark = pytest.mark.spark

COLUMNS = [
    {"name": "age", "type": "int", "role": "numeric"},
    {"name": "score", "type": "double", "role": "numeric"},
    {"name": "city", "type": "string", "role": "categorical"},
    {"name": "y", "type": "string", "role": "label"},
]


def small_config(train_path, test_path=None):
    return parse_config(
        {
            "data": {
                "train_path": str(train_path),
                "test_path": str(test_path or train_path),
                "columns": COLUMNS,
                "label": {"column": "y", "positive": "yes", "negative": "no", "strip_suffix": "."},
            }
        }
    ).data


LINES = [
    "34, 1.5, Paris, yes",  # ok
    "41, 2.0, ?, no.",  # ok: '?' is a missing category, label suffix stripped
    "?, 3.0, Rome, no",  # ok: missing numeric is imputed later
    "abc, 1.0, Rome, yes",  # wrong type
    "20, NaN, Rome, no",  # NaN
    "20, inf, Rome, no",  # inf
    "20, 1.0, Rome, maybe",  # unknown label
    "20, 1.0, Rome, ?",  # missing label
    "only, three, fields",  # malformed
    "",  # blank: not a record
]


def test_rejects_carry_reasons_and_counts_reconcile(spark, tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("\n".join(LINES) + "\n")
    result = ingest(spark, str(path), small_config(path))
    assert result.counts() == {"input": 9, "accepted": 3, "rejected": 6}
    reasons = {r["raw_line"]: r["reason"] for r in result.rejects.collect()}
    assert "column 'age': 'abc' is not an int" in reasons["abc, 1.0, Rome, yes"]
    assert "column 'score': 'NaN' is not finite" in reasons["20, NaN, Rome, no"]
    assert "not finite" in reasons["20, inf, Rome, no"]
    assert "label 'y': unknown value 'maybe'" in reasons["20, 1.0, Rome, maybe"]
    assert "label 'y' is missing" in reasons["20, 1.0, Rome, ?"]
    assert "malformed line: expected 4 fields" in reasons["only, three, fields"]
    assert all(r["source_file"].endswith("rows.csv") for r in result.rejects.collect())
    accepted = {r["row_id"]: r for r in result.accepted.collect()}
    # the label as its task reads it (suffix stripped); encoded later against the fitted target
    assert sorted(r["label"] for r in accepted.values()) == ["no", "no", "yes"]
    assert result.accepted.where(F.col("age").isNull()).count() == 1
    assert result.accepted.where(F.col("city").isNull()).count() == 1


def test_scoring_input_does_not_need_a_label(spark, tmp_path):
    path = tmp_path / "score.csv"
    path.write_text("34, 1.5, Paris, \n41, 2.0, Rome, whatever\n")
    result = ingest(spark, str(path), small_config(path), require_label=False)
    assert result.counts() == {"input": 2, "accepted": 2, "rejected": 0}
    assert "label" not in result.accepted.columns


def test_empty_input_is_a_clear_error(spark, tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("\n\n")
    with pytest.raises(DataError, match="no input rows"):
        ingest(spark, str(path), small_config(path))


def test_missing_input_names_the_path(spark, tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(DataError, match="nope.csv"):
        ingest(spark, str(path), small_config(path))


def test_preprocess_names_the_key_of_an_input_it_cannot_read(spark, tmp_path):
    from sparkml_dist.config import JobConfig
    from sparkml_dist.stages import preprocess

    train = tmp_path / "train.csv"
    train.write_text("\n".join(LINES[:2]) + "\n")
    data = small_config(train, tmp_path / "nope.csv").model_dump(mode="json", exclude_unset=True)
    cfg = JobConfig.model_validate({"data": data, "output": {"root": str(tmp_path / "out")}})
    with pytest.raises(DataError, match=r"^data.test_path: cannot read input '.*nope.csv'"):
        preprocess(spark, cfg)


def test_a_test_row_of_a_class_the_training_rows_lack_is_quarantined_with_its_file_and_line(spark, tmp_path):
    """Multiclass classes come from the training rows: a test row of another class cannot be
    evaluated; its reject names the file and keeps the line as written, like any other reject."""
    import pyarrow.parquet as pq

    from sparkml_dist.config import JobConfig
    from sparkml_dist.stages import preprocess

    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    species = ["Adelie", "Gentoo", "Chinstrap"]
    train.write_text("".join(f"{30 + i % 7}, {i / 10}, Dream, {species[i % 3]}\n" for i in range(60)))
    test.write_text("31, 1.5, Dream, Gentoo\n32, 2.5, Biscoe, Emperor\n33, 0.5, Dream, Adelie\n")
    data = {"train_path": str(train), "test_path": str(test), "columns": COLUMNS, "label": {"column": "y"}}
    result = preprocess(
        spark, JobConfig.model_validate({"data": data, "output": {"root": str(tmp_path / "out")}})
    )
    assert result.manifest.inputs["test"] == {"input": 3, "accepted": 2, "rejected": 1}
    [reject] = pq.read_table(f"{result.path}/rejects").to_pylist()
    assert reject["input"] == "test" and reject["source_file"].endswith("/test.csv")
    assert reject["raw_line"] == "32, 2.5, Biscoe, Emperor"
    assert reject["reason"] == "label 'y': 'Emperor' is not a class of the target (Adelie, Chinstrap, Gentoo)"


def test_an_input_mostly_rejected_stops_preprocess_naming_the_reason_and_the_key(spark, tmp_path):
    """A column typed int that holds fractions rejects nearly every row: that is the config, not
    dirty rows. Preprocess stops, naming the input's key, the kind of reason and a value, and goes
    on with the rows that pass only when data.max_reject_fraction allows it."""
    from sparkml_dist.config import JobConfig
    from sparkml_dist.stages import preprocess

    train = tmp_path / "train.csv"
    good = [f"{30 + i}, 1.5, Rome, {'yes' if i % 2 else 'no'}" for i in range(10)]
    fractions = [f"{30 + i}.5, 2.5, Paris, yes" for i in range(12)]
    train.write_text("\n".join(good + fractions) + "\n")
    data = small_config(train).model_dump(mode="json", exclude_unset=True)
    cfg = {"data": data, "output": {"root": str(tmp_path / "out")}}
    with pytest.raises(
        DataError,
        match=r"^data.train_path: 12 of 22 rows \(54.5%\) were rejected, more than "
        r"data.max_reject_fraction \(0.5\); most often: column 'age': '…' is not "
        r"an int \(12 rows, e.g. '30.5'\)\. Fix the input or data.columns",
    ):
        preprocess(spark, JobConfig.model_validate(cfg))
    assert not (tmp_path / "out").exists()
    cfg["data"]["max_reject_fraction"] = 0.6
    result = preprocess(spark, JobConfig.model_validate(cfg))
    assert result.manifest.inputs["train"] == {"input": 22, "accepted": 10, "rejected": 12}


def test_real_adult_test_file_quarantines_its_banner_line(spark, make_adult_config):
    cfg = make_adult_config()
    result = ingest(spark, cfg.data.test_path, cfg.data)
    assert result.counts() == {"input": 16282, "accepted": 16281, "rejected": 1}
    (reject,) = result.rejects.collect()
    assert reject["raw_line"].startswith("|1x3 Cross validator")
    assert "malformed line" in reject["reason"]


def test_released_input_is_read_afresh_on_the_next_run(spark, tmp_path):
    """A notebook re-runs a stage after the input file changed: the second run must count the new
    rows, not be served the first run's cached ones (and nothing stays cached in between)."""
    path = tmp_path / "data.csv"
    path.write_text("\n".join(LINES[:3]) + "\n")
    cfg = small_config(path)
    with ingest(spark, str(path), cfg) as first:
        assert first.counts() == {"input": 3, "accepted": 3, "rejected": 0}
    cache = spark._jsparkSession.sharedState().cacheManager()
    assert not cache.lookupCachedData(first.cached._jdf).isDefined(), "the ingest cache outlived its use"
    path.write_text("\n".join(LINES[:5]) + "\n")
    with ingest(spark, str(path), cfg) as second:
        assert second.counts() == {"input": 5, "accepted": 3, "rejected": 2}
