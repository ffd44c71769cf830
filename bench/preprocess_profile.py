"""Where preprocessing time goes (docs/benchmarks.md, preprocess_vs_spark_io): one run of our
preprocess stage on generated Adult-shaped rows, profiled by Spark's own task metrics (the
REST API of the application's UI, bound to 127.0.0.1): job wall time and executor run time
per phase (the stage labels its Spark jobs with `job_phase`).

    .venv/bin/python -m bench.preprocess_profile [--rows 1000000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent / "preprocess_profile.json"


def phase_table(ui: str, app_id: str, skip_jobs: set[int]) -> list[dict]:
    """Executor run time and job wall time per job description (the preprocess phases)."""
    api = f"{ui}/api/v1/applications/{app_id}"
    jobs = [j for j in _get(f"{api}/jobs") if j["jobId"] not in skip_jobs]
    stages = {s["stageId"]: s for s in _get(f"{api}/stages?status=complete")}
    phases: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for job in jobs:
        phase = phases[job.get("description", "(unlabelled)")]
        phase["jobs"] += 1
        phase["wall_s"] += (_ms(job["completionTime"]) - _ms(job["submissionTime"])) / 1000
        for stage_id in job["stageIds"]:
            stage = stages.get(stage_id)
            if stage is not None:
                phase["executor_run_s"] += stage["executorRunTime"] / 1000
                phase["input_mib"] += stage.get("inputBytes", 0) / 2**20
                phase["output_mib"] += stage.get("outputBytes", 0) / 2**20
    return [{"phase": k, **{m: round(v, 2) for m, v in metrics.items()}} for k, metrics in phases.items()]


def _get(url: str):
    with urllib.request.urlopen(url) as response:
        return json.load(response)


def _ms(stamp: str) -> float:
    from datetime import datetime

    return datetime.strptime(stamp.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000


def main(rows: int = 1_000_000) -> list[dict]:
    from bench.preprocess import CONFIG
    from sparkml_dist.config import SparkConfig, load_config
    from sparkml_dist.data.generate import adult_like, write_csv
    from sparkml_dist.spark import build_session
    from sparkml_dist.stages import preprocess

    spark = build_session(
        SparkConfig(
            master="local[2]",
            app_name="bench-preprocess-profile",  # UI on a kernel-picked port
            conf={"spark.ui.enabled": "true", "spark.ui.port": "0"},
        )
    )
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        train, test = f"{tmp}/train_csv", f"{tmp}/test_csv"
        write_csv(adult_like(spark, rows, seed=1), train, 8)
        write_csv(adult_like(spark, max(rows // 10, 1000), seed=2), test, 2)
        api = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}"
        generated = {j["jobId"] for j in _get(f"{api}/jobs")}  # generating the data is not preprocessing
        cfg = load_config(
            CONFIG, [f"data.train_path={train}", f"data.test_path={test}", f"output.root={tmp}/ours"]
        )
        t0 = time.perf_counter()
        preprocess(spark, cfg)
        seconds = time.perf_counter() - t0
    table = phase_table(spark.sparkContext.uiWebUrl, spark.sparkContext.applicationId, generated)
    print(f"preprocess of {rows:,} + {max(rows // 10, 1000):,} rows: {seconds:.1f} s wall on 2 cores")
    for r in table:
        print(
            f"{r['wall_s']:7.1f} s wall {r['executor_run_s']:7.1f} s in tasks  {int(r['jobs']):3d} jobs  {r['phase']}"
        )
    OUT.write_text(json.dumps({"seconds": seconds, "phases": table}, indent=1))
    spark.stop()
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    main(parser.parse_args().rows)
