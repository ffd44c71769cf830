"""Federated rounds survive a driver that dies: after each round the driver writes the global
model, the rounds' records, the client sampler's state and the received-payload tallies under
`<output.root>/federated/rounds/`. A later run of the same job (same config fingerprint) resumes
at the next round; a different config starts afresh and says why. Written atomically and loaded
with `weights_only=True` (tensors and a JSON string only), like the training checkpoints."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
from dataclasses import dataclass

import torch

from sparkml_dist import storage
from sparkml_dist.config.schema import JobConfig
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.train.records import EpochRecord

log = logging.getLogger(__name__)
_NAME = re.compile(r"^round-(\d+)\.pt$")
KEEP = 2


@dataclass(frozen=True)
class RoundsDone:
    """Everything the rounds after `next_round` depend on."""

    next_round: int
    state: dict[str, torch.Tensor]
    records: tuple[EpochRecord, ...]
    sampler_state: dict
    payloads: int
    largest_value: float


def rounds_dir(cfg: JobConfig) -> str:
    return OutputPaths.of(cfg).under("federated", "rounds")


def fingerprint(cfg: JobConfig) -> str:
    """What makes two runs the same rounds: data, features, model, the federated settings, the seed."""
    parts = [
        cfg.data.model_dump_json(),
        cfg.features.model_dump_json(),
        cfg.model.model_dump_json(),
        cfg.federated.model_dump_json(),
        str(cfg.train.seed),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def save_round(directory: str, done: RoundsDone, config_fingerprint: str) -> str:
    meta = {
        "fingerprint": config_fingerprint,
        "next_round": done.next_round,
        "records": [r.to_json() for r in done.records],
        "sampler_state": done.sampler_state,
        "payloads": done.payloads,
        "largest_value": done.largest_value,
    }
    final = storage.join(directory, f"round-{done.next_round:05d}.pt")
    with storage.atomic_writer(final) as fh:
        torch.save({"state": done.state, "meta": json.dumps(meta)}, fh)
    for old in _rounds(directory)[:-KEEP]:
        storage.delete(old)
    return final


def load_rounds(directory: str, config_fingerprint: str) -> RoundsDone | None:
    """The newest saved round of this config, or None (nothing saved, or saved by another config)."""
    saved = _rounds(directory)
    if not saved:
        return None
    raw = torch.load(io.BytesIO(storage.read_bytes(saved[-1])), map_location="cpu", weights_only=True)
    meta = json.loads(raw["meta"])
    if meta["fingerprint"] != config_fingerprint:
        log.warning(
            "federated: %s was written by a run with another configuration; starting from round 1", saved[-1]
        )
        return None
    return RoundsDone(
        int(meta["next_round"]),
        raw["state"],
        tuple(EpochRecord.from_json(r) for r in meta["records"]),
        meta["sampler_state"],
        int(meta["payloads"]),
        float(meta["largest_value"]),
    )


def clear_rounds(directory: str) -> None:
    for path in _rounds(directory):
        storage.delete(path)


def _rounds(directory: str) -> list[str]:
    if not storage.exists(directory):
        return []
    found = [(int(m[1]), e.uri) for e in storage.list_dir(directory) if (m := _NAME.match(e.name))]
    return [uri for _, uri in sorted(found)]
