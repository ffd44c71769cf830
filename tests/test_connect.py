"""Spark Connect (issue 53): the session Databricks serverless notebooks, shared clusters and
Databricks Connect hand a user has no SparkContext and no JVM on the client. The job commands
(`SPARK_REMOTE=...`, pyspark's own switch) and `sparkml_dist.TorchDistributor` run there as on a
classic session: a local Connect server (`SparkSession.builder.remote("local[2]")`, started by
pyspark) in a process of its own, since a classic session and a Connect one cannot share a process.
The tests of this file run on one worker, one after the other: a local Connect server listens on
Connect's port, 15002."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CLIENT = Path(__file__).parent / "user_code" / "connect_client.py"
ROOT = Path(__file__).resolve().parents[1]


def _cli_over_connect(stage: str, cwd: Path, *overrides: str, config: str = "conf/adult.yaml"):
    """A job command as a Databricks Connect user types it (`SPARK_REMOTE=local[2]`), in `cwd`."""
    return subprocess.run(
        [sys.executable, "-m", "sparkml_dist.cli", stage, "--config", config]
        + [arg for o in overrides for arg in ("--set", o)],
        env={**os.environ, "SPARK_REMOTE": "local[2]"},
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def connect_pipeline(tmp_path_factory):
    """docs/deployment.md's command, exactly as written, in a directory of its own (conf/ linked)."""
    tmp = tmp_path_factory.mktemp("connect")
    (tmp / "conf").symlink_to(ROOT / "conf")
    done = _cli_over_connect("pipeline", tmp)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    return tmp / "output" / "adult", done


def test_the_adult_pipeline_runs_over_spark_connect(connect_pipeline, spark, adult_prep):
    """preprocess -> train (two DDP ranks) -> evaluate -> register -> score, every stage on a Connect
    session, with the same outcome a classic session gives."""
    from pyspark.ml import PipelineModel
    from pyspark.ml.feature import ImputerModel, StandardScalerModel

    out, done = connect_pipeline
    assert "Spark Connect, server master local[2]" in done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_metrics"]["accuracy"] >= 0.84, summary["test_metrics"]
    assert (summary["version"], summary["alias"]) == ("1", "champion"), summary["gate_reason"]
    scored = spark.read.parquet(str(out / "predictions" / "scored"))
    assert scored.count() == 16_281 == summary["rows"]["scored"], "every accepted test row, once"
    assert scored.select("row_id").distinct().count() == 16_281

    # Connect fits Spark ML's own Imputer and StandardScaler (a pass each; the classic session builds
    # them from one pass of moments on the driver's JVM): the same fitted features
    def stages(path):
        model = PipelineModel.load(str(path))
        imputer = next(s for s in model.stages if isinstance(s, ImputerModel))
        scaler = next(s for s in model.stages if isinstance(s, StandardScalerModel))
        surrogates = imputer.surrogateDF.collect()[0].asDict()
        return surrogates, scaler.mean.toArray(), scaler.std.toArray()

    classic = stages(Path(adult_prep[1].path) / "feature_pipeline")
    over_connect = stages(out / "preprocess" / "feature_pipeline")
    assert over_connect[0] == pytest.approx(classic[0], rel=1e-3), "the medians, at the imputer's error"
    assert over_connect[1] == pytest.approx(classic[1], rel=1e-9)
    assert over_connect[2] == pytest.approx(classic[2], rel=1e-9)


def test_the_parameter_server_method_trains_over_spark_connect(connect_pipeline):
    """The method whose ranks exchange control messages while they train (async, a parameter
    server on rank 0) on the Connect pipeline's splits, through the train command. fsdp, tensor,
    pipeline and hybrid ran the same way by hand (docs/deployment.md)."""
    out, _ = connect_pipeline
    done = _cli_over_connect("train", out.parents[1], "train.strategy=async", "train.epochs=1")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    line = done.stdout.strip().splitlines()[-1]
    assert "(async)" in line and "rows per rank [0, 29384]" in line, line
    assert float(re.search(r"val_accuracy ([0-9.]+)", line).group(1)) >= 0.8, line


def test_the_horovod_backend_trains_over_spark_connect(connect_pipeline):
    """Horovod's rendezvous server runs in rank 0's task behind the launch's gateway, as torch's
    store does: nothing the ranks need is on the client, so `train.backend=horovod` trains over
    Connect as on a classic session."""
    out, _ = connect_pipeline
    done = _cli_over_connect("train", out.parents[1], "train.backend=horovod", "train.epochs=1")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    assert "launching 2 ranks (backend horovod) in a barrier stage over Spark Connect" in done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert "rows per rank [14692, 14692]" in line and "ranks in step: True" in line, line
    assert float(re.search(r"val_accuracy ([0-9.]+)", line).group(1)) >= 0.8, line


def test_federated_rounds_with_secure_aggregation_run_over_spark_connect(connect_pipeline):
    """docs/federated.md's command over Connect, for 2 rounds of its 5: the clients' rows stay a
    DataFrame keyed by client, each round one groupBy over the sampled clients (no RDD API on
    Connect); secure aggregation's two passes see each client's rows in one order, or no key
    would unseal."""
    out, _ = connect_pipeline
    sets = ("federated.client_column=occupation", "federated.rounds=2", "federated.secure_aggregation=true")
    done = _cli_over_connect("federated", out.parents[1], *sets)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    report = done.stdout
    assert "clients        : 15 by occupation" in report, report
    assert "secure aggregation True" in report and "60 payloads" in report, "2 rounds x 15 clients x 2 passes"
    final = float(report.split("final          : test accuracy ")[1].split(",")[0])
    assert final >= 0.82, report


def test_fine_tuning_on_a_subset_runs_over_spark_connect(connect_pipeline):
    """The README's fine-tuning command over Connect, on the pipeline's champion: `finetune.where`
    is parsed and checked on the client (no JVM there), and the subset it keeps is Wife's rows."""
    out, _ = connect_pipeline
    done = _cli_over_connect("finetune", out.parents[1], "finetune.where=relationship = 'Wife'")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    report = done.stdout
    assert "parent         : models:/adult_income_mlp@champion (version 1)" in report, report
    assert "subset  before : accuracy" in report and "subset  after  : accuracy" in report, report
    assert re.search(r"registry       : version \d+ -> alias 'finetuned'", report), report


def test_files_arriving_are_scored_over_spark_connect_following_the_champion(connect_pipeline):
    """docs/streaming.md's running query, over Connect: foreachBatch runs in the server's Python
    worker, which builds its own model follower, and each batch's counts reach the client's
    progress lines as files beside the output. Bad lines go to the rejects, a moved @champion
    scores the next batch, a version that does not fit is refused (and said on the client), and
    SIGTERM stops between micro-batches with every row scored once."""
    from test_streaming import DOCS_STREAM, _misfit_model, adult_lines, drop, scored_batches

    from sparkml_dist.config.loader import load_config
    from sparkml_dist.tracking.client import tracked_run
    from sparkml_dist.tracking.models import register

    command = f'SPARK_REMOTE="local[2]" {DOCS_STREAM}'
    assert command in (ROOT / "docs" / "streaming.md").read_text()
    out, _ = connect_pipeline
    work = out.parents[1]
    (work / ".venv").symlink_to(ROOT / ".venv")
    cfg = load_config(ROOT / "conf" / "adult.yaml")  # the registry the commands above used
    name = cfg.tracking.registered_model
    with tracked_run(cfg.tracking, "misfit", {}) as run:
        misfit = register(run, _misfit_model(run, f"models:/{name}/1", work), name, {})
    client = run.client()
    champion = client.get_model_version(name, "1")  # and the champion again, as a new version
    copy = client.create_model_version(name, champion.source, run_id=champion.run_id).version
    incoming, output = work / "incoming", out / "stream"
    incoming.mkdir()
    rows = [line.split(",", 1)[1] for line in adult_lines(0, 900)]  # conf/adult.yaml's columns
    drop(incoming, "1.csv", rows[:300] + ["?,?"])
    running = subprocess.Popen(
        shlex.split(DOCS_STREAM),  # the command after SPARK_REMOTE=, which is the environment's
        cwd=work,
        env={**os.environ, "SPARK_REMOTE": "local[2]"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def scored(rows: int) -> None:
        deadline = time.monotonic() + 300
        while sum(len(b) for b in scored_batches(output).values()) < rows and running.poll() is None:
            assert time.monotonic() < deadline, f"{rows} rows were not scored in 300 s"
            time.sleep(0.5)

    try:
        scored(300)
        client.set_registered_model_alias(name, "champion", misfit)
        drop(incoming, "2.csv", rows[300:600])
        scored(600)
        client.set_registered_model_alias(name, "champion", copy)
        drop(incoming, "3.csv", rows[600:])
        scored(900)
    finally:
        running.send_signal(signal.SIGTERM)
        try:
            said, _ = running.communicate(timeout=120)
        finally:
            running.kill()  # a query that did not stop holds Connect's port for the next test
            client.set_registered_model_alias(name, "champion", "1")
    assert running.returncode == 0, said[-5000:]
    said = "\n".join(
        line for line in said.splitlines() if "sparkml_dist" in line or line.startswith("stream")
    )
    assert "301 rows in, 1 rejected, 300 scored by version 1" in said, said[-5000:]
    assert "300 rows in, 0 rejected, 300 scored by version 1" in said, said
    assert f"300 rows in, 0 rejected, 300 scored by version {copy}" in said, said
    assert f"version {misfit} is refused" in said and "credit_score" in said, "said on the client"
    assert "stopped on request (SIGTERM) after the micro-batch in progress" in said
    assert f"version {misfit} refused: " in said, "the refusal is in the command's report"
    batches = scored_batches(output)
    assert sum(len(b) for b in batches.values()) == 900, "every accepted row once"
    assert len(list((output / "rejects").glob("batch_id=*/*.parquet"))) >= 1
    assert not any((output / "_reports").iterdir()), "the query's report files are removed"


def test_the_torch_distributor_runs_over_spark_connect():
    done = subprocess.run(
        [sys.executable, str(CLIENT)], capture_output=True, text=True, timeout=600, cwd=CLIENT.parent
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    assert out["session"] == "pyspark.sql.connect.session" and out["is_remote"] is True
    assert out["listening"] == ["127.0.0.1"], "the local Connect server listens on loopback only"
    # two barrier ranks that trained together end with the weights of two processes on the driver
    assert out["world"] == 2 and out["max_param_diff"] <= 1e-6 and out["accuracy"] > 0.8
    # no relay reaches a Connect client: each rank's last lines come back with its result
    assert sorted(line.split(" loss ")[0] for line in out["relayed"]) == [
        "[rank 0] rank 0 epoch 2",
        "[rank 1] rank 1 epoch 2",
    ], out["relayed"]
    assert out["failure"] == {
        "type": "ValueError",
        "message": "bad value on rank 1",
        "tail": "rank 1 starting",
    }, "a failing rank's own report reaches the client, through Connect's error text"
    assert out["slots"].startswith(
        "fewer task slots than ranks, 3 ranks requested: lower num_processes, or give the cluster more cores"
    ), out.get("slots")
    assert out["dataframe"]["rows"] == out["input_rows"] == 569, "every row of the Connect DataFrame, once"
    assert out["dataframe"]["accuracy"] > 0.95
