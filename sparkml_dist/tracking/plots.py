"""PNG plots for the run: loss curves, ROC, confusion matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # headless; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

from sparkml_dist.train.records import EpochRecord  # noqa: E402


_ROWS = {"val": "validation", "test": "test"}


def loss_curves(records: Sequence[EpochRecord], path: Path, unit: str = "epoch") -> Path:
    """Train and held-out loss, and held-out accuracy, per epoch (or federated round)."""
    epochs = [r.epoch + 1 for r in records]
    evaluated = [r for r in records if r.evaluation is not None]
    rows = _ROWS[evaluated[0].evaluation.rows] if evaluated else "held-out"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax1.plot(epochs, [r.train_loss for r in records], marker="o", label="train")
    ax1.plot([r.epoch + 1 for r in evaluated], [r.evaluation.loss for r in evaluated], marker="o", label=rows)
    ax1.set(xlabel=unit, ylabel="log loss", title="Loss")
    ax1.legend()
    ax2.plot([r.epoch + 1 for r in evaluated], [r.evaluation.accuracy for r in evaluated], marker="o",
             color="tab:green")
    ax2.set(xlabel=unit, ylabel="accuracy", title=f"{rows.capitalize()} accuracy")
    return _save(fig, path)


def roc(fpr: list[float], tpr: list[float], auc: float, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot(fpr, tpr, label=f"AUC {auc:.4f}")
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC (test)")
    ax.legend(loc="lower right")
    return _save(fig, path)


def confusion(matrix: list[list[int]], labels: tuple[str, str], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.imshow(matrix, cmap="Blues")
    for i in range(2):
        for j in range(2):
            ax.text(j, i, f"{matrix[i][j]:,}", ha="center", va="center", fontsize=12)
    ax.set_xticks([0, 1], labels=[f"pred {labels[0]}", f"pred {labels[1]}"])
    ax.set_yticks([0, 1], labels=[f"true {labels[0]}", f"true {labels[1]}"])
    ax.set_title("Confusion matrix (test)")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
