"""The scheduled workflow: Airflow DAG and Databricks bundle match the one workflow definition,
and a re-run for the same run date replaces that date's outputs."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

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
    assert cmd == [
        "spark-submit",
        "--master",
        "spark://127.0.0.1:7077",
        "jobs/train.py",
        "--config",
        "conf/adult.yaml",
        "--run-date",
        "2026-11-29",
    ]


def test_databricks_bundle_matches_the_workflow():
    bundle = yaml.safe_load((ROOT / "conf/workflows/databricks.yml").read_text())
    job = bundle["resources"]["jobs"]["sparkml_dist_adult"]
    tasks = job["tasks"]
    assert [t["task_key"] for t in tasks] == [t.name for t in WORKFLOW] + [
        "stream_enabled",
        STREAM_SCORING.name,
    ]
    for spec, task in zip(tasks, WORKFLOW):
        assert spec["spark_python_task"]["python_file"] == task.job
        assert [d["task_key"] for d in spec.get("depends_on", [])] == list(task.depends_on)
        assert spec["spark_python_task"]["parameters"][:4] == [
            "--config",
            "conf/adult.yaml",
            "--run-date",
            "{{job.start_time.iso_date}}",
        ]
    # the optional availableNow scoring: only when the job's stream_input parameter names a directory
    condition, stream = tasks[-2:]
    assert job["parameters"] == [{"name": "stream_input", "default": ""}]
    assert condition["depends_on"] == [{"task_key": STREAM_SCORING.depends_on[0]}]
    assert condition["condition_task"] == {
        "op": "NOT_EQUAL",
        "left": "{{job.parameters.stream_input}}",
        "right": "",
    }
    assert stream["depends_on"] == [{"task_key": "stream_enabled", "outcome": "true"}]
    assert stream["spark_python_task"]["python_file"] == STREAM_SCORING.job
    assert stream["spark_python_task"]["parameters"] == [
        "--config",
        "conf/adult.yaml",
        "--run-date",
        "{{job.start_time.iso_date}}",
        *stream_arguments("{{job.parameters.stream_input}}"),
    ]
    args = cli.parse_args(["stream", "--config", "c.yaml", *stream_arguments("incoming")])
    assert (args.input, args.overrides) == ("incoming", ["stream.trigger=available_now"])


# Airflow lives in a venv of its own (scripts/test_assets.sh), installed as Airflow asks: with a
# constraints file of its release's dependencies. The tests drive it as a user would, by its CLI
# and its DagBag, in that venv's Python.
AIRFLOW_BIN = Path(sys.prefix) / "airflow" / "bin"
PARSE_DAG = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1], include_examples=False)
dag = next(iter(bag.dags.values()), None) if not bag.import_errors else None
print(json.dumps({"import_errors": {str(k): str(v) for k, v in bag.import_errors.items()},
                  "dag_id": dag.dag_id if dag else None,
                  "tasks": [t.task_id for t in dag.tasks] if dag else [],
                  "upstream": {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks} if dag else {},
                  "bash": {t.task_id: t.bash_command for t in dag.tasks} if dag else {},
                  "catchup": dag.catchup if dag else None,
                  "max_active_runs": dag.max_active_runs if dag else None}))
"""


def _airflow_env(airflow_home: Path, **extra: str) -> dict[str, str]:
    """The environment a scheduler's machine would give the DAG: the project on PYTHONPATH (the DAG
    imports sparkml_dist.workflow), the project's venv on PATH (its spark-submit)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPARKML_DIST_", "AIRFLOW", "MLFLOW_TRACKING"))
    }
    env.update(
        AIRFLOW_HOME=str(airflow_home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        PYTHONPATH=str(ROOT),
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        **extra,
    )
    return env


def _parse_dag(tmp_path: Path, **extra: str) -> dict:
    done = subprocess.run(
        [AIRFLOW_BIN / "python", "-c", PARSE_DAG, ROOT / "conf/workflows"],
        capture_output=True,
        text=True,
        env=_airflow_env(tmp_path, **extra),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_airflow_loads_the_dag_built_from_the_workflow_definition(tmp_path):
    # real Airflow parses the DAG file as its scheduler would
    hostile = "spark://127.0.0.1:7077 $(touch pwned); touch pwned"  # a variable's value stays one argument
    dag = _parse_dag(tmp_path, SPARKML_DIST_MASTER=hostile)
    assert dag["import_errors"] == {} and dag["dag_id"] == "sparkml_dist_adult"
    assert dag["tasks"] == [t.name for t in WORKFLOW]
    for task in WORKFLOW:
        assert dag["upstream"][task.name] == sorted(task.depends_on)
        expected = spark_submit_command(task, "conf/adult.yaml", "{{ ds }}", hostile)
        assert shlex.split(dag["bash"][task.name])[3:] == expected, dag["bash"][task.name]
    assert dag["catchup"] is False and dag["max_active_runs"] == 1


def test_airflow_schedules_the_config_a_variable_names_as_its_own_dag(tmp_path):
    # a user's own data: SPARKML_DIST_CONFIG picks the config, and the DAG is named after it
    dag = _parse_dag(tmp_path, SPARKML_DIST_CONFIG="conf/diamonds.yaml")
    assert dag["import_errors"] == {} and dag["dag_id"] == "sparkml_dist_diamonds"
    for task in WORKFLOW:
        expected = spark_submit_command(task, "conf/diamonds.yaml", "{{ ds }}")
        assert shlex.split(dag["bash"][task.name])[3:] == expected, dag["bash"][task.name]


def test_airflow_adds_stream_scoring_when_an_input_is_named(tmp_path):
    dag = _parse_dag(tmp_path, SPARKML_DIST_STREAM_INPUT="/data/incoming; rm -rf /")
    assert dag["import_errors"] == {}
    assert dag["tasks"] == [t.name for t in WORKFLOW] + [STREAM_SCORING.name]
    assert dag["upstream"][STREAM_SCORING.name] == ["register"]
    assert shlex.split(dag["bash"][STREAM_SCORING.name])[3:] == spark_submit_command(
        STREAM_SCORING, "conf/adult.yaml", "{{ ds }}", None, stream_arguments("/data/incoming; rm -rf /")
    )


def _airflow(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [AIRFLOW_BIN / "airflow", *args], capture_output=True, text=True, env=env, timeout=900
    )
    assert done.returncode == 0, f"airflow {' '.join(args)}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.mark.slow
def test_airflow_runs_the_dag_for_a_date_and_a_rerun_adds_no_model_version(tmp_path):
    """docs/deployment.md's Airflow commands, as written: `airflow dags test` runs all five
    spark-submit tasks for the date; re-running the date's register task adds no model version."""
    doc = (ROOT / "docs/deployment.md").read_text()
    commands = [
        ["db", "migrate"],
        ["dags", "test", "sparkml_dist_adult", "2026-12-01"],
        ["tasks", "test", "sparkml_dist_adult", "register", "2026-12-01"],
    ]
    for args in commands:
        assert f".venv/airflow/bin/airflow {' '.join(args)}\n" in doc, args
    assert "cp conf/workflows/airflow_dag.py $AIRFLOW_HOME/dags/" in doc
    exported = set(re.findall(r"(\w+)=", " ".join(re.findall(r"^export (.*)$", doc, re.M))))
    home = tmp_path / "project"  # SPARKML_DIST_HOME: the checkout's jobs, a config with one epoch
    (home / "conf").mkdir(parents=True)
    (home / "jobs").symlink_to(ROOT / "jobs")
    config = yaml.safe_load((ROOT / "conf/adult.yaml").read_text())
    config["train"]["epochs"] = 1
    (home / "conf/adult.yaml").write_text(yaml.safe_dump(config))
    airflow_home = tmp_path / "airflow"
    (airflow_home / "dags").mkdir(parents=True)
    shutil.copy2(ROOT / "conf/workflows/airflow_dag.py", airflow_home / "dags")
    env = _airflow_env(airflow_home, SPARKML_DIST_HOME=str(home))
    assert exported == {
        "AIRFLOW_HOME",
        "SPARKML_DIST_HOME",
        "PYTHONPATH",
        "PATH",
        "AIRFLOW__CORE__LOAD_EXAMPLES",
    }

    _airflow(env, *commands[0])
    log = _airflow(env, *commands[1])
    assert re.search(r"Marking run <DagRun sparkml_dist_adult @ 2026-12-01 .*> successful", log), log[-3000:]
    day = home / "output/adult/run_date=2026-12-01"  # each stage's output, scoped to the logical date
    assert (day / "preprocess/manifest.json").is_file()
    trained = json.loads((day / "train.json").read_text())
    assert len(trained["records"]) == 1 and trained["records"][0]["evaluation"]["value"] > 0.8
    assert json.loads((day / "evaluate.json").read_text())["metrics"]["rows"] == 16281
    assert list((day / "predictions/scored").glob("*.parquet")), "score wrote the test rows' predictions"
    assert "reused version 1" in _airflow(env, *commands[2])

    client = MlflowClient(f"sqlite:///{home}/mlflow.db")  # the default store, in the task's working dir
    versions = client.search_model_versions("name = 'adult_income_mlp'")
    assert [str(v.version) for v in versions] == ["1"], "one version for the date, however often it runs"
    assert versions[0].tags["run_date"] == "2026-12-01"
    assert client.get_registered_model("adult_income_mlp").aliases == {"champion": 1}


@pytest.mark.spark
def test_rerun_for_the_same_run_date_replaces_its_outputs(spark, tmp_path, adult_config_path):
    argv = [
        "preprocess",
        "--config",
        str(adult_config_path),
        "--run-date",
        "2026-11-29",
        "--set",
        f"output.root={tmp_path}",
        "--set",
        f"tracking.tracking_uri=sqlite:///{tmp_path}/m.db",
    ]
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
