"""PNG plots for the run: loss curves, ROC, confusion matrix."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless; must precede pyplot
import matplotlib.pyplot as plt

from sparkml_dist.train.records import EpochRecord

_ROWS = {"val": "validation", "test": "test"}


def loss_curves(records: Sequence[EpochRecord], path: Path, unit: str = "epoch") -> Path:
    """Train and held-out loss, and held-out accuracy, per epoch (or federated round)."""
    epochs = [r.epoch + 1 for r in records]
    evaluated = [(r.epoch + 1, r.evaluation) for r in records if r.evaluation is not None]
    rows = _ROWS[evaluated[0][1].rows] if evaluated else "held-out"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    metric = evaluated[0][1].metric if evaluated else "metric"
    ax1.plot(epochs, [r.train_loss for r in records], marker="o", label="train")
    ax1.plot([n for n, _ in evaluated], [e.loss for _, e in evaluated], marker="o", label=rows)
    ax1.set(xlabel=unit, ylabel="loss", title="Loss")
    ax1.legend()
    ax2.plot([n for n, _ in evaluated], [e.value for _, e in evaluated], marker="o", color="tab:green")
    ax2.set(xlabel=unit, ylabel=metric, title=f"{rows.capitalize()} {metric}")
    return _save(fig, path)


def step_breakdown(records: Sequence[EpochRecord], path: Path) -> Path:
    """Per rank, each epoch's mean step stacked by part (data, compute, comm, optimizer), with the
    measured step as a black tick: a straggler's bar shows which part makes it slow."""
    from sparkml_dist.observe.steps import PHASES  # numpy: only when this plot is drawn

    ranks = sorted({r.rank for rec in records for r in rec.per_rank if r.phases_ms})
    cols = min(len(ranks), 4)
    rows = (len(ranks) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.2 * rows), squeeze=False, sharey=True)
    colors = {"data": "tab:orange", "compute": "tab:blue", "comm": "tab:red", "optimizer": "tab:green"}
    for ax, rank in zip(axes.flat, ranks):
        epochs = [
            (rec.epoch + 1, r.phases_ms)
            for rec in records
            for r in rec.per_rank
            if r.rank == rank and r.phases_ms
        ]
        bottom = [0.0] * len(epochs)
        for phase in PHASES:
            heights = [ms.get(phase, 0.0) for _, ms in epochs]
            ax.bar([e for e, _ in epochs], heights, bottom=bottom, color=colors[phase], label=phase)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.plot(
            [e for e, _ in epochs],
            [ms.get("total", 0.0) for _, ms in epochs],
            "k_",
            markersize=14,
            label="measured step",
        )
        ax.set(title=f"rank {rank}", xlabel="epoch", ylabel="mean ms per step")
    for ax in list(axes.flat)[len(ranks) :]:
        ax.axis("off")
    fig.suptitle("Where each step's time went")
    fig.legend(
        *axes.flat[0].get_legend_handles_labels(), loc="lower center", ncol=5, fontsize=8, frameon=False
    )
    return _save(fig, path, rect=(0, 0.08, 1, 1))  # room below for the legend


def system_metrics(records: Sequence[EpochRecord], path: Path) -> Path:
    """Per rank over the run's time: its process's CPU (100% = one core busy) and memory, and the
    host's network traffic, as MLflow's System Metrics tab would chart `system/rank<N>/...`."""
    samples = [s for rec in records for s in rec.system]
    start = min(s.timestamp_ms for s in samples)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    shown = (
        ("process_cpu_percentage", "process CPU %"),
        ("process_rss_megabytes", "process RSS (MB)"),
        ("network_transmit_megabytes", "host network sent (MB)"),
    )
    for rank in sorted({s.rank for s in samples}):
        mine = sorted((s for s in samples if s.rank == rank), key=lambda s: s.timestamp_ms)
        seconds = [(s.timestamp_ms - start) / 1000 for s in mine]
        for ax, (name, _) in zip(axes, shown):
            ax.plot(
                seconds, [s.values.get(name, float("nan")) for s in mine], marker=".", label=f"rank {rank}"
            )
    for ax, (_, label) in zip(axes, shown):
        ax.set(xlabel="seconds into training", title=label)
    axes[0].legend(fontsize=8)
    return _save(fig, path)


def roc(fpr: list[float], tpr: list[float], auc: float, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot(fpr, tpr, label=f"AUC {auc:.4f}")
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC (test)")
    ax.legend(loc="lower right")
    return _save(fig, path)


def confusion(matrix: list[list[float]], labels: Sequence[str], path: Path) -> Path:
    """Rows: true class, columns: predicted; cells annotated while there are few enough to read."""
    k = len(labels)
    size = min(4.5 + 0.35 * k, 14)
    fig, ax = plt.subplots(figsize=(size, size * 0.9))
    ax.imshow(matrix, cmap="Blues")
    if k <= 15:
        for i in range(k):
            for j in range(k):
                value = matrix[i][j]
                ax.text(
                    j,
                    i,
                    f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}",
                    ha="center",
                    va="center",
                    fontsize=12 if k <= 4 else 8,
                )
    ticks = list(range(k))
    if k <= 4:
        ax.set_xticks(ticks, labels=[f"pred {c}" for c in labels])
        ax.set_yticks(ticks, labels=[f"true {c}" for c in labels])
    else:
        ax.set_xticks(ticks, labels=list(labels), rotation=90)
        ax.set_yticks(ticks, labels=list(labels))
        ax.set(xlabel="predicted", ylabel="true")
    ax.set_title("Confusion matrix (test)")
    return _save(fig, path)


def predicted_vs_actual(actual: Sequence[float], predicted: Sequence[float], r2: float, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(4.8, 4.5))
    ax.scatter(actual, predicted, s=4, alpha=0.3)
    lo, hi = (min(min(actual), min(predicted)), max(max(actual), max(predicted))) if actual else (0, 1)
    ax.plot([lo, hi], [lo, hi], linestyle="--", color="grey")
    ax.set(xlabel="actual", ylabel="predicted", title=f"Predicted vs actual (test, R2 {r2:.3f})")
    ax.tick_params(axis="x", labelrotation=30)  # five-digit prices would run into each other
    return _save(fig, path)


def residuals(actual: Sequence[float], predicted: Sequence[float], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.scatter(predicted, [a - p for a, p in zip(actual, predicted)], s=4, alpha=0.3)
    ax.axhline(0.0, linestyle="--", color="grey")
    ax.set(xlabel="predicted", ylabel="actual - predicted", title="Residuals (test)")
    ax.tick_params(axis="x", labelrotation=30)
    return _save(fig, path)


def _save(fig, path: Path, rect: tuple[float, float, float, float] = (0, 0, 1, 1)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
