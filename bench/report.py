"""Print bench/results.json as the markdown table docs/benchmarks.md carries.

    .venv/bin/python -m bench.report
"""

from __future__ import annotations

import json

from bench.common import RESULTS

ORDER = ["infer_vs_arrow_ceiling", "infer_vs_mlflow_spark_udf", "infer_compute_bound_vs_torch",
         "train_1rank_vs_plain_torch", "train_scaling_2_ranks", "train_vs_torch_distributor",
         "run_start_vs_torch_distributor", "dataframe_fed_vs_parquet", "dataframe_fed_launch_vs_parquet", "dataframe_fed_vs_torch_distributor_df",
         "loader_vs_pyarrow",
         "allreduce_torch_vs_gloo", "allreduce_torch_vs_gloo_16mib", "allreduce_torch_vs_gloo_1mib",
         "allreduce_horovod_vs_gloo", "allreduce_horovod_vs_gloo_16mib", "allreduce_horovod_vs_gloo_1mib",
         "preprocess_vs_spark_io_1m", "preprocess_vs_spark_io_10m", "memory_stream_train", "memory_score_10m",
         "host_loss_run_vs_uninterrupted", "host_loss_resume_s", "tune_epochs_median_vs_unpruned",
         "tune_best_val_median_vs_unpruned", "tune_epochs_asha_vs_unpruned", "tune_best_val_asha_vs_unpruned", "tune_trials_per_hour", "tune_test_accuracy_vs_default", "observe_overhead_2_ranks"]


def table(results: list[dict]) -> str:
    rank = {name: i for i, name in enumerate(ORDER)}
    lines = ["| name | ours | baseline | unit | ratio | target | |", "|---|---:|---:|---|---:|---|---|"]
    for r in sorted(results, key=lambda r: rank.get(r["name"], len(ORDER))):
        sign = "≥" if r["better"] == "higher" else "≤"
        goal = "report" if r["target"] is None else f"{sign} {r['target']}"
        verdict = "" if r["met"] is None else "met" if r["met"] else "missed"
        lines.append(f"| `{r['name']}` | {r['ours']:,.2f} | {r['baseline']:,.2f} | {r['unit']} | **{r['ratio']:.3f}** "
                     f"| {goal} | {verdict} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(json.loads(RESULTS.read_text())["results"]))
