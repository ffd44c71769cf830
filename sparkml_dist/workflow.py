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

# Optional, where a deployment names an input directory: after registration, score the files
# that arrived there since the last run with the (possibly new) champion, then stop. The
# stream's checkpoint spans run dates, so each file is scored once, by the first run after it
# arrived (docs/streaming.md).
STREAM_SCORING = Task("stream_score", "jobs/stream.py", ("register",))


def stream_arguments(input_dir: str) -> list[str]:
    return ["--input", input_dir, "--set", "stream.trigger=available_now"]


def job_arguments(config: str, run_date: str) -> list[str]:
    """Arguments every task's job gets: the config and the run date its outputs are scoped to."""
    return ["--config", config, "--run-date", run_date]


def spark_submit_command(
    task: Task, config: str, run_date: str, master: str | None = None, extra: list[str] | tuple[str, ...] = ()
) -> list[str]:
    cmd = ["spark-submit"]
    if master:
        cmd += ["--master", master]
    return cmd + [task.job, *job_arguments(config, run_date), *extra]
