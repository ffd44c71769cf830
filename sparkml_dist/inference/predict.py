"""Pure prediction: numpy features in, probabilities out. No Spark here."""

from __future__ import annotations

import threading
import warnings
from typing import Callable

import numpy as np
import torch
from torch import nn

from sparkml_dist.models.factory import build_model
from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.models.weights import state_dict_from_bytes


class ModelCache:
    """One model per key per Python worker process (as pyspark's predict_batch_udf does):
    Spark reuses Python workers across tasks, so the load happens once, not per batch/task."""

    def __init__(self) -> None:
        self._models: dict[str, nn.Module] = {}
        self._lock = threading.Lock()

    def get(self, key: str, spec: ModelSpec, weights: Callable[[], bytes]) -> nn.Module:
        with self._lock:
            if key not in self._models:
                model = build_model(spec)
                model.load_state_dict(state_dict_from_bytes(weights()))
                model.eval()
                self._models[key] = model
            return self._models[key]

    def __len__(self) -> int:
        return len(self._models)


# The process-wide cache executors share; the only module-level state, and only a cache.
MODEL_CACHE = ModelCache()


@torch.inference_mode()
def predict_proba(model: nn.Module, x: np.ndarray, batch_rows: int = 65536) -> np.ndarray:
    if len(x) == 0:
        return np.empty(0, np.float64)
    out = np.empty(len(x), np.float64)
    for start in range(0, len(x), batch_rows):
        xb = _as_tensor(x[start:start + batch_rows])
        out[start:start + len(xb)] = torch.sigmoid(model(xb)).double().numpy()
    return out


def _as_tensor(x: np.ndarray) -> torch.Tensor:
    """Zero-copy view of (possibly read-only, Arrow-backed) features; inference never writes to it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
