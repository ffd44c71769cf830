"""Tuning: pruning against no pruning on the same seeded study, and the tuned model against the
default config (Adult, conf/adult.yaml's search space, 1-rank trials, 2 at a time, local[2]).

The studies are identical but for `tune.pruner` (none, median, asha): the same TPE seed, space,
trial count and epochs per trial (conf/adult.yaml's 8); the draws are seeded per trial, so trial n
has the same parameters in both. The unpruned study runs first, then the median one, then ASHA. Reported:

- tune_epochs_{median,asha}_vs_unpruned: training epochs the whole study ran, with Optuna's
  median pruner (conf/adult.yaml's) and with ASHA (successive halving), against none (the
  issue asks >= 40% fewer, ratio <= 0.6);
- tune_best_val_{median,asha}_vs_unpruned: the best trial's validation accuracy (at most 0.5 pt worse);
- tune_trials_per_hour: finished trials per hour of wall time on this machine, median vs none;
- tune_test_accuracy_vs_default: the median study's registered model against conf/adult.yaml's
  default training (8 epochs, 2 ranks) on the test split.

    .venv/bin/python -m bench.tune
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.common import entry, record

ROOT = Path(__file__).resolve().parents[1]
TRIALS = 8  # each trial as long as conf/adult.yaml's own training (train.epochs: 8)


def study(spark, tmp: str, pruner: str) -> dict:
    from sparkml_dist.config import load_config
    from sparkml_dist.tune import run_tune

    cfg = load_config(
        ROOT / "conf/adult.yaml",
        [
            f"output.root={tmp}/{pruner}",
            f"tracking.tracking_uri=sqlite:///{tmp}/{pruner}.db",
            f"tune.trials={TRIALS}",
            f"tune.pruner={pruner}",
            "tune.seed=11",
        ],
    )
    start = time.perf_counter()
    result = run_tune(spark, cfg)
    seconds = time.perf_counter() - start
    import optuna

    trials = optuna.load_study(study_name=result.study_name, storage=result.storage).get_trials()
    epochs = sum(int(t.user_attrs.get("epochs", 0)) for t in trials)
    finished = sum(1 for t in trials if t.state.name in ("COMPLETE", "PRUNED"))
    print(
        f"   {pruner}: {finished} trials ({result.states}), {epochs} epochs, best val {result.best_value:.4f}, "
        f"test accuracy {result.test_metrics['accuracy']:.4f}, {seconds:.0f} s",
        flush=True,
    )
    return {
        "epochs": epochs,
        "best": result.best_value,
        "per_hour": finished * 3600 / seconds,
        "test": result.test_metrics["accuracy"],
    }


def default_test_accuracy(spark, tmp: str) -> float:
    from sparkml_dist.config import load_config
    from sparkml_dist.pipeline import run_pipeline

    cfg = load_config(
        ROOT / "conf/adult.yaml",
        [f"output.root={tmp}/default", f"tracking.tracking_uri=sqlite:///{tmp}/default.db"],
    )
    return run_pipeline(spark, cfg).test_metrics["accuracy"]


def main(spark=None) -> list[dict]:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    own = spark is None
    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-tune"))
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-tune-") as tmp:
            unpruned = study(spark, tmp, "none")
            median = study(spark, tmp, "median")
            asha = study(spark, tmp, "asha")
            default = default_test_accuracy(spark, tmp)
    finally:
        if own:
            spark.stop()
    rows = []
    for name, pruned in (("median", median), ("asha", asha)):
        worst = (unpruned["best"] - 0.005) / unpruned["best"]
        rows += [
            entry(
                f"tune_epochs_{name}_vs_unpruned",
                pruned["epochs"],
                unpruned["epochs"],
                "epochs",
                "lower",
                0.6,
            ),
            entry(
                f"tune_best_val_{name}_vs_unpruned",
                pruned["best"],
                unpruned["best"],
                "val acc",
                "higher",
                round(worst, 4),
                note="at most 0.5 accuracy points below the unpruned study's best",
            ),
        ]
    rows += [
        entry(
            "tune_trials_per_hour",
            median["per_hour"],
            unpruned["per_hour"],
            "trials/h",
            "higher",
            None,
            note=f"median pruner vs none: {TRIALS} trials x 8 epochs, 1 rank each, 2 at a time, 2 cores",
        ),
        entry(
            "tune_test_accuracy_vs_default",
            median["test"],
            default,
            "test acc",
            "higher",
            1.0,
            note="the median-pruned study's registered model vs conf/adult.yaml's default training",
        ),
    ]
    record(rows)
    return rows


if __name__ == "__main__":
    main()
