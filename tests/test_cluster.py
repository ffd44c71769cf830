"""The real jobs on a real Spark standalone cluster (master + 2 workers on 127.0.0.1), submitted
with spark-submit, the package shipped with --py-files, one rank per executor, both backends."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkml_dist.services.spark_cluster import start_cluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("cluster"), workers=2, cores_per_worker=1)
    yield c
    c.stop()
    assert c.alive_workers() == 0


@pytest.fixture(scope="module")
def package_zip(tmp_path_factory):
    """What users ship to executors that do not have the project installed: --py-files."""
    out = tmp_path_factory.mktemp("dist") / "sparkml_dist"
    return shutil.make_archive(str(out), "zip", ROOT, "sparkml_dist")


def submit(cluster, package_zip, job, tmp_path, *overrides, env_extra=None):
    spark_submit = Path(sys.executable).parent / "spark-submit"
    cmd = [str(spark_submit), "--master", cluster.master_url,
           "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2",
           "--conf", f"spark.pyspark.python={sys.executable}", "--py-files", package_zip,
           str(ROOT / job), "--config", str(ROOT / "conf/adult.yaml"),
           "--set", f"output.root={tmp_path / 'out'}", "--set", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
           *[a for o in overrides for a in ("--set", o)]]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(env_extra or {})}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    assert f"master {cluster.master_url}" in out.stderr, "the job ran on the cluster, not a local fallback"
    return out.stdout


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("cluster-run")


def test_pipeline_job_on_the_standalone_cluster(cluster, package_zip, workdir):
    stdout = submit(cluster, package_zip, "jobs/pipeline.py", workdir, "train.epochs=4")
    assert "=== sparkml_dist pipeline summary ===" in stdout
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert summary["test_metrics"]["accuracy"] >= 0.84
    assert summary["rows"]["scored"] + summary["rows"]["score_rejected"] == 16282


@pytest.mark.parametrize("backend", ["torch", "horovod"])
def test_two_rank_training_one_rank_per_executor(cluster, package_zip, workdir, backend):
    stdout = submit(cluster, package_zip, "jobs/train.py", workdir, "train.epochs=2", f"train.backend={backend}")
    assert "ranks in step: True" in stdout
    assert "rows per rank [14692, 14692]" in stdout


def test_custom_model_shipped_only_by_the_job(cluster, package_zip, tmp_path):
    """The factory's package exists only in a directory on the driver's PYTHONPATH: the executors
    (whose workers started without it) train, and score, with the copy the job ships."""
    package = f"shipped_nets_{os.getpid()}"
    source = tmp_path / "user_src" / package
    source.mkdir(parents=True)
    (source / "__init__.py").write_text("")
    shutil.copy(ROOT / "tests" / "user_code" / "nets.py", source / "nets.py")
    stdout = submit(cluster, package_zip, "jobs/pipeline.py", tmp_path, "train.epochs=2", "model.kind=custom",
                    f"model.factory={package}.nets:residual_mlp", "model.options={width: 32}",
                    env_extra={"PYTHONPATH": os.pathsep.join([str(source.parent), os.environ.get("PYTHONPATH", "")])})
    assert "=== sparkml_dist pipeline summary ===" in stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["test_metrics"]["accuracy"] >= 0.83
    assert summary["rows"]["scored"] + summary["rows"]["score_rejected"] == 16282
