"""Secure aggregation: pairwise masking (Bonawitz et al. 2017) in a finite ring, without dropout
recovery (a late client still sends its masks, with a zero update; a client that sends nothing
after the key exchange fails the round, see `server.run_round`).

- Keys: every round, each sampled client draws a fresh X25519 key pair from the OS CSPRNG. Its two
  Spark tasks (key exchange, then update) may run on different executors, so the private key
  travels between them through the driver sealed with AES-GCM under a key derived (HKDF) from a
  digest of the client's own rows and a fresh random salt for the round. The driver holds only
  ciphertext; whoever knows all of a client's rows could unseal it, but could also recompute that
  client's update outright, which is all the masks hide.
- Ring: an update is quantised to fixed point (FRACTION_BITS fractional bits, int64) and masked
  in Z_2^64 with uniform 64-bit words from ChaCha20 keyed by the pair's shared secret. Client i
  adds the pair mask for each j > i and subtracts it for j < i, so the masks cancel exactly and
  the driver's integer sum equals the plain fixed-point sum; one masked update alone is uniformly
  distributed (perfect hiding). Dequantised, each client's rounding error is at most 2^-(F+1)
  per entry.
- Public keys pass through the driver unauthenticated: the driver is trusted to relay them
  (honest-but-curious aggregator); docs/security.md says what that leaves open.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

FRACTION_BITS = 24
SUM_LIMIT = 2.0 ** (63 - FRACTION_BITS)  # the sum of the round's updates must stay inside int64


class QuantisationOverflow(ValueError):
    """An update entry too large for the fixed-point ring (clip the updates: federated.clip_norm)."""


def new_key() -> X25519PrivateKey:
    return X25519PrivateKey.generate()  # the OS CSPRNG


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def rows_digest(*arrays: np.ndarray) -> bytes:
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).digest()


def seal(key: X25519PrivateKey, digest: bytes, salt: bytes) -> bytes:
    raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    nonce = os.urandom(12)
    return nonce + AESGCM(_derive(digest, salt, b"sparkml_dist secagg seal")).encrypt(nonce, raw, salt)


def unseal(sealed: bytes, digest: bytes, salt: bytes) -> X25519PrivateKey:
    raw = AESGCM(_derive(digest, salt, b"sparkml_dist secagg seal")).decrypt(sealed[:12], sealed[12:], salt)
    return X25519PrivateKey.from_private_bytes(raw)


def quantise(flat: np.ndarray, parties: int) -> np.ndarray:
    """float64 -> fixed point in Z_2^64 (uint64 words, two's complement); `parties` updates are summed."""
    largest = float(np.abs(flat).max()) if flat.size else 0.0
    limit = SUM_LIMIT / max(parties, 1)
    if not np.isfinite(largest) or largest >= limit:
        raise QuantisationOverflow(
            f"an update entry of {largest:.3g} does not fit the secure-aggregation ring "
            f"(|entry| < {limit:.3g} for {parties} clients): bound the updates with "
            f"federated.clip_norm"
        )
    return np.round(flat * 2.0**FRACTION_BITS).astype(np.int64).view(np.uint64)


def dequantise(words: np.ndarray) -> np.ndarray:
    return words.view(np.int64).astype(np.float64) / 2.0**FRACTION_BITS


def masked(
    me: int, key: X25519PrivateKey, publics: dict[int, bytes], salt: bytes, words: np.ndarray
) -> np.ndarray:
    """`words` plus this client's signed pairwise masks, in Z_2^64 (uint64 arithmetic wraps)."""
    out = words.copy()
    for peer, public in sorted(publics.items()):
        if peer == me:
            continue
        mask = pair_mask(key, public, salt, out.size)
        out = out + mask if peer > me else out - mask
    return out


def pair_mask(key: X25519PrivateKey, peer_public: bytes, salt: bytes, size: int) -> np.ndarray:
    shared = key.exchange(X25519PublicKey.from_public_bytes(peer_public))
    stream = Cipher(
        algorithms.ChaCha20(_derive(shared, salt, b"sparkml_dist secagg mask"), b"\0" * 16), mode=None
    ).encryptor()
    return np.frombuffer(stream.update(b"\0" * (8 * size)), dtype=np.uint64)


def _derive(secret: bytes, salt: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(secret)
