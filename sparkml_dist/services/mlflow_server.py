"""Start and stop a real `mlflow server` (sqlite backend, local artifact root, one worker).

The server binds a port the kernel picks (`--port 0`) and this reads it from uvicorn's start
line: picking a free port first and passing it on would leave a window in which another
process could take it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

_LISTENING = re.compile(r"Uvicorn running on (http://[^\s]+:\d+)")


@dataclass
class MlflowServer:
    process: subprocess.Popen
    url: str
    log: Path

    def stop(self) -> None:
        """SIGTERM the server's process group (gunicorn/uvicorn workers included) by PID."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_mlflow_server(workdir: str | Path, host: str = "127.0.0.1", timeout_s: float = 90) -> MlflowServer:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "mlflow-server.log"
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{workdir / 'mlflow.db'}",
        "--artifacts-destination",
        str(workdir / "artifacts"),
        "--host",
        host,
        "--port",
        "0",
        "--workers",
        "1",
    ]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    process = subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    server = MlflowServer(process, "", log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"mlflow server exited with code {process.returncode}; see {log}:\n{log.read_text()[-2000:]}"
            )
        if not server.url:
            found = _LISTENING.search(log.read_text(errors="replace"))
            server.url = found.group(1) if found else ""
        if server.url and _healthy(server.url):
            return server
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"mlflow server did not answer /health within {timeout_s}s; see {log}")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
