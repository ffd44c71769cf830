"""An emulated cluster of hosts on one Linux machine (root), for tests and for trying a
multi-host deployment before there is one.

Each host is its own network namespace with two addresses on two interfaces (eth0 10.77.0.N,
eth1 10.77.1.N), both attached to a bridge inside a switch namespace that only these hosts
reach: traffic never leaves the namespaces this module creates. Every command run "on" a host
also gets a private mount namespace whose /tmp is that host's own directory, so Spark's work and
local directories, spills and anything written to /tmp stay on the host, as on a real machine.
Paths are seen the same on every host (the "image": the Python environment and project), and one
shared directory is mounted at the same path on all of them, the way NFS or Databricks' FUSE
mount would be. A Spark standalone master runs on host 0 (which is also where jobs are
submitted from) and one worker on each other host.

    python -m sparkml_dist.services.hosts start --workers 2 --shared /srv/sparkml-shared --dir /tmp/hosts
    python -m sparkml_dist.services.hosts exec --dir /tmp/hosts 0 -- spark-submit --master spark://10.77.0.1:7077 ...
    python -m sparkml_dist.services.hosts kill --dir /tmp/hosts 2     # lose host 2: every process on it
    python -m sparkml_dist.services.hosts stop --dir /tmp/hosts

Stopped by PID (every process in each host's namespace), then the namespaces are deleted;
`stop` is idempotent and also cleans up after a run that died half-way.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyspark

from sparkml_dist.services.spark_cluster import write_auth_conf

MASTER_PORT = 7077
MASTER_UI_PORT = 8080
SUBNET, ALT_SUBNET = "10.77.0", "10.77.1"
STATE_FILE = "hosts.json"

# Run inside `unshare --mount --propagation private`: the kept paths under /tmp (shared root,
# image) are first bound to the same place inside the host's directory, which is then bound
# recursively over /tmp, so they stay where they were and everything else in /tmp is the host's.
# /dev/shm is the host's own too, as on separate machines (DDP's ranks share memory only within one).
_ENTER_HOST = r"""
set -e
host_tmp="$1"; shift
keeps="$1"; shift
for keep in $keeps; do
  case "$keep" in
    /tmp/*) mkdir -p "$host_tmp/${keep#/tmp/}"; mount --bind "$keep" "$host_tmp/${keep#/tmp/}" ;;
  esac
done
mount --rbind "$host_tmp" /tmp
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
exec "$@"
"""


@dataclass(frozen=True)
class Host:
    index: int
    netns: str
    address: str  # eth0: what Spark, the ranks and every listener of the project use
    alt_address: str  # eth1: a second address of the same host, on which nothing of ours may listen
    root: str  # backs the host's private /tmp

    @property
    def tmp(self) -> str:
        return str(Path(self.root) / "tmp")


@dataclass
class EmulatedHosts:
    workdir: str
    shared: str
    hosts: list[Host]
    switch: str
    keep: list[str] = field(default_factory=list)

    # -- running things on a host ------------------------------------------------------------
    def command(self, host: Host | int, argv: list[str]) -> list[str]:
        host = self.host(host)
        keeps = " ".join(dict.fromkeys([self.shared, *self.keep]))
        return [
            "ip",
            "netns",
            "exec",
            host.netns,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "bash",
            "-c",
            _ENTER_HOST,
            "enter-host",
            host.tmp,
            keeps,
            *argv,
        ]

    def env(self, host: Host | int, extra: dict[str, str] | None = None) -> dict[str, str]:
        host = self.host(host)
        spark_home = str(Path(pyspark.__file__).parent)
        return {
            **os.environ,
            "SPARK_HOME": spark_home,
            "SPARK_LOCAL_IP": host.address,
            "SPARK_PID_DIR": "/tmp/spark-pids",
            "SPARK_LOG_DIR": "/tmp/spark-logs",
            "SPARK_WORKER_DIR": "/tmp/spark-work",
            "SPARK_IDENT_STRING": "sparkml_dist",
            "PYSPARK_PYTHON": sys.executable,
            "TMPDIR": "/tmp",
            "SPARK_CONF_DIR": str(self.spark_conf_dir),
            **(extra or {}),
        }

    @property
    def spark_conf_dir(self) -> Path:
        """Every host's SPARK_CONF_DIR, on the shared mount: its spark-defaults.conf holds the
        cluster's Spark secret (`spark_cluster.write_auth_conf`), as each node of a real cluster would."""
        return Path(self.shared) / ".spark-auth" / "conf"

    def run(
        self, host: Host | int, argv: list[str], extra_env: dict[str, str] | None = None, **kwargs
    ) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, argv), env=self.env(host, extra_env), **kwargs)

    def popen(
        self, host: Host | int, argv: list[str], extra_env: dict[str, str] | None = None, **kwargs
    ) -> subprocess.Popen:
        return subprocess.Popen(self.command(host, argv), env=self.env(host, extra_env), **kwargs)

    def host(self, which: Host | int) -> Host:
        return which if isinstance(which, Host) else self.hosts[which]

    # -- the Spark cluster on the hosts -----------------------------------------------------
    @property
    def master_url(self) -> str:
        return f"spark://{self.hosts[0].address}:{MASTER_PORT}"

    @property
    def web_url(self) -> str:
        return f"http://{self.hosts[0].address}:{MASTER_UI_PORT}"

    @property
    def workers(self) -> list[Host]:
        return self.hosts[1:]

    def alive_workers(self) -> int:
        """ALIVE workers as the master sees them, asked from host 0."""
        code = (
            f"import json,urllib.request; s=json.load(urllib.request.urlopen('{self.web_url}/json/',timeout=3));"
            f"print(sum(w['state']=='ALIVE' for w in s['workers']))"
        )
        out = self.run(0, [sys.executable, "-c", code], capture_output=True, text=True)
        return int(out.stdout.strip() or 0) if out.returncode == 0 else 0

    def reachable(self, source: Host | int, address: str, port: int, timeout_s: float = 2.0) -> bool:
        """Can a process on `source` open a TCP connection to address:port?"""
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.host(source).netns,
                "timeout",
                str(timeout_s),
                "bash",
                "-c",
                f"exec 3<>/dev/tcp/{address}/{port}",
            ],
            capture_output=True,
        )
        return out.returncode == 0

    def listeners(self, host: Host | int) -> list[tuple[str, int, str]]:
        """(address, port, process name) of every TCP listener in the host's namespace."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.host(host).netns, "ss", "-ltnpH"], capture_output=True, text=True
        )
        found = []
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) < 4:
                continue
            address, _, port = parts[3].rpartition(":")
            process = parts[5].split('"')[1] if len(parts) > 5 and '"' in parts[5] else "?"
            found.append((address.strip("[]"), int(port), process))
        return found

    def pids(self, host: Host | int) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.host(host).netns], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def kill_host(self, host: Host | int) -> int:
        """Lose a whole host: SIGKILL every process in its namespace (worker, executors, ranks)."""
        killed = 0
        for _ in range(5):  # children forked while we kill
            pids = self.pids(host)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        return killed

    def save(self) -> None:
        Path(self.workdir, STATE_FILE).write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(workdir: str | Path) -> EmulatedHosts:
        raw = json.loads(Path(workdir, STATE_FILE).read_text())
        raw["hosts"] = [Host(**h) for h in raw["hosts"]]
        return EmulatedHosts(**raw)

    def stop(self) -> None:
        """Kill every process on every host, then delete the namespaces (and with them the links)."""
        for host in self.hosts:
            self.kill_host(host)
        for netns in [h.netns for h in self.hosts] + [self.switch]:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        Path(self.workdir, STATE_FILE).unlink(missing_ok=True)


def create_hosts(
    workdir: str | Path, count: int, shared: str | Path, keep: list[str] | None = None
) -> EmulatedHosts:
    """`count` hosts on one bridge; `keep`: paths every host sees as they are (the image)."""
    workdir, shared = Path(workdir).resolve(), Path(shared).resolve()
    if (workdir / STATE_FILE).exists():  # a previous run that was not stopped
        EmulatedHosts.load(workdir).stop()
    workdir.mkdir(parents=True, exist_ok=True)
    shared.mkdir(parents=True, exist_ok=True)
    tag = secrets.token_hex(3)
    hosts = [
        Host(i, f"smd-{tag}-h{i}", f"{SUBNET}.{i + 1}", f"{ALT_SUBNET}.{i + 1}", str(workdir / f"host{i}"))
        for i in range(count)
    ]
    cluster = EmulatedHosts(
        str(workdir), str(shared), hosts, f"smd-{tag}-sw", [str(Path(p).resolve()) for p in keep or []]
    )
    cluster.save()  # before anything exists: a failure half-way is still cleaned by stop()
    try:
        _ip("netns", "add", cluster.switch)
        _ip("-n", cluster.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", cluster.switch, "link", "set", "br0", "up")
        for host in hosts:
            shutil.rmtree(host.root, ignore_errors=True)  # a fresh disk for a fresh host
            Path(host.tmp).mkdir(parents=True)
            os.chmod(host.tmp, 0o1777)
            _ip("netns", "add", host.netns)
            _ip("-n", host.netns, "link", "set", "lo", "up")
            for nic, address in (("eth0", host.address), ("eth1", host.alt_address)):
                port = f"h{host.index}{nic}"
                _ip(
                    "link",
                    "add",
                    "name",
                    nic,
                    "netns",
                    host.netns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    port,
                    "netns",
                    cluster.switch,
                )
                _ip("-n", cluster.switch, "link", "set", port, "master", "br0")
                _ip("-n", cluster.switch, "link", "set", port, "up")
                _ip("-n", host.netns, "addr", "add", f"{address}/24", "dev", nic)
                _ip("-n", host.netns, "link", "set", nic, "up")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_spark(cluster: EmulatedHosts, cores: int = 1, memory: str = "4g", timeout_s: float = 90) -> None:
    """A standalone master on host 0 and a worker on every other host, each bound to its address,
    with Spark's authentication and RPC encryption on (a fresh secret per start)."""
    write_auth_conf(cluster.spark_conf_dir.parent)
    daemon = str(Path(pyspark.__file__).parent / "sbin" / "spark-daemon.sh")
    master = cluster.hosts[0]
    _checked(
        cluster.run(
            master,
            [
                daemon,
                "start",
                "org.apache.spark.deploy.master.Master",
                "1",
                "--host",
                master.address,
                "--port",
                str(MASTER_PORT),
                "--webui-port",
                str(MASTER_UI_PORT),
            ],
            capture_output=True,
            text=True,
        )
    )
    for host in cluster.workers:
        start_worker(cluster, host, cores, memory)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cluster.alive_workers() == len(cluster.workers):
            return
        time.sleep(1)
    raise RuntimeError(
        f"emulated cluster: {cluster.alive_workers()}/{len(cluster.workers)} workers ALIVE after "
        f"{timeout_s}s; logs under {cluster.workdir}/host*/tmp/spark-logs"
    )


def start_worker(cluster: EmulatedHosts, host: Host | int, cores: int = 1, memory: str = "4g") -> None:
    daemon = str(Path(pyspark.__file__).parent / "sbin" / "spark-daemon.sh")
    host = cluster.host(host)
    _checked(
        cluster.run(
            host,
            [
                daemon,
                "start",
                "org.apache.spark.deploy.worker.Worker",
                "1",
                "--host",
                host.address,
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--webui-port",
                "8081",
                cluster.master_url,
            ],
            capture_output=True,
            text=True,
        )
    )


def _ip(*args: str) -> None:
    _checked(subprocess.run(["ip", *args], capture_output=True, text=True))


def _checked(done: subprocess.CompletedProcess) -> None:
    if done.returncode != 0:
        cmd = " ".join(shlex.quote(str(a)) for a in done.args[:12])
        raise RuntimeError(
            f"`{cmd}` failed ({done.returncode}): {(done.stderr or done.stdout or '').strip()}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["start", "stop", "exec", "kill", "status"])
    parser.add_argument("host", nargs="?", type=int, help="host index (exec, kill)")
    parser.add_argument("--dir", default="/tmp/sparkml_dist-hosts")
    parser.add_argument("--workers", type=int, default=2, help="worker hosts (host 0 runs the master)")
    parser.add_argument(
        "--shared", default="/tmp/sparkml_dist-shared", help="the directory every host mounts"
    )
    parser.add_argument(
        "--keep",
        action="append",
        default=[],
        help="more paths every host sees as they are (the Python environment, this project "
        "and the cwd always are)",
    )
    parser.add_argument("--memory", default="4g", help="memory per worker (conf/spark/cluster.conf asks 4g)")
    argv = sys.argv[1:] if argv is None else argv
    command = argv[argv.index("--") + 1 :] if "--" in argv else []  # exec: everything after --
    args = parser.parse_intermixed_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.action == "start":
        # the image every host has: the Python environment, this package's project and the cwd
        project = str(Path(__file__).resolve().parents[2])
        keep = [sys.prefix, project, os.getcwd(), *args.keep]
        cluster = create_hosts(args.dir, args.workers + 1, args.shared, keep)
        try:
            start_spark(cluster, memory=args.memory)
        except BaseException:
            cluster.stop()
            raise
        for h in cluster.hosts:
            print(
                f"host {h.index}: {h.address} (also {h.alt_address}), namespace {h.netns}, private /tmp {h.tmp}"
            )
        print(
            f"master {cluster.master_url} (UI {cluster.web_url}) on host 0, {len(cluster.workers)} workers ALIVE; "
            f"shared {cluster.shared}"
        )
        return 0
    if not Path(args.dir, STATE_FILE).exists():
        print(f"no emulated hosts recorded under {args.dir}")
        return 0 if args.action == "stop" else 1
    cluster = EmulatedHosts.load(args.dir)
    if args.action == "stop":
        cluster.stop()
        print(f"stopped every process on {len(cluster.hosts)} hosts and deleted their namespaces")
    elif args.action == "kill":
        print(f"host {args.host}: killed {cluster.kill_host(args.host)} processes")
    elif args.action == "exec":
        return cluster.run(args.host, command).returncode
    else:
        print(
            json.dumps(
                {
                    "master": cluster.master_url,
                    "alive_workers": cluster.alive_workers(),
                    "hosts": [asdict(h) for h in cluster.hosts],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
