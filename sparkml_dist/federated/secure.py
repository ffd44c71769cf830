"""Pairwise masking for secure aggregation (Bonawitz et al. 2017, without dropout recovery:
a late client still sends its masks, with a zero update).

Each sampled client derives an X25519 key pair from a secret only it holds (a hash of its own
rows and the round), publishes the public key through the driver, and agrees a seed with every
other sampled client. Client i adds +PRG(seed_ij) for j > i and -PRG(seed_ij) for j < i, so the
masks cancel in the sum and the driver learns only the sum of the updates.
"""

from __future__ import annotations

import hashlib

import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


def private_key(client_secret: bytes, round_index: int) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(hashlib.sha256(client_secret + b"|secagg|%d" % round_index).digest())


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def pair_seed(mine: X25519PrivateKey, peer_public: bytes, round_index: int) -> int:
    shared = mine.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return int.from_bytes(hashlib.sha256(shared + b"|mask|%d" % round_index).digest()[:8], "little")


def masks(me: int, key: X25519PrivateKey, publics: dict[int, bytes], round_index: int,
          shapes: dict[str, tuple[int, ...]], scale: float) -> dict[str, torch.Tensor]:
    """The sum of this client's signed pairwise masks, per parameter."""
    total = {name: torch.zeros(shape, dtype=torch.float64) for name, shape in shapes.items()}
    for peer, public in publics.items():
        if peer == me:
            continue
        generator = torch.Generator().manual_seed(pair_seed(key, public, round_index))
        sign = 1.0 if peer > me else -1.0
        for name, shape in shapes.items():
            total[name] += sign * scale * torch.randn(shape, generator=generator, dtype=torch.float64)
    return total
