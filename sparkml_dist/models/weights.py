"""The weights codec: a state_dict as bytes and back. Loading uses torch.load(weights_only=True),
so weights from a registry, a checkpoint or a contributor can never run code."""

from __future__ import annotations

import io
from typing import Any

import torch


def state_dict_to_bytes(state: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def state_dict_from_bytes(blob: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
