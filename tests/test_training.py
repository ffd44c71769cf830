"""Training: 2 real ranks in a barrier stage on the real Adult Parquet; and 1 rank without Spark."""

import pytest
from rank_jobs import loop_job

from sparkml_dist.launch import TorchBackend, run_barrier
from sparkml_dist.launch.context import RankContext
from sparkml_dist.train.checkpoint import list_checkpoints, load_latest
from sparkml_dist.train.loop import train_rank

ONE_RANK = RankContext(
    rank=0,
    world_size=1,
    local_rank=0,
    local_size=1,
    cross_rank=0,
    cross_size=1,
    host="127.0.0.1",
    master_addr="127.0.0.1",
    master_port=0,
)


def job_for(cfg, prep, checkpoints, *overrides):
    """The rank loop's payload for the Adult config with `train.*` overrides, e.g. "epochs=3"."""
    return loop_job(cfg.with_overrides(*[f"train.{o}" for o in overrides]), prep, str(checkpoints))


@pytest.mark.spark
def test_two_rank_ddp_keeps_ranks_identical_and_loss_falls(spark, adult_prep, tmp_path):
    cfg, prep = adult_prep
    job = job_for(cfg, prep, tmp_path / "ckpt", "epochs=3")
    results = run_barrier(spark, train_rank, job, 2, TorchBackend(timeout_s=120))
    assert results[0].stats.param_checksum == results[1].stats.param_checksum, "parameters equal across ranks"
    records = results[0].records
    assert records[-1].train_loss < records[0].train_loss
    assert records[-1].evaluation.rows == "val" and records[-1].evaluation.value > 0.83
    assert sum(r.stats.samples for r in results) == prep.manifest.splits["train"].rows, "every row trained on"
    assert [p.rank for p in records[-1].per_rank] == [0, 1], "each rank's pace is in the record"
    assert len(list_checkpoints(tmp_path / "ckpt")) == cfg.train.checkpoint_keep


def test_one_rank_without_spark_trains_and_checkpoints(adult_prep, tmp_path):
    cfg, prep = adult_prep
    job = job_for(cfg, prep, tmp_path / "ckpt", "epochs=2")
    result = train_rank(ONE_RANK, job)
    assert result.records[-1].evaluation.value > 0.82
    latest = load_latest(tmp_path / "ckpt")
    # the last epoch's end, saved as the start of the epoch after it
    assert (latest["epoch"], latest["step"]) == (2, 0) and set(latest) >= {"model", "optimizer", "history"}
    assert [h["epoch"] for h in latest["history"]] == [0, 1]
    # resuming a finished run trains nothing more and returns the same weights and records
    again = train_rank(ONE_RANK, job)
    assert again.stats.param_checksum == result.stats.param_checksum
    assert again.records == result.records


def test_progress_eta_is_paced_by_every_step_not_only_the_logged_ones(caplog, monkeypatch):
    from sparkml_dist.train import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    shown = progress.Progress(True, epochs=2, steps_per_epoch=100, world_size=2)
    for _ in range(50):  # 50 steps of 0.1 s; only the 50th is logged
        now[0] += 0.1
        shown.advance()
    with caplog.at_level("INFO", logger="sparkml_dist.train"):
        shown.step(0, 49, 0.5, 1000.0)
    assert "step 50/100" in caplog.text and "eta 0:00:15" in caplog.text, "150 steps left at 0.1 s each"


def test_a_labelled_runs_progress_lines_say_which_run_they_are(caplog):
    """Tune trials train at once and their rank 0s print to the same driver log: each line names
    its trial."""
    from sparkml_dist.train import progress
    from sparkml_dist.train.records import EpochRecord

    shown = progress.Progress(True, epochs=2, steps_per_epoch=10, world_size=1, label="trial 3")
    shown.advance()
    record = EpochRecord(epoch=0, train_loss=0.5, samples=100, samples_per_s=100.0)
    with caplog.at_level("INFO", logger="sparkml_dist.train"):
        shown.step(0, 0, 0.5, 100.0)
        shown.epoch_end(record)
    assert [r.getMessage().split(" ", 3)[:3] for r in caplog.records] == [["trial", "3:", "epoch"]] * 2
