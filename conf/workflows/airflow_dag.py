"""Airflow DAG: the Adult ETL-to-training workflow, one spark-submit task per stage, daily.

Copy (or symlink) into your Airflow dags folder on a machine where the project is installed.
Each run's outputs are scoped to its logical date (`--run-date {{ ds }}`), so a re-run or a
backfill replaces that date's outputs instead of duplicating them.
Variables: SPARKML_DIST_HOME (the project checkout), SPARKML_DIST_CONFIG (the job config, relative
to the checkout; default conf/adult.yaml; the DAG is named sparkml_dist_<its file name>),
SPARKML_DIST_MASTER (e.g. spark://host:7077),
SPARKML_DIST_STREAM_INPUT (optional: a directory of arriving files; when set, a stream_score task
after register scores what arrived there since the last run, then stops).
"""

from __future__ import annotations

import os
import re
import shlex
from datetime import datetime
from pathlib import PurePath

from airflow import DAG

try:  # Airflow 3: operators live in the standard provider
    from airflow.providers.standard.operators.bash import BashOperator
except ImportError:  # Airflow 2
    from airflow.operators.bash import BashOperator

from sparkml_dist.workflow import STREAM_SCORING, WORKFLOW, spark_submit_command, stream_arguments

HOME = os.environ.get("SPARKML_DIST_HOME", "/opt/sparkml_dist")
CONFIG = os.environ.get("SPARKML_DIST_CONFIG", "conf/adult.yaml")
MASTER = os.environ.get("SPARKML_DIST_MASTER")
STREAM_INPUT = os.environ.get("SPARKML_DIST_STREAM_INPUT")

with DAG(
    dag_id="sparkml_dist_" + re.sub(r"[^A-Za-z0-9_.-]", "_", PurePath(CONFIG).stem),
    start_date=datetime(2026, 1, 1),
    schedule="@daily",
    catchup=False,
    max_active_runs=1,
    tags=["sparkml_dist", "ml"],
) as dag:
    operators = {}
    tasks = [(task, ()) for task in WORKFLOW]
    if STREAM_INPUT:
        tasks.append((STREAM_SCORING, stream_arguments(STREAM_INPUT)))
    for task, extra in tasks:
        command = spark_submit_command(task, CONFIG, "{{ ds }}", MASTER, extra)
        operators[task.name] = BashOperator(
            task_id=task.name,
            # every argument quoted: a variable's value is data, never shell syntax
            bash_command=f"cd {shlex.quote(HOME)} && {shlex.join(command)}",
            retries=1,
        )
    for task, _ in tasks:
        for upstream in task.depends_on:
            operators[upstream] >> operators[task.name]
