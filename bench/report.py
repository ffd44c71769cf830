"""The tables of docs/benchmarks.md, generated from bench/results.json.

    .venv/bin/python -m bench.report            # print the full table
    .venv/bin/python -m bench.report --write    # rewrite every generated table in the docs, and
                                                # docs/img/growth.png from the growth rows

A generated table sits between `<!-- bench.report: PREFIX -->` and `<!-- /bench.report -->`
and holds the rows whose names start with PREFIX (`*`: every row), in docs/benchmarks.md and in
the feature docs that quote their own rows (`GENERATED`). An alternated row's range is the spread
of its rounds (`ratio_range`). tests/test_bench_report.py fails when the docs and
bench/results.json disagree.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path

from bench.common import RESULTS

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
GENERATED = (
    DOCS,
    DOCS.parent / "streaming.md",
    DOCS.parent / "serving.md",
)  # every file with generated tables
GROWTH_PLOT = DOCS.parent / "img" / "growth.png"
COPY_CURVE = "Spark's CSV-to-Parquet copy"
BLOCK = re.compile(r"(<!-- bench\.report: (\S+) -->\n)(.*?)(<!-- /bench\.report -->)", re.S)

ORDER = [
    "infer_vs_arrow_ceiling",
    "infer_vs_mlflow_spark_udf",
    "infer_vs_mlflow_spark_udf_array_signature",
    "infer_vs_predict_batch_udf",
    "infer_compute_bound_vs_torch",
    "train_1rank_vs_plain_torch",
    "train_scaling_2_ranks",
    "train_scaling_2_ranks_no_comm_ceiling",
    "train_scaling_2_ranks_vs_no_comm_ceiling",
    "train_scaling_2_ranks_lockstep_vs_no_comm_ceiling",
    "train_scaling_2_ranks_vs_lockstep_ceiling",
    "train_scaling_2_ranks_gloo_vs_no_comm_ceiling",
    "train_vs_torch_distributor",
    "train_vs_torch_distributor_1_epoch",
    "train_vs_torch_distributor_dataloader_2m",
    "train_over_connect_vs_classic_1_epoch",
    "pipeline_over_connect_vs_classic",
    "train_vs_ray_train",
    "train_vs_ray_train_epoch",
    "train_vs_ray_train_warm",
    "train_vs_ray_train_warm_epoch",
    "run_start_vs_torch_distributor",
    "dataframe_fed_vs_parquet",
    "dataframe_fed_launch_vs_parquet",
    "dataframe_fed_vs_torch_distributor_df",
    "loader_vs_pyarrow",
    "allreduce_torch_vs_gloo",
    "allreduce_torch_vs_gloo_16mib",
    "allreduce_torch_vs_gloo_1mib",
    "allreduce_horovod_vs_gloo",
    "allreduce_horovod_vs_gloo_16mib",
    "allreduce_horovod_vs_gloo_1mib",
    "preprocess_vs_spark_io_1m",
    "preprocess_vs_spark_io_10m",
    "preprocess_vs_spark_io_mnist",
    "memory_stream_train",
    "memory_score_10m",
    "memory_train_vs_torch_dataloader",
    "memory_score_vs_predict_batch_udf",
    "host_loss_run_vs_uninterrupted",
    "host_loss_resume_s",
    "tune_epochs_median_vs_unpruned",
    "tune_best_val_median_vs_unpruned",
    "tune_epochs_asha_vs_unpruned",
    "tune_best_val_asha_vs_unpruned",
    "tune_trials_per_hour",
    "tune_test_accuracy_vs_default",
    "observe_overhead_2_ranks",
    "stream_vs_batch_scoring",
    "stream_latency_p50",
    "stream_latency_p95",
    "stream_over_connect_vs_classic",
    "stream_over_connect_vs_classic_batches",
    "serve_latency_1_row_p50",
    "serve_latency_1_row_p95",
    "serve_latency_100_rows_p50",
    "serve_latency_100_rows_p95",
    "pyfunc_raw_vs_spark_scorer",
    "spark_ml_adult_accuracy_vs_best",
    "spark_ml_adult_time_vs_mlp",
    "spark_ml_adult_time_vs_logistic",
    "spark_ml_adult_time_vs_gbt",
    "spark_ml_diamonds_rmse_vs_best",
    "spark_ml_diamonds_time_vs_linear",
    "spark_ml_diamonds_time_vs_gbt",
    "growth_preprocess_1m",
    "growth_preprocess_10m",
    "growth_preprocess_100m",
    "growth_score_1m",
    "growth_score_10m",
    "growth_score_100m",
    "growth_preprocess_per_row_10m_vs_1m",
    "growth_preprocess_per_row_100m_vs_10m",
    "growth_score_per_row_10m_vs_1m",
    "growth_score_per_row_100m_vs_10m",
    "growth_train_1_ranks",
    "growth_train_2_ranks",
    "growth_train_4_ranks",
]


def table(results: list[dict], prefix: str = "*") -> str:
    """The markdown table of the rows named `prefix...` (`*`: all), in the docs' order."""
    rank = {name: i for i, name in enumerate(ORDER)}
    chosen = [r for r in results if prefix == "*" or r["name"].startswith(prefix)]
    lines = [
        "| name | ours | baseline | unit | ratio | ratio range | target | | measured |",
        "|---|---:|---:|---|---:|---|---|---|---|",
    ]
    for r in sorted(chosen, key=lambda r: (rank.get(r["name"], len(ORDER)), r["name"])):
        sign = "≥" if r["better"] == "higher" else "≤"
        goal = "report" if r["target"] is None else f"{sign} {r['target']}"
        verdict = "" if r["met"] is None else "met" if r["met"] else "missed"
        lines.append(
            f"| `{r['name']}` | {r['ours']:,.2f} | {r['baseline']:,.2f} | {r['unit']} | **{r['ratio']:.3f}** "
            f"| {ratio_range(r)} | {goal} | {verdict} | {measured(r)} |"
        )
    return "\n".join(lines)


def measured(row: dict) -> str:
    """When and at which commit a row was measured. Rows recorded before bench/common.py stamped
    them carry the commit that first held their figures and its date, from git's history of
    bench/results.json (`dated_from: git`), marked so."""
    if "measured" not in row:
        return ""
    if row.get("dated_from") == "git":
        return f"{row['measured']}, recorded in `{row['commit']}`"
    return f"{row['measured']} `{row['commit']}`"


def ratio_range(row: dict) -> str:
    """The worst to the best ratio the recorded rounds allow (ours' slowest run against the
    baseline's fastest, and the other way round), or "" for a row measured once."""
    ours, base = row.get("ours_runs"), row.get("baseline_runs")
    if not ours or not base or not base["min"] or not base["max"]:
        return "1 round" if row.get("rounds") == 1 else ""
    low, high = ours["min"] / base["max"], ours["max"] / base["min"]
    return f"{low:.2f}–{high:.2f} ({ours['rounds']} rounds)"


def render(docs: str, results: list[dict]) -> str:
    """`docs` with every generated table replaced by its rows from `results`."""
    return BLOCK.sub(lambda m: f"{m.group(1)}{table(results, m.group(2))}\n{m.group(4)}", docs)


def load_results(path: Path = RESULTS) -> list[dict]:
    return json.loads(path.read_text())["results"]


def growth_curves(results: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """bench.growth's per-size rows as curves of (rows, microseconds per row), smallest first:
    our preprocess and score, and the copy they are measured beside (the preprocess rows' baseline)."""
    curves: dict[str, list[tuple[int, float]]] = {"preprocess": [], "score": [], COPY_CURVE: []}
    for r in results:
        part = re.fullmatch(r"growth_(preprocess|score)_[^_]+", r["name"])
        if part is None or "rows" not in r:
            continue
        curves[part.group(1)].append((r["rows"], r["ours"]))
        if part.group(1) == "preprocess":
            curves[COPY_CURVE].append((r["rows"], r["baseline"]))
    return {name: sorted(points) for name, points in curves.items() if points}


def growth_ranks(results: list[dict]) -> list[tuple[int, float, float]]:
    """bench.growth's training rows as (ranks, samples/s, n x one rank's samples/s), fewest first."""
    return sorted((r["ranks"], r["ours"], r["baseline"]) for r in results if "ranks" in r)


def growth_plot(results: list[dict], path: Path = GROWTH_PLOT) -> Path | None:
    """Log-log: microseconds per row against rows, one line per curve; beside it, when the
    training rows are there, samples/s against ranks with n times one rank's (None: no rows)."""
    curves, ranks = growth_curves(results), growth_ranks(results)
    if not curves and not ranks:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(1, 1 + bool(curves and ranks), figsize=(11 if curves and ranks else 6.4, 4.2))
    axes = list(axes) if curves and ranks else [axes]
    if curves:
        ax = axes[0]
        for name, points in curves.items():
            ax.plot(*zip(*points), marker="o", label=name, linestyle="--" if name == COPY_CURVE else "-")
            for rows, cost in points:
                ax.annotate(
                    f"{cost:.1f}", (rows, cost), textcoords="offset points", xytext=(4, 4), fontsize=8
                )
        ax.set(xscale="log", yscale="log", xlabel="training rows (test: a tenth more)", ylabel="µs per row")
        plain = FuncFormatter(lambda value, _: f"{value:g}")  # 20, not 2 x 10^1
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set_title("Cost per row as the data grows")
        ax.legend(fontsize=8)
    if ranks:
        ax = axes[-1]
        n, rate, ideal = zip(*ranks)
        ax.plot(n, rate, marker="o", label="ours (emulated hosts)")
        ax.plot(n, ideal, marker="o", linestyle="--", color="grey", label="n x one rank")
        for x, y in zip(n, rate):
            ax.annotate(f"{y:,.0f}", (x, y), textcoords="offset points", xytext=(4, -12), fontsize=8)
        ax.set(xlabel="ranks", ylabel="samples/s", xticks=list(n), ylim=(0, max(ideal) * 1.1))
        ax.set_title("Training throughput by ranks")
        ax.legend(fontsize=8)
    fig.suptitle("bench.growth", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: same rows, same bytes
    plt.close(fig)
    return path


def write_docs(paths: tuple[Path, ...] = GENERATED) -> None:
    results = load_results()
    growth_plot(results)
    for path in paths:
        text = render(path.read_text(), results)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--write",
        action="store_true",
        help="rewrite the generated tables in " + ", ".join(p.name for p in GENERATED),
    )
    if parser.parse_args().write:
        write_docs()
    else:
        print(table(load_results()))
