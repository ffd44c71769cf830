"""The wheel installs into a runtime that already has its own Spark client and torch (a Databricks
LTS cluster runs pyspark 3.5 and its own CUDA torch): pip keeps them, and the lifecycle runs on
them. A fresh virtualenv gets requirements/oldest-supported.txt first (pyspark 3.5.9, torch), then
the wheel built from this checkout by pip's normal resolution; the other dependencies are held to
the development constraints so the run is repeatable (docs/deployment.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
OLDEST = ROOT / "requirements" / "oldest-supported.txt"
WHEEL_CACHE = Path(os.environ.get("SPARKML_DIST_CACHE", Path.home() / ".cache" / "sparkml_dist")) / "wheels"
KEPT = ("pyspark", "torch")  # what the runtime brought and pip must not touch

TORCH_DISTRIBUTOR_SMOKE = """
import json

import numpy as np
import pyspark
import torch
from pyspark.ml.torch.distributor import TorchDistributor
from pyspark.sql import SparkSession

import sparkml_dist as sd
from user_code.breast_cancer import train

spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
ours = sd.TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, 0.05, epochs=3)
theirs = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, 0.05, epochs=3)
difference = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(ours["params"], theirs["params"]))
print(json.dumps({"pyspark": pyspark.__version__, "torch": torch.__version__, "world": ours["world"],
                  "accuracy": ours["accuracy"], "difference": difference}))
spark.stop()
"""


@dataclass(frozen=True)
class Runtime:
    root: Path
    python: Path
    before: dict[str, tuple[str, int]]  # package -> (version, its dist-info's inode) before the wheel
    install_log: str
    pip_check: (
        subprocess.CompletedProcess
    )  # before the dataset packages, which are installed without their deps

    def dist_infos(self) -> dict[str, tuple[str, int]]:
        return _dist_infos(self.python)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        env.update(
            PYSPARK_PYTHON=str(self.python),
            PYSPARK_DRIVER_PYTHON=str(self.python),
            PYTHONPATH=str(ROOT / "tests"),
        )  # tests/user_code, for the distributor's smoke run
        return env


def _run(*args, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kwargs)
    assert out.returncode == 0, (
        f"{' '.join(map(str, args))} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out


def _pip(python: Path, *args) -> subprocess.CompletedProcess:
    return _run(python, "-m", "pip", "--disable-pip-version-check", *args)


def _dist_infos(python: Path) -> dict[str, tuple[str, int]]:
    probe = (
        "import json, importlib.metadata as m, os\n"
        f"print(json.dumps({{n: (m.version(n), os.stat(m.distribution(n)._path).st_ino) for n in {KEPT!r}}}))"
    )
    return {name: tuple(v) for name, v in json.loads(_run(python, "-c", probe).stdout).items()}


def _build_wheel(out: Path) -> Path:
    """From a copy of the sources, so the build leaves the checkout's editable metadata alone."""
    source = out / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "sparkml_dist", source / "sparkml_dist", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    _pip(Path(sys.executable), "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out / "dist", source)
    return next((out / "dist").glob("sparkml_dist-*.whl"))


def _constraints_but_the_runtimes(out: Path) -> Path:
    """The development pins for everything except what the runtime brought (and py4j, which its
    pyspark pins)."""
    held = [
        line
        for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines()
        if line.split("==")[0].strip().lower() not in {*KEPT, "py4j"}
    ]
    path = out / "constraints.txt"
    path.write_text("\n".join(held) + "\n")
    return path


@pytest.fixture(scope="module")
def runtime(tmp_path_factory) -> Runtime:
    root = tmp_path_factory.mktemp("install")
    wheel = _build_wheel(root)
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    _pip(python, "install", "-q", "--find-links", WHEEL_CACHE, "-r", OLDEST)  # the runtime's own
    before = _dist_infos(python)
    log = _pip(python, "install", "-c", _constraints_but_the_runtimes(root), wheel).stdout
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    _pip(python, "install", "-q", "--no-deps", "-r", ROOT / "requirements" / "datasets.txt")
    return Runtime(root, python, before, log, check)


def test_pip_keeps_the_runtimes_own_pyspark_and_torch(runtime):
    wanted = dict(
        line.split("==")
        for line in OLDEST.read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert {name: version.split("+")[0] for name, (version, _) in runtime.before.items()} == wanted
    # the same versions, and the very same installed files: not uninstalled and reinstalled
    assert runtime.dist_infos() == runtime.before
    for name in KEPT:
        assert f"Requirement already satisfied: {name}" in runtime.install_log
    assert runtime.pip_check.returncode == 0, runtime.pip_check.stdout  # every package's requirements are met


def test_the_adult_pipeline_runs_on_the_oldest_supported_pyspark(runtime):
    out = runtime.root / "adult"
    result = _run(
        runtime.python.parent / "sparkml-dist",
        "pipeline",
        "--config",
        ROOT / "conf" / "adult.yaml",
        "--set",
        "train.epochs=2",
        "--set",
        f"output.root={out}",
        "--set",
        f"tracking.tracking_uri=sqlite:///{runtime.root / 'mlflow.db'}",
        cwd=ROOT,
        env=runtime.env(),
    )
    assert "Spark 3.5.9" in result.stderr + result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_metrics"]["accuracy"] > 0.84  # Adult's gate (conf/adult.yaml): passed
    assert summary["alias"] == "champion"
    assert summary["rows"]["scored"] == 16281  # every accepted test row scored through the UDF


def test_torch_distributor_matches_pysparks_own_on_the_oldest_supported_pyspark(runtime):
    script = runtime.root / "torch_distributor_smoke.py"
    script.write_text(TORCH_DISTRIBUTOR_SMOKE)
    result = _run(runtime.python, script, cwd=runtime.root, env=runtime.env())
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["pyspark"] == "3.5.9" and report["world"] == 2
    assert report["difference"] <= 1e-6  # the same final weights as pyspark 3.5.9's own TorchDistributor
    assert report["accuracy"] > 0.85
