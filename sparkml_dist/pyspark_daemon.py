"""Spark's Python worker daemon, importing pyspark from its installed package rather than from
the zip Spark puts first on the workers' path, when both are the same pyspark.

Spark starts one daemon per executor and SparkContext (`python -m pyspark.daemon`), and it forks
a Python worker per task slot, each of which imports `pyspark.worker`. Their PYTHONPATH begins
with `$SPARK_HOME/python/lib/pyspark.zip`. A zip holds no compiled bytecode, so every daemon and
every worker compiled pyspark's sources again: 0.64 s to import `pyspark.daemon` and
`pyspark.worker` from the zip against 0.13 s from the installed package, whose bytecode pip
compiled at install time; a fresh session's first Python task started 0.8 s after its launch
(measured here, 2026-12-04; `docs/benchmarks.md`, run_start_vs_torch_distributor).

With `pip install pyspark` the zip lies inside the installed package (`<site>/pyspark/python/
lib/pyspark.zip`), so the two are the same release: then the zip's entry on the path is
replaced by the directory that holds the package. Anything else (a Spark distribution whose
`python/lib` is not inside an installed pyspark, a cluster's own layout) keeps Spark's path.
`spark/session.py` names this module as `spark.python.daemon.module`; nothing here imports
pyspark before the path is settled, and the daemon itself is pyspark's.

Before it serves, the daemon imports torch and the parts of torch.distributed that the ranks and
the scoring UDF import (`PRELOAD`), so each worker it forks starts with them instead of importing
them again: 2.8 s of CPU per worker to import the rank and UDF code, 0.6 s after such a fork. A
fresh `local[2]` session whose two workers import them used 11.3-12.3 CPU-s against 12.5-14.7
(measured here, 2026-12-07, alternated); its wall time did not change. Only modules that start no
thread of their own are preloaded (pyarrow starts jemalloc's, which a fork must not inherit), and
none of this package's own code.
"""

from __future__ import annotations

import importlib
import os
import sys

ZIP_NAME = "pyspark.zip"
PRELOAD = (
    "numpy",
    "torch",
    "torch.nn",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.distributed.tensor",
)


def installed_root(entry: str) -> str | None:
    """For a path entry that is the zip inside an installed pyspark package, the directory that
    holds that package; None for any other entry."""
    if os.path.basename(entry) != ZIP_NAME:
        return None
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(entry))))  # <site>/pyspark
    if os.path.basename(package) != "pyspark" or not os.path.isfile(os.path.join(package, "__init__.py")):
        return None
    return os.path.dirname(package)


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """`path` with each zip of an installed pyspark replaced by the directory holding it."""
    return [installed_root(entry) or entry for entry in path]


def main() -> None:
    sys.path[:] = prefer_installed_pyspark(sys.path)
    # the workers forked from here inherit sys.path, and the processes they start the variable
    if os.environ.get("PYTHONPATH"):
        os.environ["PYTHONPATH"] = os.pathsep.join(
            prefer_installed_pyspark(os.environ["PYTHONPATH"].split(os.pathsep))
        )
    preload()
    from pyspark.daemon import manager

    manager()


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import those of `modules` that are installed (a plain pyspark environment has no torch);
    the names imported."""
    imported = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        imported.append(name)
    return imported


if __name__ == "__main__":
    main()
