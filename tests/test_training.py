"""Training: 2 real ranks in a barrier stage on the real Adult Parquet; and 1 rank without Spark."""

import pytest

from sparkml_dist.launch import TorchBackend, run_barrier
from sparkml_dist.launch.context import RankContext
from sparkml_dist.models.factory import model_spec
from sparkml_dist.stages.train import make_job
from sparkml_dist.train.checkpoint import list_checkpoints, load_latest
from sparkml_dist.train.loop import train_rank


def job_for(cfg, prep, tmp_path, **train_overrides):
    train_cfg = cfg.train.model_copy(update=train_overrides)
    cfg = cfg.model_copy(update={"train": train_cfg})
    spec = model_spec(cfg.model, prep.manifest.feature_dim)
    return make_job(prep.path, prep.manifest, spec, cfg, str(tmp_path / "ckpt"), None)


@pytest.mark.spark
def test_two_rank_ddp_keeps_ranks_identical_and_loss_falls(spark, adult_prep, tmp_path):
    cfg, prep = adult_prep
    job = job_for(cfg, prep, tmp_path, epochs=3)
    results = run_barrier(spark, train_rank, job, 2, TorchBackend(timeout_s=120))
    assert results[0]["param_checksum"] == results[1]["param_checksum"], "parameters equal across ranks"
    history = results[0]["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert history[-1]["val_accuracy"] > 0.83
    assert sum(r["samples"] for r in results) == prep.manifest.splits["train"].rows, "every row trained on"
    assert len(list_checkpoints(tmp_path / "ckpt")) == cfg.train.checkpoint_keep


def test_one_rank_without_spark_trains_and_checkpoints(adult_prep, tmp_path):
    cfg, prep = adult_prep
    job = job_for(cfg, prep, tmp_path, epochs=2)
    ctx = RankContext(rank=0, world_size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1,
                      host="127.0.0.1", master_addr="127.0.0.1", master_port=0)
    result = train_rank(ctx, job)
    assert result["history"][-1]["val_accuracy"] > 0.82
    latest = load_latest(tmp_path / "ckpt")
    assert latest["epoch"] == 1 and set(latest) >= {"model", "optimizer", "history"}
    # resuming a finished run trains nothing more and returns the same weights
    again = train_rank(ctx, job)
    assert again["param_checksum"] == result["param_checksum"]
