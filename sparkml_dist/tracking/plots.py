"""PNG plots for the run: loss curves, ROC, confusion matrix."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402


def loss_curves(history: list[dict[str, float]], path: Path) -> Path:
    epochs = [h["epoch"] + 1 for h in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax1.plot(epochs, [h["train_loss"] for h in history], marker="o", label="train")
    ax1.plot(epochs, [h["val_loss"] for h in history], marker="o", label="validation")
    ax1.set(xlabel="epoch", ylabel="log loss", title="Loss")
    ax1.legend()
    ax2.plot(epochs, [h["val_accuracy"] for h in history], marker="o", color="tab:green")
    ax2.set(xlabel="epoch", ylabel="accuracy", title="Validation accuracy")
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
