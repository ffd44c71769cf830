"""The real jobs on a real Spark standalone cluster (master + 2 workers on 127.0.0.1), submitted
with spark-submit, the package shipped with --py-files, one rank per executor, both backends."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkml_dist.services.spark_cluster import StandaloneCluster, start_cluster

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


def submit(cluster, package_zip, job, tmp_path, *overrides, env_extra=None, output_root=None, store=None):
    spark_submit = Path(sys.executable).parent / "spark-submit"
    cmd = [
        str(spark_submit),
        "--master",
        cluster.master_url,
        "--conf",
        "spark.executor.cores=1",
        "--conf",
        "spark.cores.max=2",
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--py-files",
        package_zip,
        str(ROOT / job),
        "--config",
        str(ROOT / "conf/adult.yaml"),
        "--set",
        f"output.root={output_root or tmp_path / 'out'}",
        "--set",
        f"tracking.tracking_uri=sqlite:///{store or tmp_path / 'mlflow.db'}",
        *[a for o in overrides for a in ("--set", o)],
    ]
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_CONF_DIR": str(cluster.conf_dir),
        **(env_extra or {}),
    }
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    assert f"master {cluster.master_url}" in out.stderr, "the job ran on the cluster, not a local fallback"
    return out.stdout


START = ".venv/bin/python -m sparkml_dist.services.spark_cluster start --workers 2 --dir /tmp/spark-cluster"
PACK = ".venv/bin/python -c \"import shutil; shutil.make_archive('dist/sparkml_dist', 'zip', '.', 'sparkml_dist')\""
SUBMIT = """SPARK_CONF_DIR=/tmp/spark-cluster/conf PYSPARK_PYTHON=$PWD/.venv/bin/python \\
  .venv/bin/spark-submit --master spark://127.0.0.1:7077 --load-spark-defaults \\
  --properties-file conf/spark/cluster.conf --py-files dist/sparkml_dist.zip \\
  jobs/pipeline.py --config conf/adult.yaml"""
STOP = ".venv/bin/python -m sparkml_dist.services.spark_cluster stop --dir /tmp/spark-cluster"


def run_as_written(command: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    assert command in (ROOT / "README.md").read_text(), f"the README shows `{command}`"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPARKML_DIST_", "MLFLOW_TRACKING", "PYSPARK"))
    }
    return subprocess.run(
        command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@dataclass
class ReadmeRun:
    """The README's recipe, run once for the file: its cluster stays up for the jobs below, which
    train over its preprocessed splits and track into its store."""

    cwd: Path
    started: subprocess.CompletedProcess
    packed: subprocess.CompletedProcess
    done: subprocess.CompletedProcess
    cluster: StandaloneCluster


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    """Its commands, flags and profile exactly, in a directory like a fresh clone's; stopped, as
    written, when the file's tests are done (the stop's own checks fail the file's teardown)."""
    cwd = tmp_path_factory.mktemp("readme-cluster")
    for name in ("conf", ".venv", "jobs", "sparkml_dist"):
        (cwd / name).symlink_to(ROOT / name)
    started = run_as_written(START, cwd, timeout=120)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        packed = run_as_written(PACK, cwd)
        done = run_as_written(SUBMIT, cwd)
        where = Path("/tmp/spark-cluster")  # START's --dir, where it records the addresses it bound
        bound = json.loads((where / "cluster.json").read_text())
        cluster = StandaloneCluster(where, bound["master"], bound["web"], 2)
        yield ReadmeRun(cwd, started, packed, done, cluster)
    finally:
        stopped = run_as_written(STOP, cwd, timeout=120)
        assert stopped.returncode == 0 and not list(Path("/tmp/spark-cluster/pids").glob("*.pid"))


def test_the_readme_cluster_recipe_as_written(readme_run):
    assert (
        "master spark://127.0.0.1:7077 (UI http://127.0.0.1:8080), 2 workers ALIVE"
        in readme_run.started.stdout
    )
    assert readme_run.packed.returncode == 0, readme_run.packed.stderr[-3000:]
    done = readme_run.done
    assert done.returncode == 0, done.stderr[-4000:]
    assert "master spark://127.0.0.1:7077" in done.stderr, "the job ran on the cluster, not a local fallback"
    assert "=== sparkml_dist pipeline summary ===" in done.stdout
    summary = json.loads((readme_run.cwd / "output" / "adult" / "summary.json").read_text())
    assert summary["test_metrics"]["accuracy"] >= 0.84
    assert summary["rows"]["scored"] + summary["rows"]["score_rejected"] == 16282


def test_a_job_the_workers_cannot_host_fails_naming_the_gap(cluster, package_zip, tmp_path):
    """The profile's 4g executors on 2g workers: no executor can start. The job fails within the
    bound, saying what it asked for and what each worker has free, instead of waiting forever."""
    spark_submit = Path(sys.executable).parent / "spark-submit"
    cmd = [
        str(spark_submit),
        "--master",
        cluster.master_url,
        "--load-spark-defaults",
        "--properties-file",
        str(ROOT / "conf/spark/cluster.conf"),
        "--conf",
        f"spark.master.ui.port={cluster.web_url.rsplit(':', 1)[1]}",
        "--py-files",
        package_zip,
        str(ROOT / "jobs/preprocess.py"),
        "--config",
        str(ROOT / "conf/adult.yaml"),
        "--set",
        f"output.root={tmp_path / 'out'}",
        "--set",
        "spark.executor_wait_s=15",
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_CONF_DIR": str(cluster.conf_dir)}
    started = time.monotonic()
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    said = out.stdout + out.stderr  # spark-submit's Python writes the job's stderr where it likes
    assert out.returncode != 0 and time.monotonic() - started < 120
    assert "no executor was granted within 15 s" in said, said[-3000:]
    assert "spark.executor.memory=4096m" in said
    assert "2 ALIVE workers (127.0.0.1: 1 cores / 2048m free" in said
    assert "lower spark.executor.memory to at most 2048m" in said
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.parquet"))


def test_an_application_without_the_clusters_secret_is_refused(cluster, tmp_path):
    """spark.authenticate is on (a fresh secret per cluster, in a mode-0600 spark-defaults.conf): an
    application that does not have it cannot register with the master."""
    conf = cluster.conf_dir / "spark-defaults.conf"
    assert conf.stat().st_mode & 0o077 == 0, "the secret is readable by its owner only"
    assert "spark.network.crypto.enabled       true" in conf.read_text()
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from pyspark.sql import SparkSession\nprint('COUNTED', SparkSession.builder.getOrCreate()"
        ".range(5).count())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"} | {"PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", cluster.master_url, str(probe)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(proc.stdout), daemon=True)  # until the refusal shows
    reader.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any("Expected SaslMessage" in line for line in list(said)):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # it would retry the master for a minute more
    proc.wait()
    reader.join(10)
    text = "".join(said)
    assert "Failed to connect to master" in text and "Expected SaslMessage" in text, text[-3000:]
    assert "COUNTED" not in text


@pytest.mark.parametrize("backend", ["torch", "horovod"])
def test_two_rank_training_one_rank_per_executor(readme_run, package_zip, backend):
    """Over the README run's preprocessed splits (its output root and store), on its cluster."""
    stdout = submit(
        readme_run.cluster,
        package_zip,
        "jobs/train.py",
        readme_run.cwd,
        "train.epochs=2",
        f"train.backend={backend}",
        output_root=readme_run.cwd / "output" / "adult",
        store=readme_run.cwd / "mlflow.db",
    )
    assert "ranks in step: True" in stdout
    assert "rows per rank [14692, 14692]" in stdout


def test_custom_model_shipped_only_by_the_job(readme_run, package_zip, tmp_path):
    """The factory's package exists only in a directory on the driver's PYTHONPATH: the executors
    (whose workers started without it) train, and score, with the copy the job ships."""
    package = f"shipped_nets_{os.getpid()}"
    source = tmp_path / "user_src" / package
    source.mkdir(parents=True)
    (source / "__init__.py").write_text("")
    shutil.copy(ROOT / "tests" / "user_code" / "nets.py", source / "nets.py")
    stdout = submit(
        readme_run.cluster,
        package_zip,
        "jobs/pipeline.py",
        tmp_path,
        "train.epochs=2",
        "model.kind=custom",
        f"model.factory={package}.nets:residual_mlp",
        "model.options={width: 32}",
        env_extra={"PYTHONPATH": os.pathsep.join([str(source.parent), os.environ.get("PYTHONPATH", "")])},
    )
    assert "=== sparkml_dist pipeline summary ===" in stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["test_metrics"]["accuracy"] >= 0.83
    assert summary["rows"]["scored"] + summary["rows"]["score_rejected"] == 16282
