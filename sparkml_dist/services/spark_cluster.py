"""A real Spark standalone cluster on one machine: one master and N workers bound to 127.0.0.1,
started with the pip pyspark package's `sbin/spark-daemon.sh` (it has no start-master.sh) and
stopped by the PIDs the daemon script records.

    python -m sparkml_dist.services.spark_cluster start --workers 2 --dir /tmp/spark-cluster
    python -m sparkml_dist.services.spark_cluster stop --dir /tmp/spark-cluster

The command line uses Spark's own default ports (master 7077, web UI 8080) and workers sized for
conf/spark/cluster.conf (1 core, 4g each); the library call lets the master bind ports the kernel
picks (read back from its log) unless told.

Spark's own authentication is on: each start writes a fresh random secret, with
`spark.authenticate` and `spark.network.crypto.enabled` (AES-encrypted RPC and block transfers),
to `<dir>/conf/spark-defaults.conf` (mode 0600). The daemons read it through SPARK_CONF_DIR; a
job joins with `SPARK_CONF_DIR=<dir>/conf spark-submit --load-spark-defaults ...`. An
application without the secret cannot register with the master or reach an executor.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyspark

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


@dataclass
class StandaloneCluster:
    workdir: Path
    master_url: str
    web_url: str
    workers: int

    def env(self) -> dict[str, str]:
        return daemon_env(self.workdir)

    @property
    def conf_dir(self) -> Path:
        """SPARK_CONF_DIR for a job on this cluster: its spark-defaults.conf holds the shared secret."""
        return self.workdir / "conf"

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"{self.web_url}/json/", timeout=3) as resp:
                state = json.load(resp)
        except OSError:
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        """Stop every daemon by the PID in its pid file (SIGTERM, then SIGKILL)."""
        for pid_file in sorted((self.workdir / "pids").glob("*.pid")):
            pid = int(pid_file.read_text().strip() or 0)
            _terminate(pid)
            pid_file.unlink(missing_ok=True)


def daemon_env(workdir: Path) -> dict[str, str]:
    home = str(Path(pyspark.__file__).parent)
    return {
        **os.environ,
        "SPARK_HOME": home,
        "SPARK_PID_DIR": str(workdir / "pids"),
        "SPARK_LOG_DIR": str(workdir / "logs"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(workdir / "work"),
        "SPARK_IDENT_STRING": "sparkml_dist",
        "SPARK_CONF_DIR": str(workdir / "conf"),
    }


def write_auth_conf(workdir: Path) -> Path:
    """A fresh shared secret with authentication and RPC encryption on, readable by this user only."""
    conf = workdir / "conf"
    conf.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = conf / "spark-defaults.conf"
    path.unlink(missing_ok=True)  # created anew below with mode 0600, never widened
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(
            "# written by sparkml_dist.services.spark_cluster start: a fresh secret per cluster\n"
            "spark.authenticate                 true\n"
            f"spark.authenticate.secret          {secrets.token_hex(32)}\n"
            "spark.network.crypto.enabled       true\n"
        )
    return path


def start_cluster(
    workdir: str | Path,
    workers: int = 2,
    cores_per_worker: int = 1,
    memory: str = "2g",
    timeout_s: float = 60,
    worker_conf: dict[str, str] | None = None,
    port: int = 0,
    webui_port: int = 0,
) -> StandaloneCluster:
    """Start a master and `workers` workers on 127.0.0.1; `port`/`webui_port` 0: ports the kernel picks."""
    workdir = Path(workdir).resolve()
    for sub in ("pids", "logs", "work"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    write_auth_conf(workdir)
    env = daemon_env(workdir)
    if worker_conf:  # e.g. GPU resources: spark.worker.resource.gpu.amount / .discoveryScript
        env["SPARK_WORKER_OPTS"] = " ".join(f"-D{k}={v}" for k, v in worker_conf.items())
    daemon = str(Path(env["SPARK_HOME"]) / "sbin" / "spark-daemon.sh")
    for wanted in (port, webui_port):
        if wanted:
            _check_port_free(wanted)
    # port 0: the master binds a port the kernel picks and names it in its log (no free-port race)
    _run(
        [
            daemon,
            "start",
            MASTER,
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(webui_port),
        ],
        env,
    )
    master_url, web_url = _master_addresses(workdir, timeout_s)
    cluster = StandaloneCluster(workdir, master_url, web_url, workers)
    for i in range(1, workers + 1):
        _run(
            [
                daemon,
                "start",
                WORKER,
                str(i),
                "--host",
                "127.0.0.1",
                "--cores",
                str(cores_per_worker),
                "--memory",
                memory,
                "--webui-port",
                "0",
                cluster.master_url,
            ],
            env,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cluster.alive_workers() == workers:
            return cluster
        time.sleep(0.5)
    logs = "\n".join(
        f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((workdir / "logs").glob("*.out"))
    )
    cluster.stop()
    raise RuntimeError(
        f"standalone cluster: {cluster.alive_workers()}/{workers} workers ALIVE after {timeout_s}s\n{logs}"
    )


_MASTER_AT = re.compile(r"Starting Spark master at (spark://\S+)")
_WEB_UI_AT = re.compile(r"Bound MasterWebUI to \S+, and started at http://[^:\s]+:(\d+)")


def _master_addresses(workdir: Path, timeout_s: float) -> tuple[str, str]:
    """The master's URL and web UI, as its log names them once it is listening."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = "".join(p.read_text(errors="replace") for p in (workdir / "logs").glob(f"*{MASTER}*.out"))
        master, web = _MASTER_AT.findall(text), _WEB_UI_AT.findall(text)
        if master and web:
            return master[-1], f"http://127.0.0.1:{web[-1]}"
        time.sleep(0.3)
    raise RuntimeError(
        f"the Spark master did not report its address within {timeout_s}s; its log:\n{text[-2000:]}"
    )


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise RuntimeError(
                f"port {port} on 127.0.0.1 is in use (another Spark master?): stop it, or pass "
                f"--port / --webui-port"
            ) from None


def _run(cmd: list[str], env: dict[str, str]) -> None:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed ({out.returncode}): {out.stderr or out.stdout}")


def _terminate(pid: int) -> None:
    if pid <= 0:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", default="/tmp/sparkml_dist-cluster")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument(
        "--memory", default="4g", help="memory per worker (conf/spark/cluster.conf asks 4g executors)"
    )
    parser.add_argument("--port", type=int, default=7077, help="master port (0: a free one)")
    parser.add_argument(
        "--webui-port",
        type=int,
        default=8080,
        help="master web UI port, where jobs read the workers' free capacity (0: a free one)",
    )
    args = parser.parse_args(argv)
    if args.action == "start":
        c = start_cluster(
            args.dir, args.workers, args.cores, args.memory, port=args.port, webui_port=args.webui_port
        )
        (Path(args.dir) / "cluster.json").write_text(json.dumps({"master": c.master_url, "web": c.web_url}))
        print(
            f"master {c.master_url} (UI {c.web_url}), {c.workers} workers ALIVE; stop: "
            f"python -m sparkml_dist.services.spark_cluster stop --dir {args.dir}"
        )
        print(
            f"Spark authentication on: submit with SPARK_CONF_DIR={args.dir}/conf and --load-spark-defaults "
            f"(its spark-defaults.conf holds this cluster's secret)"
        )
    else:
        StandaloneCluster(Path(args.dir).resolve(), "", "", 0).stop()
        print(f"stopped the daemons recorded under {args.dir}/pids")


if __name__ == "__main__":
    main()
