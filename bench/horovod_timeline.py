"""Where a Horovod allreduce's time goes (docs/benchmarks.md, allreduce_horovod_vs_gloo): 2 ranks
allreduce 1 MiB and 64 MiB tensors with Horovod's timeline on, and the timeline's phases are
summed per size (negotiation with the coordinator, waiting in the queue for the next cycle,
copies into and out of the fusion buffer, the Gloo allreduce itself).

    .venv/bin/python -m bench.horovod_timeline
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent / "horovod_timeline.json"
SIZES = {1: 40, 64: 8}  # MiB -> allreduces


def timeline_rank(ctx, path: str) -> None:
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.start_timeline(path, mark_cycles=False)
    for mib, count in SIZES.items():
        t = torch.ones(mib * (1 << 20) // 4)
        for i in range(count):
            hvd.allreduce_(t, op=hvd.Sum, name=f"mib{mib}.{i}")
    hvd.stop_timeline()


def phase_totals(trace: list[dict]) -> dict[str, dict[str, float]]:
    """Per size, mean milliseconds per allreduce: negotiation (until every rank has submitted the
    tensor), the wait from negotiated to started (the background cycle), the Gloo allreduce, and
    the rest of the operation (fusion-buffer copies)."""
    names = {e["pid"]: e["args"]["name"] for e in trace
             if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})}
    stacks: dict[int, list[tuple[str, float]]] = defaultdict(list)
    spans: dict[int, dict[str, tuple[float, float]]] = defaultdict(dict)
    for event in trace:
        if event.get("ph") == "B":
            stacks[event["pid"]].append((event["name"], event["ts"]))
        elif event.get("ph") == "E" and stacks[event["pid"]]:
            name, start = stacks[event["pid"]].pop()
            spans[event["pid"]][name] = (start, event["ts"])
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for pid, phase in spans.items():
        if not {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "GLOO_ALLREDUCE"} <= set(phase):
            continue
        size = names[pid].split(".")[1]  # allreduce.mib<N>.<i>
        negotiate, op, gloo = phase["NEGOTIATE_ALLREDUCE"], phase["ALLREDUCE"], phase["GLOO_ALLREDUCE"]
        parts = {"negotiate_ms": negotiate[1] - negotiate[0], "wait_for_cycle_ms": op[0] - negotiate[1],
                 "gloo_allreduce_ms": gloo[1] - gloo[0], "copies_ms": (op[1] - op[0]) - (gloo[1] - gloo[0])}
        for key, us in parts.items():
            totals[size][key] += us / 1000 / SIZES[int(size[3:])]
    return {size: {k: round(v, 3) for k, v in parts.items()} for size, parts in totals.items()}


def main(spark=None) -> dict:
    from bench.common import make_bench_importable
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.launch import get_backend, run_barrier
    from sparkml_dist.spark import build_session

    make_bench_importable()
    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-horovod-timeline"))
    spark.sparkContext.setLogLevel("ERROR")
    path = Path(tempfile.mkdtemp()) / "timeline.json"
    run_barrier(spark, timeline_rank, str(path), 2, get_backend("horovod", timeout_s=300, timeline=True))
    text = path.read_text().strip().rstrip(",")
    trace = json.loads(text if text.endswith("]") else text + "]")
    report = phase_totals(trace)
    print(json.dumps(report, indent=1))
    OUT.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
