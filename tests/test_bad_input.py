"""Bad input: row-level problems are quarantined with a reason; structural problems are errors
that name the file / column / key and the fix."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_ingest import COLUMNS, small_config

from sparkml_dist.config import parse_config
from sparkml_dist.data.dataset import RowGroup
from sparkml_dist.data.ingest import ingest
from sparkml_dist.data.loader import ShardLoader
from sparkml_dist.data.sources import schema_of
from sparkml_dist.errors import DataError
from sparkml_dist.inference.bundle import ModelBundle
from sparkml_dist.inference.scoring import check_schema
from sparkml_dist.models.spec import ModelSpec


def header_config(path):
    return parse_config(
        {
            "data": {
                "train_path": str(path),
                "test_path": str(path),
                "header": True,
                "columns": COLUMNS,
                "label": {"column": "y", "positive": "yes", "negative": "no"},
            }
        }
    ).data


@pytest.mark.spark
def test_rows_with_missing_or_extra_fields_are_quarantined(spark, tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("34, 1.5, Paris, yes\n34, 1.5, Paris, yes, surprise\n34, 1.5, no\n")
    result = ingest(spark, str(path), small_config(path))
    assert result.counts() == {"input": 3, "accepted": 1, "rejected": 2}
    reasons = [r["reason"] for r in result.rejects.collect()]
    assert all(r.startswith("malformed line: expected 4 fields separated by ','") for r in reasons)


@pytest.mark.spark
def test_input_whose_columns_all_differ_is_a_schema_error(spark, tmp_path):
    path = tmp_path / "drifted.csv"
    path.write_text("34, Paris, yes\n41, Rome, no\n")  # the 'score' column is gone
    with pytest.raises(
        DataError,
        match=r"drifted.csv: every row was rejected; most rows have 3 fields but "
        r"data.columns lists 4 \(age, score, city, y\)",
    ):
        ingest(spark, str(path), small_config(path))


@pytest.mark.spark
def test_header_with_missing_and_extra_columns_names_them(spark, tmp_path):
    path = tmp_path / "with_header.csv"
    path.write_text("age,city,y,zip\n34,Paris,yes,75001\n")
    with pytest.raises(
        DataError, match=r"with_header.csv: header .* missing \['score'\], unexpected \['zip'\]"
    ):
        ingest(spark, str(path), header_config(path))


@pytest.mark.spark
def test_header_that_matches_is_skipped_not_rejected(spark, tmp_path):
    path = tmp_path / "ok_header.csv"
    path.write_text("age,score,city,y\n34,1.5,Paris,yes\n")
    assert ingest(spark, str(path), header_config(path)).counts() == {
        "input": 1,
        "accepted": 1,
        "rejected": 0,
    }


def test_corrupt_parquet_file_is_named_with_the_fix(tmp_path):
    (tmp_path / "train").mkdir()
    good = tmp_path / "train" / "a.parquet"
    pq.write_table(
        pa.table(
            {
                "features": pa.array([[1.0, 2.0]], pa.list_(pa.float32())),
                "label": pa.array([1.0], pa.float32()),
            }
        ),
        good,
    )
    bad = tmp_path / "train" / "b.parquet"
    bad.write_bytes(good.read_bytes()[:40] + b"garbage")
    loader = ShardLoader(
        tmp_path, [RowGroup("train/a.parquet", 0, 1), RowGroup("train/b.parquet", 0, 1)], 0, 1, 8, seed=0
    )
    with pytest.raises(
        DataError, match=r"b.parquet: not a readable Parquet file .* re-run the preprocess stage"
    ):
        list(loader.epoch(0))


def test_scoring_config_that_drifted_from_the_training_schema_is_refused(tmp_path):
    cfg = small_config(tmp_path / "x.csv")
    trained = {
        "age": "int/numeric",
        "score": "double/numeric",
        "town": "string/categorical",
        "y": "string/label",
    }
    bundle = ModelBundle(
        spec=ModelSpec("mlp", 1), weights=b"", uri="models:/m@champion", training_schema=trained
    )
    with pytest.raises(
        DataError, match=r"schema drift: models:/m@champion .* missing \['town'\], unexpected \['city'\]"
    ):
        check_schema(schema_of(cfg), bundle)
    same = {
        "age": "int/numeric",
        "score": "double/numeric",
        "city": "string/categorical",
        "y": "string/label",
    }
    check_schema(schema_of(cfg), ModelBundle(spec=ModelSpec("mlp", 1), weights=b"", training_schema=same))


@pytest.mark.spark
def test_the_evaluate_job_quarantines_the_test_rows_it_cannot_score_and_counts_them(
    spark, adult_trained, tmp_path
):
    """Evaluating a model on a test file of its own (the evaluate job, --model-uri): a malformed
    line and a label the model has no class for are rejects with their reasons, written where a
    person can look and counted in the metrics; the rest are scored. None vanish."""
    from pathlib import Path

    from sparkml_dist.data.sources import resolve_path
    from sparkml_dist.stages.evaluate import evaluate

    cfg, _, trained = adult_trained
    lines = Path(resolve_path(cfg.data.test_path)).read_text().splitlines()
    good = [line for line in lines[1:] if line.strip()][:300]
    unknown = good[0].rsplit(",", 1)[0] + ", >100K."
    rows = tmp_path / "more_test_rows.csv"
    rows.write_text("\n".join(good + [unknown, "39, State-gov, 77516"]) + "\n")
    own = cfg.with_overrides(f"data.test_path={rows}", f"output.root={tmp_path / 'out'}")
    report = evaluate(spark, own, trained.model_uri, cfg.tracking.tracking_uri)
    assert report.metrics["rows"] == 300 and report.metrics["rejected_rows"] == 2
    rejects = pq.read_table(tmp_path / "out" / "evaluate" / "rejects").to_pandas()
    reasons = sorted(rejects["reason"])
    assert reasons[0] == "label 'income': unknown value '>100K.' (expected '>50K' or '<=50K')", (
        "one reason, the config's own (positive/negative), not also the target's"
    )
    assert reasons[1].startswith("malformed line: expected 15 fields"), reasons
    assert set(rejects["source_file"]) == {rows.as_uri()}

    (tmp_path / "clean.csv").write_text("\n".join(good) + "\n")
    again = evaluate(
        spark,
        own.with_overrides(f"data.test_path={tmp_path / 'clean.csv'}"),
        trained.model_uri,
        cfg.tracking.tracking_uri,
    )
    assert (
        "rejected_rows" not in again.metrics and not (tmp_path / "out" / "evaluate" / "rejects").exists()
    ), "an earlier evaluation's rejects are not left to look like this one's"
