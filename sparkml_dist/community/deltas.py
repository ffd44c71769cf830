"""Parameter deltas: what a community contributor submits (tuned weights minus the base's),
and the checks a delta must pass before it may touch a model. Pure functions over state_dicts;
deltas load with weights_only=True, so a submitted file cannot run code."""

from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path

import torch

StateDict = dict[str, torch.Tensor]


class DeltaRejected(ValueError):
    """A contribution failed a check; the message says which and why."""


def make_delta(base: StateDict, tuned: StateDict) -> StateDict:
    return {k: (tuned[k].float() - base[k].float()) for k in base}


def save_delta(delta: StateDict, path: str | Path) -> Path:
    path = Path(path)
    torch.save(delta, path)
    return path


def load_delta(blob: bytes) -> StateDict:
    try:
        delta = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise DeltaRejected(f"unreadable delta: {type(exc).__name__}: {exc}") from None
    if not isinstance(delta, dict) or not all(isinstance(v, torch.Tensor) for v in delta.values()):
        raise DeltaRejected("a delta must be a dict of parameter name -> tensor (torch.save of a state_dict)")
    return delta


def check_shapes(base: StateDict, delta: StateDict) -> None:
    missing = sorted(set(base) - set(delta))
    extra = sorted(set(delta) - set(base))
    if missing or extra:
        raise DeltaRejected(f"parameters differ from the base model: missing {missing}, unexpected {extra}")
    for name, value in delta.items():
        if tuple(value.shape) != tuple(base[name].shape):
            raise DeltaRejected(
                f"{name}: shape {tuple(value.shape)} but the base model's is {tuple(base[name].shape)}"
            )
        if not value.is_floating_point():
            raise DeltaRejected(f"{name}: dtype {value.dtype}; deltas are floating point")
        if not bool(torch.isfinite(value).all()):
            raise DeltaRejected(f"{name}: contains NaN or infinite values")


def delta_norm(delta: StateDict) -> float:
    return math.sqrt(sum(float(v.double().pow(2).sum()) for v in delta.values()))


def check_norm(delta: StateDict, bound: float) -> float:
    norm = delta_norm(delta)
    if norm > bound:
        raise DeltaRejected(f"update norm {norm:.4g} exceeds community.max_delta_norm {bound:g}")
    return norm


def apply_delta(base: StateDict, delta: StateDict) -> StateDict:
    return {k: (v + delta[k].to(v.dtype)) if v.is_floating_point() else v for k, v in base.items()}


def fingerprint(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()
