"""MLflow tracking stores for in-process tests: each test (or module) gets a sqlite store of its
own, as a copy of one empty store that MLflow itself made once per session. MLflow's schema
migrations take seconds for every new store (several seconds here, more when the cores are
busy); a copy takes milliseconds."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path


@functools.cache
def _empty_store() -> Path:
    from mlflow.tracking import MlflowClient

    store = Path(tempfile.mkdtemp(prefix="mlflow-empty-")) / "mlflow.db"
    MlflowClient(f"sqlite:///{store}").search_experiments()
    return store


def fresh_store(folder: Path, name: str = "mlflow.db") -> str:
    """The tracking URI of `<folder>/<name>`: an empty store, unless one is there already."""
    store = Path(folder) / name
    if not store.exists():
        store.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_empty_store(), store)
    return f"sqlite:///{store}"
