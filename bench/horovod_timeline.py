"""Where a Horovod allreduce's time goes (docs/benchmarks.md, allreduce_horovod_vs_gloo): 2 ranks
allreduce 1 MiB and 64 MiB tensors with Horovod's timeline on, two ways in one job, alternated in
blocks: waited for by
Horovod's own `synchronize` (a `yield` spin), and by polling with a sleep as the training strategy
waits (`train/horovod_parallel.py::_wait_quietly`). Each way and size repeats one name, as the
strategy's reductions do. The timeline's phases are averaged per way and size: negotiation (until
every rank has submitted the tensor), waiting for the next background cycle, the Gloo allreduce
itself, and the rest of the operation (fusion-buffer copies).

    .venv/bin/python -m bench.horovod_timeline
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent / "horovod_timeline.json"
SIZES = {
    1: 240,
    64: 24,
}  # MiB -> allreduces per way, in BLOCKS alternated blocks (a call's time is noisy here)
BLOCKS = 6
WAYS = ("horovod_wait", "strategy_wait")
PHASES = ("NEGOTIATE_ALLREDUCE", "ALLREDUCE", "GLOO_ALLREDUCE")


def timeline_rank(ctx, path: str) -> None:
    import horovod.torch as hvd
    import torch

    from sparkml_dist.train.horovod_parallel import _wait_quietly

    torch.set_num_threads(1)
    hvd.start_timeline(path, mark_cycles=False)
    for mib, count in SIZES.items():
        t = torch.ones(mib * (1 << 20) // 4)
        for block in range(BLOCKS):
            for way in WAYS if block % 2 == 0 else WAYS[::-1]:
                name = f"{way}.mib{mib}"  # a name per way and size: the timeline gives each name its own row
                for _ in range(count // BLOCKS):
                    handle = hvd.allreduce_async_(t, op=hvd.Sum, name=name)
                    if way == "strategy_wait":
                        _wait_quietly(handle)
                    hvd.synchronize(handle)  # horovod_wait: Horovod's own spin until it is done
    hvd.stop_timeline()


def spans_by_row(trace: list[dict]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Each timeline row's (one tensor name's) begin/end pairs per phase, in order."""
    names = {
        e["pid"]: e["args"]["name"]
        for e in trace
        if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})
    }
    stacks: dict[int, list[tuple[str, float]]] = defaultdict(list)
    spans: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for event in trace:
        if event.get("ph") == "B":
            stacks[event["pid"]].append((event["name"], event["ts"]))
        elif event.get("ph") == "E" and stacks[event["pid"]]:
            phase, start = stacks[event["pid"]].pop()
            spans[names.get(event["pid"], "?")][phase].append((start, event["ts"]))
    return spans


def phase_means(trace: list[dict]) -> dict[str, dict[str, float]]:
    """Per way and size, mean milliseconds per allreduce of each part."""
    report = {}
    for row, phases in spans_by_row(trace).items():
        calls = list(zip(*(phases.get(p, []) for p in PHASES)))
        if not calls:
            continue
        totals: dict[str, float] = defaultdict(float)
        for negotiate, op, gloo in calls:
            totals["negotiate_ms"] += negotiate[1] - negotiate[0]
            totals["wait_for_cycle_ms"] += op[0] - negotiate[1]
            totals["gloo_allreduce_ms"] += gloo[1] - gloo[0]
            totals["copies_ms"] += (op[1] - op[0]) - (gloo[1] - gloo[0])
        key = row.removeprefix("allreduce.")  # <way>.mib<N>
        report[key] = {k: round(v / 1000 / len(calls), 3) for k, v in totals.items()} | {"calls": len(calls)}
    return dict(sorted(report.items()))


def main(spark=None) -> dict:
    from bench.common import make_bench_importable, scratch_dir
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.launch import get_backend, run_barrier
    from sparkml_dist.spark import build_session

    make_bench_importable()
    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-horovod-timeline"))
    spark.sparkContext.setLogLevel("ERROR")
    path = Path(scratch_dir()) / "timeline.json"
    run_barrier(spark, timeline_rank, str(path), 2, get_backend("horovod", timeout_s=300, timeline=True))
    text = path.read_text().strip().rstrip(",")
    trace = json.loads(text if text.endswith("]") else text + "]")
    report = phase_means(trace)
    print(json.dumps(report, indent=1))
    OUT.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
