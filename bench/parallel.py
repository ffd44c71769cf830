"""Model-parallel strategies vs DDP on a transformer: per-step time, per-rank memory (model +
optimizer state held, and peak RSS), bytes each rank sends per step (measured from the
process's write() bytes, which is gloo's TCP traffic) against the textbook formulas, and the
pipeline bubble fraction.

    .venv/bin/python -m bench.parallel

Writes the detail table to bench/parallel.json and ratio rows to bench/results.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import entry, make_bench_importable, record

OUT = Path(__file__).resolve().parent / "parallel.json"
NAMES = [f"_num_scaled_{i}" for i in range(16)] + [f"c{j}__onehot_{v}" for j in range(6) for v in range(8)]
CASES = [
    ("ddp", 2, {}),
    ("fsdp", 2, {}),
    ("tensor", 2, {}),
    ("pipeline", 2, {"schedule": "gpipe"}),
    ("pipeline", 2, {"schedule": "1f1b"}),
    ("hybrid", 4, {"tensor_parallel": 2}),
    ("ddp", 4, {}),
    ("fsdp", 4, {}),
]
GLOBAL_BATCH, MICROBATCHES, STEPS = 64, 4, 12


def spec():
    from sparkml_dist.models.spec import ModelSpec, TransformerShape
    from sparkml_dist.models.transformer import token_layout

    shape = TransformerShape(tuple(token_layout(NAMES)), d_model=128, heads=8, layers=4, mlp_hidden=512)
    return ModelSpec("transformer", len(NAMES), dropout=0.0, transformer=shape)


def expected_bytes(strategy: str, ranks: int, params: float, activation: float, tp: int = 2) -> float:
    """Bytes one rank sends per step by the formulas (ring collectives): DDP 2(n-1)/n S,
    FSDP 3(n-1)/n S, tensor parallel 4 allreduces of the activations per block (Megatron's f/g
    in forward and backward), pipeline one activation forward or one gradient back."""
    ring = lambda n: 2 * (n - 1) / n  # noqa: E731 - an allreduce's send volume per byte
    blocks = spec().transformer.layers
    if strategy == "ddp":
        return ring(ranks) * params
    if strategy == "fsdp":
        return 3 * (ranks - 1) / ranks * params
    if strategy == "tensor":
        return 4 * blocks * ring(ranks) * activation
    if strategy == "pipeline":
        return activation
    if strategy == "hybrid":  # tensor parallel on each group's batch, FSDP of 1/tp of the model across groups
        dp = ranks // tp
        return 4 * blocks * ring(tp) * activation / dp + 3 * (dp - 1) / dp * params / tp
    raise ValueError(strategy)


def run_case(spark, strategy: str, ranks: int, options: dict) -> dict:
    from bench.probe import Probe, probe_rank
    from sparkml_dist.launch import TorchBackend, run_barrier

    probe = Probe(
        spec(),
        strategy=strategy,
        steps=STEPS,
        global_batch=GLOBAL_BATCH,
        microbatches=MICROBATCHES,
        **options,
    )
    results = run_barrier(
        spark, probe_rank, probe, ranks, TorchBackend(timeout_s=300, needs_fresh_process=True)
    )
    shape = spec().transformer
    data_world = {"tensor": 1, "pipeline": 1, "hybrid": ranks // options.get("tensor_parallel", 2)}.get(
        strategy, ranks
    )
    activation = GLOBAL_BATCH / data_world * shape.tokens * shape.d_model * 4
    row = {
        "strategy": strategy + (f"-{options['schedule']}" if "schedule" in options else ""),
        "ranks": ranks,
        "step_ms": 1000 * max(r.step_s for r in results),
        "state_mib_per_rank": max(r.state_bytes for r in results) / 2**20,
        "peak_rss_mib": max(r.peak_rss_mib for r in results),
        "sent_kib_per_rank": max(r.bytes_sent_per_step for r in results) / 1024,
        "formula_kib": expected_bytes(strategy, ranks, results[0].full_param_bytes, activation) / 1024,
        "model_mib": results[0].full_param_bytes / 2**20,
    }
    if strategy == "pipeline":
        busy = [MICROBATCHES * r.stage_microbatch_s for r in results]
        row["bubble"] = 1 - sum(busy) / len(busy) / max(r.step_s for r in results)
        row["bubble_formula"] = (ranks - 1) / (MICROBATCHES + ranks - 1)
    print(json.dumps(row), flush=True)
    return row


def main(spark=None) -> list[dict]:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    make_bench_importable()
    own = spark is None
    spark = spark or build_session(SparkConfig(master="local[4]", app_name="sparkml_dist-bench-parallel"))
    spark.sparkContext.setLogLevel("ERROR")
    rows = [run_case(spark, s, n, o) for s, n, o in CASES]
    if own:
        spark.stop()
    OUT.write_text(json.dumps(rows, indent=2))
    record(ratio_rows(rows))
    return rows


def ratio_rows(rows: list[dict]) -> list[dict]:
    """Each strategy against DDP at the same rank count: step time (report) and the model +
    optimizer state a rank holds (target: about 1/N of DDP's)."""
    ddp = {r["ranks"]: r for r in rows if r["strategy"] == "ddp"}
    out = []
    for r in rows:
        base = ddp.get(r["ranks"])
        if base is None or r["strategy"] == "ddp":
            continue
        name = f"parallel_{r['strategy'].replace('-', '_')}_{r['ranks']}r"
        out.append(entry(f"{name}_step_time_vs_ddp", r["step_ms"], base["step_ms"], "ms/step", "lower", None))
        out.append(
            entry(
                f"{name}_state_vs_ddp",
                r["state_mib_per_rank"],
                base["state_mib_per_rank"],
                "MiB/rank",
                "lower",
                round(1.15 / r["ranks"], 3),
            )
        )
    return out


if __name__ == "__main__":
    main()
