"""The jobs on an emulated cluster of hosts (sparkml_dist.services.hosts): a master on host 0 (where
jobs are submitted), a worker on each of two more hosts, each host its own network namespace with
two addresses and its own /tmp; only the output root is shared. Submitted with the README's
profile (conf/spark/cluster.conf), one rank per executor, so the ranks are on different hosts
from each other and from the driver.

While a job runs, every TCP listener of a Python process on each host is audited: it must be
bound to the host's own cluster address (or loopback), and a connection to the same port on the
host's other address, from another host, must be refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sparkml_dist.services.hosts import EmulatedHosts

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


DOC = ROOT / "docs" / "deployment.md"
START = (
    ".venv/bin/python -m sparkml_dist.services.hosts start --workers 2 --shared /tmp/sparkml_dist-shared "
    "--dir /tmp/sparkml_dist-hosts"
)
PIPELINE = """.venv/bin/python -m sparkml_dist.services.hosts exec --dir /tmp/sparkml_dist-hosts 0 -- \\
  .venv/bin/spark-submit --master spark://10.77.0.1:7077 --load-spark-defaults \\
  --properties-file conf/spark/cluster.conf \\
  jobs/pipeline.py --config conf/adult.yaml --set output.root=/tmp/sparkml_dist-shared/out \\
  --set tracking.tracking_uri=sqlite:////tmp/sparkml_dist-shared/mlflow.db"""
KILL = ".venv/bin/python -m sparkml_dist.services.hosts kill --dir /tmp/sparkml_dist-hosts 2"
STOP = ".venv/bin/python -m sparkml_dist.services.hosts stop --dir /tmp/sparkml_dist-hosts"
SHARED = Path("/tmp/sparkml_dist-shared")


def run_as_documented(command: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    assert command in DOC.read_text(), f"docs/deployment.md shows `{command}`"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPARKML_DIST_", "MLFLOW_TRACKING", "PYSPARK"))
    }
    return subprocess.run(
        command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A directory like a fresh clone's: conf/, jobs/ and .venv/ from the repository."""
    cwd = tmp_path_factory.mktemp("hosts-user")
    for name in ("conf", ".venv", "jobs"):
        (cwd / name).symlink_to(ROOT / name)
    return cwd


@pytest.fixture(scope="module")
def hosts(workdir):
    shutil.rmtree(SHARED, ignore_errors=True)
    started = run_as_documented(START, workdir, timeout=180)
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-3000:]
        assert (
            "master spark://10.77.0.1:7077 (UI http://10.77.0.1:8080) on host 0, 2 workers ALIVE"
            in started.stdout
        )
        cluster = EmulatedHosts.load("/tmp/sparkml_dist-hosts")
        yield cluster
    finally:
        stopped = run_as_documented(STOP, workdir, timeout=180)
    assert stopped.returncode == 0, stopped.stderr
    assert not any(cluster.pids(h) for h in cluster.hosts), "every process on every host was stopped"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(h.netns in listed for h in cluster.hosts), "the namespaces are gone"
    again = run_as_documented(STOP, workdir, timeout=60)
    assert again.returncode == 0, "stop is idempotent"


@pytest.fixture(scope="module")
def package_zip(hosts):
    """--py-files from the shared directory, as a user would stage it on the cluster's storage."""
    return shutil.make_archive(str(SHARED / "dist" / "sparkml_dist"), "zip", ROOT, "sparkml_dist")


class ListenerAudit(threading.Thread):
    """Polls every host's Python listeners while a job runs; records the wrongly bound and probes
    each rightly bound one from another host, on the other address of its host."""

    def __init__(self, cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.stop_event = threading.Event()
        self.wrong: list[str] = []
        self.probed: dict[tuple[int, int], bool] = {}  # (host, port) -> reachable on the other address

    def run(self) -> None:
        while not self.stop_event.is_set():
            for host in self.cluster.hosts:
                for address, port, process in self.cluster.listeners(host):
                    if not process.startswith("python"):
                        continue
                    plain = address.removeprefix("::ffff:")
                    if plain in ("127.0.0.1", "::1"):
                        continue
                    if plain != host.address:
                        self.wrong.append(f"host {host.index}: {process} listens on {address}:{port}")
                    elif (host.index, port) not in self.probed:
                        other = self.cluster.hosts[(host.index + 1) % len(self.cluster.hosts)]
                        self.probed[(host.index, port)] = self.cluster.reachable(
                            other, host.alt_address, port
                        )
            time.sleep(0.3)

    def __enter__(self) -> ListenerAudit:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.join(timeout=30)


def submit(cluster, package_zip, job: str, *overrides: str, timeout: int = 600) -> tuple[str, ListenerAudit]:
    """spark-submit on host 0 over the documented pipeline's output (its preprocessed splits)."""
    run = SHARED
    argv = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        cluster.master_url,
        "--load-spark-defaults",
        "--properties-file",
        str(ROOT / "conf/spark/cluster.conf"),
        "--py-files",
        package_zip,
        str(ROOT / job),
        "--config",
        str(ROOT / "conf/adult.yaml"),
        "--set",
        f"output.root={run / 'out'}",
        "--set",
        f"tracking.tracking_uri=sqlite:///{run / 'mlflow.db'}",
        *[a for o in overrides for a in ("--set", o)],
    ]
    with ListenerAudit(cluster) as audit:
        done = cluster.run(0, argv, capture_output=True, text=True, timeout=timeout, cwd=run)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    assert f"master {cluster.master_url}" in done.stderr
    return done.stdout, audit


def assert_bound_to_own_address(audit: ListenerAudit, worker_hosts: int = 2) -> None:
    assert not audit.wrong, audit.wrong
    assert audit.probed, "the audit saw the ranks' listeners (rendezvous store, gloo)"
    reachable = [f"host {h} port {p}" for (h, p), ok in audit.probed.items() if ok]
    assert not reachable, f"reachable on the host's other address: {reachable}"
    assert len({h for h, _ in audit.probed} & {1, 2}) >= worker_hosts, (
        "listeners on the worker hosts were probed"
    )


def test_pipeline_with_ddp_ranks_on_two_hosts(hosts, workdir):
    """The documented command as written: the driver on host 0, one rank on each worker host."""
    with ListenerAudit(hosts) as audit:
        done = run_as_documented(PIPELINE, workdir)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    assert "=== sparkml_dist pipeline summary ===" in done.stdout
    summary = json.loads((SHARED / "out" / "summary.json").read_text())
    assert summary["test_metrics"]["accuracy"] >= 0.84
    assert summary["rows"]["scored"] + summary["rows"]["score_rejected"] == 16282
    assert_bound_to_own_address(audit)
    for host in hosts.hosts:  # the driver's and the executors' own disks
        own = Path(host.tmp)
        kept = [
            p
            for pattern in ("manifest.json", "ckpt-*", "summary.json", "train.json")
            for p in own.rglob(pattern)
        ]
        assert not kept, f"host {host.index} keeps job state on its own disk: {kept[:5]}"


def test_horovod_ranks_on_two_hosts(hosts, package_zip):
    stdout, audit = submit(hosts, package_zip, "jobs/train.py", "train.epochs=1", "train.backend=horovod")
    assert "ranks in step: True" in stdout
    # Horovod's Gloo listeners on the workers live too briefly for the poll to be sure to catch
    # them; the gateway to its rendezvous server, in rank 0's task, lives the whole stage
    assert_bound_to_own_address(audit, worker_hosts=1)


@pytest.mark.parametrize(
    "overrides",
    [["train.strategy=fsdp"], ["train.strategy=async", "train.async_ps.servers=1"]],
    ids=["fsdp", "async"],
)
def test_model_and_parameter_server_methods_on_two_hosts(hosts, package_zip, overrides):
    stdout, audit = submit(hosts, package_zip, "jobs/train.py", "train.epochs=1", *overrides)
    assert f"({overrides[0].split('=')[1]}), model runs:/" in stdout
    assert_bound_to_own_address(audit)


def test_federated_rounds_on_two_hosts(hosts, package_zip):
    stdout, _ = submit(
        hosts, package_zip, "jobs/federated.py", "federated.client_column=occupation", "federated.rounds=2"
    )
    assert "=== sparkml_dist federated ===" in stdout and "2 rounds" in stdout


def test_losing_a_whole_host_mid_training_continues_with_fewer_ranks(hosts, package_zip, workdir):
    """Every process of worker host 2 is killed (the documented command) while its rank trains.
    The driver relaunches; only host 1's slot is left, so after train.elastic_wait_s the run
    continues with 1 rank (train.min_ranks=1) from the newest epoch start, says so in the log and
    an MLflow tag, and every epoch still trains on every training row exactly once."""
    from mlflow.tracking import MlflowClient

    checkpoints = SHARED / "out" / "checkpoints"
    before = set(checkpoints.glob("*")) if checkpoints.exists() else set()
    argv = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        hosts.master_url,
        "--load-spark-defaults",
        "--properties-file",
        str(ROOT / "conf/spark/cluster.conf"),
        "--py-files",
        package_zip,
        str(ROOT / "jobs/train.py"),
        "--config",
        str(ROOT / "conf/adult.yaml"),
        "--set",
        f"output.root={SHARED / 'out'}",
        "--set",
        f"tracking.tracking_uri=sqlite:///{SHARED / 'mlflow.db'}",
        "--set",
        "train.epochs=6",
        "--set",
        "train.min_ranks=1",
        "--set",
        "train.elastic_wait_s=10",
        "--set",
        "train.checkpoint_every_steps=20",
    ]
    job = hosts.popen(0, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=SHARED)
    try:
        deadline = time.monotonic() + 300
        while not list(set(checkpoints.glob("*")) - before) or not any(
            (d / "ckpt-e00002-s0000000.pt").exists() for d in set(checkpoints.glob("*")) - before
        ):
            assert job.poll() is None and time.monotonic() < deadline, "training reached epoch 3"
            time.sleep(0.2)
        killed = run_as_documented(KILL, workdir, timeout=60)
        stdout, stderr = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
    assert killed.returncode == 0 and "host 2: killed" in killed.stdout
    assert not hosts.pids(2), "no process is left on the lost host"
    assert job.returncode == 0, stdout[-2000:] + stderr[-4000:]
    said = stdout + stderr
    assert "elastic: 1 of 2 ranks can be placed" in said
    record = json.loads((SHARED / "out" / "train.json").read_text())
    train_rows = 29384
    assert [r["samples"] for r in record["records"]] == [train_rows] * 6, "each epoch saw every row once"
    run = MlflowClient(f"sqlite:///{SHARED / 'mlflow.db'}").get_run(record["run_id"])
    assert run.data.tags["sparkml_dist.elastic"] == "ranks per attempt: 2 -> 1"
    assert run.data.metrics["train_attempts"] == 2
    assert hosts.alive_workers() == 1, "the master saw the lost worker go"
