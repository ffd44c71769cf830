"""A failing rank's report travels to the driver inside the task's exception text (the only
channel Spark guarantees across cluster managers), base64-encoded JSON between markers."""

from __future__ import annotations

import base64
import json
import re
import traceback

from sparkml_dist.errors import RankReport, is_retryable

_START, _END = "SPARKML_DIST_RANK_REPORT[", "]END_REPORT"
_PATTERN = re.compile(re.escape(_START) + r"([A-Za-z0-9+/=]+)" + re.escape(_END))


# Messages of collectives that failed because a peer rank went away (gloo, nccl, horovod).
_PEER_PATTERNS = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe|Timed out waiting|timed out|"
    r"Application timeout caused pair closure|"
    r"ProcessGroup.*(aborted|terminated)|HorovodInternalError|Horovod has been shut down|NCCL communicator was aborted",
    re.IGNORECASE,
)
_PEER_TYPES = frozenset({"DistBackendError", "HorovodInternalError", "PeerLost"})


def is_peer_failure(exc: BaseException) -> bool:
    """True when the exception is a communication failure caused by another rank's death."""
    name = getattr(exc, "exc_type", type(exc).__name__)  # a forked rank's error carries the child's type
    return name in _PEER_TYPES or bool(_PEER_PATTERNS.search(str(exc)))


class RankReportError(RuntimeError):
    """Raised on a rank so that Spark fails the barrier stage and carries the report home."""


def encode_failure(rank: int, host: str, exc: BaseException, tail_lines) -> RankReportError:
    forked = hasattr(exc, "exc_type")  # launch.isolation.ChildRankError: the child's own type and text
    report = RankReport(
        rank=rank,
        host=host,
        exc_type=exc.exc_type if forked else type(exc).__name__,
        message=(exc.child_message if forked else str(exc))[:2000],
        traceback=(getattr(exc, "child_traceback", None)
                   or "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))[-4000:],
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
