"""Run a rank in a forked child of the Spark Python worker.

Spark reuses Python workers across tasks, and Horovod segfaults in `hvd.init()` when a reused
worker initialises it a second time (measured with pyspark 4.3 + Horovod 0.28.1; the same
init/shutdown/init sequence works in a plain process). A fork per rank gives Horovod a fresh
process at the cost of a few milliseconds, with every module the worker already imported.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import tempfile
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from sparkml_dist.errors import is_retryable


class ChildRankError(RuntimeError):
    """The forked rank raised: carries the child's exception type, message and traceback."""

    def __init__(self, exc_type: str, message: str, child_traceback: str, retryable: bool = True):
        self.exc_type = exc_type
        self.child_message = message
        self.child_traceback = child_traceback
        self.retryable = retryable  # the child's exception's own verdict (errors.is_retryable)
        super().__init__(f"{exc_type}: {message}")

    def __reduce__(self):
        return (ChildRankError, (self.exc_type, self.child_message, self.child_traceback, self.retryable))


def run_forked(fn: Callable[[], Any], tail: deque | None = None) -> Any:
    """Call `fn()` in a forked child process and return its (picklable) result or raise its error.
    The child's captured output lines (its copy of `tail`) are appended to the parent's `tail`."""
    ctx = mp.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    native_stderr = tempfile.TemporaryFile()  # noqa: SIM115 -- shared with the forked child, closed below

    def child() -> None:
        reader.close()
        # C++ code (gloo, NCCL) that aborts writes its reason to fd 2, past Python's capture
        os.dup2(native_stderr.fileno(), 2)
        lines = lambda: list(tail) if tail is not None else []  # noqa: E731
        try:
            result = fn()
            writer.send(("ok", result, lines()))
        except BaseException as exc:
            writer.send(
                ("error", (type(exc).__name__, str(exc), traceback.format_exc(), is_retryable(exc)), lines())
            )
        finally:
            writer.close()

    process = ctx.Process(target=child, name="sparkml_dist-rank", daemon=False)
    process.start()
    writer.close()
    try:
        status, payload, child_lines = reader.recv()
    except EOFError:
        process.join()
        last = _tail_of(native_stderr)
        raise RuntimeError(
            f"the rank's child process died without a result ({_exit_description(process.exitcode)})"
            + (f"; its last native error output:\n{last}" if last else "")
        ) from None
    finally:
        reader.close()
        _replay(native_stderr)
    process.join()
    if tail is not None:
        tail.clear()
        tail.extend(child_lines)
    if status == "error":
        raise ChildRankError(*payload)
    return payload


def _exit_description(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _tail_of(stream, limit: int = 2000) -> str:
    stream.seek(0)
    return stream.read().decode(errors="replace")[-limit:].strip()


def _replay(stream) -> None:
    """What the child wrote to fd 2 goes on to the worker's own stderr (the executor log)."""
    stream.seek(0)
    data = stream.read()
    stream.close()
    if data:
        sys.stderr.write(data.decode(errors="replace"))
        sys.stderr.flush()
