"""Airflow DAG: the Adult ETL-to-training workflow, one spark-submit task per stage, daily.

Copy (or symlink) into your Airflow dags folder on a machine where the project is installed.
Each run's outputs are scoped to its logical date (`--run-date {{ ds }}`), so a re-run or a
backfill replaces that date's outputs instead of duplicating them.
Variables: SPARKML_DIST_HOME (the project checkout), SPARKML_DIST_MASTER (e.g. spark://host:7077).
"""

from __future__ import annotations

import os
import shlex
from datetime import datetime

from airflow import DAG

try:  # Airflow 3: operators live in the standard provider
    from airflow.providers.standard.operators.bash import BashOperator
except ImportError:  # Airflow 2
    from airflow.operators.bash import BashOperator

from sparkml_dist.workflow import WORKFLOW, spark_submit_command

HOME = os.environ.get("SPARKML_DIST_HOME", "/opt/sparkml_dist")
MASTER = os.environ.get("SPARKML_DIST_MASTER")

with DAG(
    dag_id="sparkml_dist_adult",
    start_date=datetime(2026, 1, 1),
    schedule="@daily",
    catchup=False,
    max_active_runs=1,
    tags=["sparkml_dist", "ml"],
) as dag:
    operators = {}
    for task in WORKFLOW:
        command = spark_submit_command(task, "conf/adult.yaml", "{{ ds }}", MASTER)
        operators[task.name] = BashOperator(
            task_id=task.name,
            # every argument quoted: a variable's value is data, never shell syntax
            bash_command=f"cd {shlex.quote(HOME)} && {shlex.join(command)}",
            retries=1,
        )
    for task in WORKFLOW:
        for upstream in task.depends_on:
            operators[upstream] >> operators[task.name]
