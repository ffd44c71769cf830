"""Sharded checkpoints are signed, because reading one unpickles: `dcp.load` reads the
checkpoint's `.metadata` (and any non-tensor items) with pickle, which runs code. Rank 0 signs a
finished checkpoint with an HMAC-SHA256 over every file in it; every rank verifies that before
`dcp.load` touches a byte, so a checkpoint this job did not write is refused, not loaded.

The key is derived per checkpoint directory from 32 random bytes kept on the driver in the
user's own configuration directory (mode 0600), so that a re-run of the job (a new driver)
still verifies what an earlier run wrote; it travels to the ranks inside the job.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from sparkml_dist.errors import SparkMLDistError
from sparkml_dist.storage import has_scheme

SIGNATURE = "SIGNATURE"


class UntrustedCheckpoint(SparkMLDistError, RuntimeError):
    """A sharded checkpoint without this job's signature: refused (a relaunch would meet it again)."""

    retryable = False


def checkpoint_key(checkpoint_dir: str) -> bytes:
    """This checkpoint directory's signing key (driver side): an HMAC of the directory's path under
    the user's own secret, 32 random bytes created on first use in a mode-0600 file."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "sparkml_dist"
    base.mkdir(parents=True, exist_ok=True)
    path = base / "checkpoint.key"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(32))
    secret = path.read_bytes()
    location = checkpoint_dir if has_scheme(checkpoint_dir) else os.path.abspath(checkpoint_dir)
    return hmac.new(secret, location.encode(), hashlib.sha256).digest()


def sign(directory: Path, key: bytes) -> None:
    _require(key)
    (directory / SIGNATURE).write_text(_digest(directory, key))


def verify(directory: Path, key: bytes) -> None:
    _require(key)
    signature = directory / SIGNATURE
    found = signature.read_text().strip() if signature.is_file() else ""
    if not hmac.compare_digest(found, _digest(directory, key)):
        raise UntrustedCheckpoint(
            f"{directory}: not signed by this job's checkpoint key ({'a wrong signature' if found else 'no signature'}); "
            f"it was not written by this job, or was changed since. It is not loaded, since reading a sharded "
            f"checkpoint unpickles its metadata. Move it out of train.checkpoint_dir (or point the job at a fresh "
            f"one) and re-run"
        )


def _digest(directory: Path, key: bytes) -> str:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != SIGNATURE):
        name = path.relative_to(directory).as_posix().encode()
        mac.update(len(name).to_bytes(4, "big") + name + path.stat().st_size.to_bytes(8, "big"))
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                mac.update(block)
    return mac.hexdigest()


def _require(key: bytes) -> None:
    if len(key) < 16:
        raise ValueError(
            "sharded checkpoints need the job's checkpoint key (TrainJob.checkpoint_key, set by "
            "methods.loop.make_job)"
        )
