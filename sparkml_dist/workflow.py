"""The scheduled ETL-to-training workflow as data: one task per stage, its job script and
dependencies. The Airflow DAG and the Databricks bundle in conf/workflows/ are built from (and
tested against) this one definition."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    name: str
    job: str
    depends_on: tuple[str, ...] = ()


WORKFLOW: tuple[Task, ...] = (
    Task("preprocess", "jobs/preprocess.py"),
    Task("train", "jobs/train.py", ("preprocess",)),
    Task("evaluate", "jobs/evaluate.py", ("train",)),
    Task("register", "jobs/register.py", ("evaluate",)),
    Task("score", "jobs/score.py", ("register",)),
)


def job_arguments(config: str, run_date: str) -> list[str]:
    """Arguments every task's job gets: the config and the run date its outputs are scoped to."""
    return ["--config", config, "--run-date", run_date]


def spark_submit_command(task: Task, config: str, run_date: str, master: str | None = None) -> list[str]:
    cmd = ["spark-submit"]
    if master:
        cmd += ["--master", master]
    return cmd + [task.job, *job_arguments(config, run_date)]
