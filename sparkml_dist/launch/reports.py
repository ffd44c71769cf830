"""A failing rank's report travels to the driver inside the task's exception text (the only
channel Spark guarantees across cluster managers), base64-encoded JSON between markers."""

from __future__ import annotations

import base64
import json
import re
import traceback

from sparkml_dist.errors import RankReport, is_retryable
from sparkml_dist.launch.isolation import ChildRankError

_START, _END = "SPARKML_DIST_RANK_REPORT[", "]END_REPORT"
_PATTERN = re.compile(re.escape(_START) + r"([A-Za-z0-9+/=]+)" + re.escape(_END))


# Messages of collectives that failed because a peer rank went away (gloo, nccl, horovod).
_PEER_PATTERNS = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe|Timed out waiting|timed out|"
    r"Application timeout caused pair closure|"
    r"ProcessGroup.*(aborted|terminated)|HorovodInternalError|Horovod has been shut down|NCCL communicator was aborted",
    re.IGNORECASE,
)
_PEER_TYPES = frozenset({"DistBackendError", "HorovodInternalError", "PeerLost", "AllreducePeerLost"})


def is_peer_failure(exc: BaseException) -> bool:
    """True when the exception is a communication failure caused by another rank's death."""
    name = getattr(exc, "exc_type", type(exc).__name__)  # a forked rank's error carries the child's type
    return name in _PEER_TYPES or bool(_PEER_PATTERNS.search(str(exc)))


class RankReportError(RuntimeError):
    """Raised on a rank so that Spark fails the barrier stage and carries the report home."""


def encode_failure(rank: int, host: str, exc: BaseException, tail_lines) -> RankReportError:
    forked = exc if isinstance(exc, ChildRankError) else None  # a forked rank's: the child's type and text
    report = RankReport(
        rank=rank,
        host=host,
        exc_type=forked.exc_type if forked else type(exc).__name__,
        message=(forked.child_message if forked else str(exc))[:2000],
        traceback=(
            (forked.child_traceback if forked else None)
            or "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        )[-4000:],
        output_tail="\n".join(list(tail_lines)[-20:])[-4000:],
        retryable=is_retryable(exc),
    )
    blob = base64.b64encode(json.dumps(report.to_json()).encode()).decode()
    return RankReportError(f"rank {rank} failed: {type(exc).__name__}: {str(exc)[:300]} {_START}{blob}{_END}")


def decode_failures(text: str) -> list[RankReport]:
    """Every distinct rank report found in a Spark error text, by rank."""
    found: dict[int, RankReport] = {}
    for blob in _PATTERN.findall(text):
        try:
            report = RankReport.from_json(json.loads(base64.b64decode(blob)))
        except (ValueError, TypeError, KeyError):
            continue
        found.setdefault(report.rank, report)
    return [found[r] for r in sorted(found)]


_CRASHED = re.compile(r"Python worker exited unexpectedly \(crashed\)")
_FAILED_TASK = re.compile(r"barrier task \w*Task\(\d+, (\d+)\) finished unsuccessfully")
WORKER_CRASHED = (
    "its Spark Python worker died while running the rank, without a Python exception: it was killed by a "
    "signal (SIGKILL from a user, a resource manager or the kernel's OOM killer: see `dmesg` and the "
    "executor's log on its host) or crashed in native code (SIGSEGV/SIGABRT: set "
    "spark.python.worker.faulthandler.enabled=true for its stack). Spark does not pass on which signal; "
    "a rank run in its own child process (backend horovod) names it"
)


def crash_reports(text: str) -> list[RankReport]:
    """Reports for ranks whose Python worker process died (no report of their own could be sent):
    the barrier task Spark names is the rank (a barrier stage's partition is its rank)."""
    if not _CRASHED.search(text):
        return []
    ranks = sorted({int(p) for p in _FAILED_TASK.findall(text)})
    return [RankReport(rank=r, host="", exc_type="WorkerCrashed", message=WORKER_CRASHED) for r in ranks]
