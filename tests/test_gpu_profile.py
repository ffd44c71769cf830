"""GPU placement, tested on CPU: a real standalone worker advertises two fake GPUs through the
discovery script, the gpu profile asks one GPU per task, and each barrier rank gets its own."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkml_dist.launch.backend import gpu_index
from sparkml_dist.launch.context import RankContext
from sparkml_dist.services.spark_cluster import start_cluster

ROOT = Path(__file__).resolve().parents[1]


def ctx(rank, local_rank, local_size, gpus=()):
    return RankContext(rank, 2, local_rank, local_size, 0, 1, "h", "h", 1, tuple(gpus))


def test_gpu_index_prefers_the_task_resource_then_the_local_rank():
    assert gpu_index(ctx(0, 0, 2, ["1"]), 2) == 1
    assert gpu_index(ctx(1, 1, 2), 2) == 1
    with pytest.raises(RuntimeError, match="Spark assigned GPU 3 but torch sees 2"):
        gpu_index(ctx(0, 0, 1, ["3"]), 2)
    with pytest.raises(RuntimeError, match="3 ranks on h but only 2 GPU"):
        gpu_index(ctx(2, 2, 3), 2)


@pytest.mark.slow
def test_each_rank_gets_the_gpu_spark_assigned_to_its_task(tmp_path, monkeypatch):
    script = ROOT / "scripts" / "get_gpus_resources.sh"
    monkeypatch.setenv("SPARKML_DIST_FAKE_GPUS", "0,1")  # read by the discovery script
    cluster = start_cluster(
        tmp_path / "cluster",
        workers=1,
        cores_per_worker=2,
        worker_conf={
            "spark.worker.resource.gpu.amount": "2",
            "spark.worker.resource.gpu.discoveryScript": str(script),
        },
    )
    try:
        cmd = [
            str(Path(sys.executable).parent / "spark-submit"),
            "--master",
            cluster.master_url,
            "--load-spark-defaults",
            "--properties-file",
            str(ROOT / "conf/spark/gpu.conf"),
            "--conf",
            "spark.executor.cores=2",
            "--conf",
            "spark.executor.resource.gpu.amount=2",
            "--conf",
            f"spark.executor.resource.gpu.discoveryScript={script}",
            "--conf",
            f"spark.pyspark.python={sys.executable}",
            str(ROOT / "tests/jobs/gpu_assignment.py"),
        ]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_CONF_DIR": str(cluster.conf_dir)}
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    finally:
        cluster.stop()
    # the cause is usually far above the JVM's shutdown noise: keep the lines that name errors
    causes = [
        ln
        for ln in out.stderr.splitlines()
        if ("Error" in ln or "rank" in ln) and not ln.lstrip().startswith("at ")
    ]
    assert out.returncode == 0, "\n".join(causes[:40]) + "\n...\n" + out.stderr[-1500:]
    assert f"MASTER {cluster.master_url}" in out.stdout, "ran on the cluster, not a local fallback"
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("GPU_ASSIGNMENT "))
    ranks = json.loads(line.split(" ", 1)[1])
    assert sorted(g for r in ranks for g in r["gpus"]) == ["0", "1"], "one distinct GPU per task"
    assert all(r["index"] == int(r["gpus"][0]) for r in ranks)
