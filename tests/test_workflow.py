"""The scheduled workflow: Airflow DAG and Databricks bundle match the one workflow definition,
and a re-run for the same run date replaces that date's outputs."""

import shlex
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
import yaml

from sparkml_dist import cli
from sparkml_dist.workflow import STREAM_SCORING, WORKFLOW, spark_submit_command, stream_arguments

ROOT = Path(__file__).resolve().parents[1]


def test_workflow_runs_every_stage_in_order_with_existing_jobs():
    assert [t.name for t in WORKFLOW] == ["preprocess", "train", "evaluate", "register", "score"]
    seen = set()
    for task in WORKFLOW:
        assert set(task.depends_on) <= seen, f"{task.name} depends on a later task"
        assert (ROOT / task.job).is_file()
        seen.add(task.name)
    cmd = spark_submit_command(WORKFLOW[1], "conf/adult.yaml", "2026-11-29", "spark://127.0.0.1:7077")
    assert cmd == ["spark-submit", "--master", "spark://127.0.0.1:7077", "jobs/train.py",
                   "--config", "conf/adult.yaml", "--run-date", "2026-11-29"]


def test_databricks_bundle_matches_the_workflow():
    bundle = yaml.safe_load((ROOT / "conf/workflows/databricks.yml").read_text())
    job = bundle["resources"]["jobs"]["sparkml_dist_adult"]
    tasks = job["tasks"]
    assert [t["task_key"] for t in tasks] == [t.name for t in WORKFLOW] + ["stream_enabled", STREAM_SCORING.name]
    for spec, task in zip(tasks, WORKFLOW):
        assert spec["spark_python_task"]["python_file"] == task.job
        assert [d["task_key"] for d in spec.get("depends_on", [])] == list(task.depends_on)
        assert spec["spark_python_task"]["parameters"][:4] == ["--config", "conf/adult.yaml", "--run-date",
                                                                "{{job.start_time.iso_date}}"]
    # the optional availableNow scoring: only when the job's stream_input parameter names a directory
    condition, stream = tasks[-2:]
    assert job["parameters"] == [{"name": "stream_input", "default": ""}]
    assert condition["depends_on"] == [{"task_key": STREAM_SCORING.depends_on[0]}]
    assert condition["condition_task"] == {"op": "NOT_EQUAL", "left": "{{job.parameters.stream_input}}", "right": ""}
    assert stream["depends_on"] == [{"task_key": "stream_enabled", "outcome": "true"}]
    assert stream["spark_python_task"]["python_file"] == STREAM_SCORING.job
    assert stream["spark_python_task"]["parameters"] == [
        "--config", "conf/adult.yaml", "--run-date", "{{job.start_time.iso_date}}",
        *stream_arguments("{{job.parameters.stream_input}}")]
    args = cli.parse_args(["stream", "--config", "c.yaml", *stream_arguments("incoming")])
    assert (args.input, args.overrides) == ("incoming", ["stream.trigger=available_now"])


def test_airflow_loads_the_dag_built_from_the_workflow_definition(tmp_path, monkeypatch):
    # real Airflow (installed by setup: the `workflow` extra) parses the DAG file as a scheduler would
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    hostile = "spark://127.0.0.1:7077 $(touch pwned); touch pwned"  # a variable's value stays one argument
    monkeypatch.setenv("SPARKML_DIST_MASTER", hostile)
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "conf/workflows"), include_examples=False)
    assert bag.import_errors == {}
    dag = bag.dags["sparkml_dist_adult"]
    assert [t.task_id for t in dag.tasks] == [t.name for t in WORKFLOW]
    for task in WORKFLOW:
        op = dag.task_dict[task.name]
        assert sorted(op.upstream_task_ids) == sorted(task.depends_on)
        expected = spark_submit_command(task, "conf/adult.yaml", "{{ ds }}", hostile)
        assert shlex.split(op.bash_command)[3:] == expected, op.bash_command
    assert dag.catchup is False and dag.max_active_runs == 1


def test_airflow_adds_stream_scoring_when_an_input_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("SPARKML_DIST_STREAM_INPUT", "/data/incoming; rm -rf /")
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "conf/workflows"), include_examples=False)
    assert bag.import_errors == {}
    dag = bag.dags["sparkml_dist_adult"]
    assert [t.task_id for t in dag.tasks] == [t.name for t in WORKFLOW] + [STREAM_SCORING.name]
    op = dag.task_dict[STREAM_SCORING.name]
    assert sorted(op.upstream_task_ids) == ["register"]
    assert shlex.split(op.bash_command)[3:] == spark_submit_command(
        STREAM_SCORING, "conf/adult.yaml", "{{ ds }}", None, stream_arguments("/data/incoming; rm -rf /"))


@pytest.mark.spark
def test_rerun_for_the_same_run_date_replaces_its_outputs(spark, tmp_path, adult_config_path):
    argv = ["preprocess", "--config", str(adult_config_path), "--run-date", "2026-11-29",
            "--set", f"output.root={tmp_path}", "--set", f"tracking.tracking_uri=sqlite:///{tmp_path}/m.db"]
    assert cli.main(argv) == 0
    manifest = tmp_path / "run_date=2026-11-29" / "preprocess" / "manifest.json"
    first = manifest.stat().st_mtime_ns
    assert cli.main(argv) == 0
    assert manifest.stat().st_mtime_ns != first, "the second run replaced the output"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["run_date=2026-11-29"]
    assert sorted(p.name for p in (tmp_path / "run_date=2026-11-29").iterdir()) == ["preprocess"]
    assert cli.main(["preprocess", "--config", str(adult_config_path), "--run-date", "../etc"]) == 2

    # the registry too: re-running the date's register on the same input and config adds no version
    for stage in ("train", "evaluate", "register", "register"):
        assert cli.main([stage, *argv[1:], "--set", "train.epochs=1"]) == 0, stage
    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    versions = client.search_model_versions("name = 'adult_income_mlp'")
    assert [str(v.version) for v in versions] == ["1"], "one version for the date"
    assert versions[0].tags["run_date"] == "2026-11-29" and len(versions[0].tags["input_fingerprint"]) == 64
    runs = client.search_runs([client.get_experiment_by_name("adult_income").experiment_id])
    assert any(r.data.tags.get("registry.reason", "").startswith("reused version 1") for r in runs)
