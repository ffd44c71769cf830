"""Recovery from lost ranks: SIGKILL a rank's process mid-epoch; the driver relaunches the
barrier stage and every attempt resumes exactly from the last checkpoint."""

import pytest

from sparkml_dist.errors import TrainingFailed
from sparkml_dist.models.factory import model_spec
from sparkml_dist.stages.train import make_job, run_with_recovery
from sparkml_dist.train.checkpoint import list_checkpoints
from sparkml_dist.train.job import Fault

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EPOCHS = 2


def recovery_job(adult_prep, tmp_path, faults=(), **train):
    cfg, prep = adult_prep
    train = {"epochs": EPOCHS, "checkpoint_every_steps": 10, "timeout_s": 60, **train}
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update=train)})
    job = make_job(prep.path, prep.manifest, model_spec(cfg.model, prep.manifest.feature_dim), cfg,
                   str(tmp_path / "ckpt"), None)
    from dataclasses import replace

    return cfg, replace(job, faults=tuple(faults)), prep.manifest.splits["train"].rows


@pytest.fixture(scope="module")
def uninterrupted(spark, adult_prep, tmp_path_factory):
    cfg, job, _ = recovery_job(adult_prep, tmp_path_factory.mktemp("clean"))
    return run_with_recovery(spark, job, cfg)[0]


@pytest.mark.parametrize("rank, epoch, step", [(0, 0, 5), (1, 0, 23), (1, 1, 0), (0, 1, 31), (1, 1, 55)])
def test_sigkill_mid_epoch_resumes_exactly(spark, adult_prep, tmp_path, uninterrupted, rank, epoch, step):
    cfg, job, rows = recovery_job(adult_prep, tmp_path, [Fault(rank=rank, epoch=epoch, step=step)])
    chief = run_with_recovery(spark, job, cfg)[0]
    assert [h["epoch"] for h in chief["history"]] == list(range(EPOCHS))
    assert [int(h["samples"]) for h in chief["history"]] == [rows] * EPOCHS, "no sample skipped or seen twice"
    final, clean = chief["history"][-1]["val_accuracy"], uninterrupted["history"][-1]["val_accuracy"]
    assert abs(final - clean) <= 0.01
    assert len(list_checkpoints(tmp_path / "ckpt")) <= cfg.train.checkpoint_keep


def test_sigkill_under_horovod_resumes(spark, adult_prep, tmp_path, uninterrupted):
    cfg, job, rows = recovery_job(adult_prep, tmp_path, [Fault(rank=1, epoch=0, step=17)], backend="horovod")
    chief = run_with_recovery(spark, job, cfg)[0]
    assert [int(h["samples"]) for h in chief["history"]] == [rows] * EPOCHS
    assert abs(chief["history"][-1]["val_accuracy"] - uninterrupted["history"][-1]["val_accuracy"]) <= 0.01


def test_sigkill_under_fsdp_resumes_from_the_sharded_checkpoint(spark, adult_prep, tmp_path, uninterrupted):
    cfg, job, rows = recovery_job(adult_prep, tmp_path, [Fault(rank=1, epoch=0, step=23)], strategy="fsdp")
    chief = run_with_recovery(spark, job, cfg)[0]
    assert [int(h["samples"]) for h in chief["history"]] == [rows] * EPOCHS, "exact resume from DCP shards"
    assert abs(chief["history"][-1]["val_accuracy"] - uninterrupted["history"][-1]["val_accuracy"]) <= 0.01
    assert all(p.suffix == ".dcp" and p.is_dir() for p in list_checkpoints(tmp_path / "ckpt"))


def test_exhausted_attempts_end_with_a_clear_error(spark, adult_prep, tmp_path):
    faults = [Fault(rank=0, epoch=0, step=3, attempt=a) for a in range(2)]
    cfg, job, _ = recovery_job(adult_prep, tmp_path, faults, max_attempts=2)
    with pytest.raises(TrainingFailed, match=r"training failed after 2 attempt\(s\).*max_attempts") as err:
        run_with_recovery(spark, job, cfg)
    assert "crashed" in err.value.last_failure or "exited" in err.value.last_failure


def test_a_slow_rank_is_reported_as_a_straggler(spark, adult_prep, tmp_path):
    cfg, job, _ = recovery_job(adult_prep, tmp_path, [Fault(rank=1, kind="slow", seconds=0.01)], epochs=1)
    results = run_with_recovery(spark, job, cfg)
    assert results[0]["stragglers"] == [1]
    assert results[0]["history"][0]["stragglers"] == 1.0


def test_a_hung_rank_times_out_and_is_named(spark, adult_prep, tmp_path):
    cfg, job, _ = recovery_job(adult_prep, tmp_path, [Fault(rank=1, kind="hang", epoch=0, step=12)],
                        max_attempts=1, timeout_s=10)
    with pytest.raises(TrainingFailed) as err:
        run_with_recovery(spark, job, cfg)
    text = err.value.last_failure
    assert "missing rank(s) [1]: last allreduce joined: rank 1 at epoch 1 batch 11" in text


def test_a_data_error_in_a_rank_is_not_relaunched(spark, adult_prep, tmp_path):
    """Unreadable training files fail the same way on every attempt: one attempt, not
    max_attempts, and the error names the file."""
    import shutil
    from dataclasses import replace

    cfg, job, _ = recovery_job(adult_prep, tmp_path, max_attempts=3)
    copy = tmp_path / "prep"
    shutil.copytree(job.data_root, copy)
    for f in (copy / "train").glob("*.parquet"):
        f.write_bytes(b"not parquet")
    with pytest.raises(TrainingFailed, match=r"after 1 attempt\(s\).*not relaunched") as err:
        run_with_recovery(spark, replace(job, data_root=str(copy)), cfg)
    assert "DataError" in err.value.last_failure and "not a readable Parquet file" in err.value.last_failure
    assert list_checkpoints(tmp_path / "ckpt") == [], "nothing was trained"
