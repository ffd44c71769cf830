"""What a user asks the distributor to run: a function with its arguments, or a script with its
command-line arguments. Both are checked on the driver, before any rank starts."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkml_dist.errors import UserCodeError


class ScriptFailed(RuntimeError):
    """The rank's script exited with a non-zero code (its traceback is in the output tail)."""

    def __init__(self, script: str, code: int):
        self.script = script
        self.code = code
        super().__init__(f"{script} exited with code {code}; its last output lines say why")

    def __reduce__(self):
        return (ScriptFailed, (self.script, self.code))


@dataclass(frozen=True)
class FunctionCall:
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))

    def call(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


@dataclass(frozen=True)
class ScriptCall:
    """A Python script and its arguments. The script's text travels with the job, so executors
    that do not have the file (another host) run the driver's copy."""

    path: str
    source: bytes
    args: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.path

    def command(self, script_path: str) -> list[str]:
        return [sys.executable, "-u", script_path, *self.args]

    def call(self) -> None:
        """Run the script in a child process with this process's environment (the torchrun
        variables included); its lines are printed here as they come, so the rank's output
        capture and the driver relay see them."""
        with tempfile.TemporaryDirectory(prefix="sparkml-dist-script-") as scratch:
            path = self.path
            if not os.path.isfile(path):
                path = os.path.join(scratch, os.path.basename(self.path))
                Path(path).write_bytes(self.source)
            proc = subprocess.Popen(
                self.command(path),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                print(line.rstrip("\n"), flush=True)
            if proc.wait() != 0:
                raise ScriptFailed(self.path, proc.returncode)


TrainCall = FunctionCall | ScriptCall


def train_call(train_object: Any, args: tuple, kwargs: dict) -> TrainCall:
    """The checked call for `TorchDistributor.run(train_object, *args, **kwargs)`."""
    if isinstance(train_object, (str, os.PathLike)):
        return _script_call(os.fspath(train_object), args, kwargs)
    if not callable(train_object):
        raise UserCodeError(
            f"train_object must be a function or the path of a Python script, got "
            f"{type(train_object).__name__}"
        )
    call = FunctionCall(train_object, tuple(args), dict(kwargs))
    check_picklable(call, what=f"training function {call.name}")
    return call


def check_picklable(value: Any, what: str) -> None:
    """Spark ships it to the ranks with cloudpickle: fail here, naming it, rather than in a task."""
    from pyspark import cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception as exc:
        raise UserCodeError(
            f"the {what} cannot be sent to the ranks: {type(exc).__name__}: {str(exc)[:300]}. It, its arguments "
            f"and what it refers to must be picklable: pass a SparkSession, SparkContext, lock, open file or "
            f"socket by name or path instead, or create it inside the function"
        ) from None


def _script_call(path: str, args: tuple, kwargs: dict) -> ScriptCall:
    if kwargs:
        raise UserCodeError(
            f"a script takes command-line arguments only; pass {sorted(kwargs)} as strings, "
            f"e.g. run({path!r}, '--{next(iter(kwargs))}=...')"
        )
    script = Path(path)
    if not script.is_file():
        raise UserCodeError(
            f"training script {path} does not exist (working directory {os.getcwd()}); "
            f"pass an existing .py file or a function"
        )
    bad = [a for a in args if not isinstance(a, (str, int, float))]
    if bad:
        raise UserCodeError(f"script arguments must be strings (command-line arguments), got {bad[0]!r}")
    return ScriptCall(str(script.resolve()), script.read_bytes(), tuple(str(a) for a in args))
