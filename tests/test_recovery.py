"""Recovery from lost ranks: SIGKILL a rank's process mid-epoch; the driver relaunches the
barrier stage and every attempt resumes exactly from the last checkpoint."""

from dataclasses import replace

import pytest
from test_training import job_for

from sparkml_dist.errors import TrainingFailed
from sparkml_dist.methods import get_method
from sparkml_dist.train.checkpoint import list_checkpoints
from sparkml_dist.train.job import Fault

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EPOCHS = 2


def recovery_job(adult_prep, tmp_path, faults=(), *train):
    cfg, prep = adult_prep
    job = job_for(
        cfg, prep, tmp_path / "ckpt", f"epochs={EPOCHS}", "checkpoint_every_steps=10", "timeout_s=60", *train
    )
    return replace(job, faults=tuple(faults)), prep.manifest.splits["train"].rows


def launch(spark, job):
    """The loop method's own launch: relaunched from the last checkpoint, up to train.max_attempts."""
    return get_method(job.train.strategy).launch(spark, job)


@pytest.fixture(scope="module")
def uninterrupted(spark, adult_prep, tmp_path_factory):
    job, _ = recovery_job(adult_prep, tmp_path_factory.mktemp("clean"))
    return launch(spark, job).results[0]


def held_out_accuracy(result) -> float:
    return result.records[-1].evaluation.value


@pytest.mark.parametrize("rank, epoch, step", [(0, 0, 5), (1, 0, 23), (1, 1, 0), (0, 1, 31), (1, 1, 55)])
def test_sigkill_mid_epoch_resumes_exactly(spark, adult_prep, tmp_path, uninterrupted, rank, epoch, step):
    job, rows = recovery_job(adult_prep, tmp_path, [Fault(rank=rank, epoch=epoch, step=step)])
    launched = launch(spark, job)
    chief = launched.results[0]
    assert launched.attempts == 2, "one relaunch after the kill"
    assert [r.epoch for r in chief.records] == list(range(EPOCHS))
    assert [r.samples for r in chief.records] == [rows] * EPOCHS, "no sample skipped or seen twice"
    assert abs(held_out_accuracy(chief) - held_out_accuracy(uninterrupted)) <= 0.01
    assert len(list_checkpoints(tmp_path / "ckpt")) <= job.train.checkpoint_keep


def test_sigkill_under_horovod_resumes(spark, adult_prep, tmp_path, uninterrupted):
    job, rows = recovery_job(adult_prep, tmp_path, [Fault(rank=1, epoch=0, step=17)], "backend=horovod")
    chief = launch(spark, job).results[0]
    assert [r.samples for r in chief.records] == [rows] * EPOCHS
    assert abs(held_out_accuracy(chief) - held_out_accuracy(uninterrupted)) <= 0.01


def test_sigkill_under_fsdp_resumes_from_the_sharded_checkpoint(spark, adult_prep, tmp_path, uninterrupted):
    job, rows = recovery_job(adult_prep, tmp_path, [Fault(rank=1, epoch=0, step=23)], "strategy=fsdp")
    chief = launch(spark, job).results[0]
    assert [r.samples for r in chief.records] == [rows] * EPOCHS, "exact resume from DCP shards"
    assert abs(held_out_accuracy(chief) - held_out_accuracy(uninterrupted)) <= 0.01
    saved = list_checkpoints(tmp_path / "ckpt")
    assert saved and all(
        p.endswith(".dcp") and (tmp_path / "ckpt" / p.rsplit("/", 1)[-1]).is_dir() for p in saved
    )


@pytest.mark.parametrize(
    "backend, cause",
    [
        (
            "torch",
            "WorkerCrashed: its Spark Python worker died while running the rank, without a Python exception: "
            "it was killed by a signal",
        ),
        ("horovod", "the rank's child process died without a result (killed by SIGKILL)"),
    ],
)
def test_exhausted_attempts_end_with_a_clear_error(spark, adult_prep, tmp_path, backend, cause):
    faults = [Fault(rank=1, epoch=0, step=3, attempt=a) for a in range(2)]
    job, _ = recovery_job(adult_prep, tmp_path, faults, "max_attempts=2", f"backend={backend}")
    with pytest.raises(TrainingFailed, match=r"training failed after 2 attempt\(s\).*max_attempts") as err:
        launch(spark, job)
    assert err.value.last_failure.startswith("attempt 2 of 2: rank 1"), err.value.last_failure[:300]
    assert cause in err.value.last_failure, err.value.last_failure[:1000]
    assert "did not start" not in err.value.last_failure


def test_a_slow_rank_is_reported_as_a_straggler(spark, adult_prep, tmp_path):
    job, _ = recovery_job(adult_prep, tmp_path, [Fault(rank=1, kind="slow", seconds=0.01)], "epochs=1")
    chief = launch(spark, job).results[0]
    assert chief.stragglers == (1,)
    assert chief.records[0].stragglers == (1,)
    assert chief.records[0].metrics()["stragglers"] == 1.0
    slow, fast = chief.records[0].per_rank[1], chief.records[0].per_rank[0]
    assert slow.step_ms > 1.5 * fast.step_ms, "the record says how much slower"


def test_a_hung_rank_times_out_and_is_named(spark, adult_prep, tmp_path):
    job, _ = recovery_job(
        adult_prep, tmp_path, [Fault(rank=1, kind="hang", epoch=0, step=12)], "max_attempts=1", "timeout_s=10"
    )
    with pytest.raises(TrainingFailed) as err:
        launch(spark, job)
    text = err.value.last_failure
    assert "missing rank(s) [1]: last allreduce joined: rank 1 at epoch 1 batch 11" in text


def test_a_data_error_in_a_rank_is_not_relaunched(spark, adult_prep, tmp_path):
    """Unreadable training files fail the same way on every attempt: one attempt, not
    max_attempts, and the error names the file."""
    import shutil

    job, _ = recovery_job(adult_prep, tmp_path, (), "max_attempts=3")
    copy = tmp_path / "prep"
    shutil.copytree(job.data_root, copy)
    for f in (copy / "train").glob("*.parquet"):
        f.write_bytes(b"not parquet")
    with pytest.raises(TrainingFailed, match=r"after 1 attempt\(s\).*not relaunched") as err:
        launch(spark, replace(job, data_root=str(copy)))
    assert "DataError" in err.value.last_failure and "not a readable Parquet file" in err.value.last_failure
    assert list_checkpoints(tmp_path / "ckpt") == [], "nothing was trained"


def test_a_relaunch_at_a_smaller_world_size_sees_every_sample_once_per_epoch(
    spark, adult_prep, tmp_path, uninterrupted
):
    """Elastic resume: 2 ranks are killed mid-epoch 1 (after mid-epoch checkpoints), the relaunch
    has 1 rank. A mid-epoch position means nothing in the new cut of the rows, so it resumes at
    the newest epoch start (kept by the pruning), and each epoch trains on every row exactly once."""
    from sparkml_dist.errors import RankFailure
    from sparkml_dist.launch import TorchBackend, run_barrier
    from sparkml_dist.train.loop import train_rank

    job, rows = recovery_job(adult_prep, tmp_path, [Fault(rank=1, epoch=1, step=35)])
    with pytest.raises(RankFailure):
        run_barrier(spark, train_rank, job, 2, TorchBackend(timeout_s=60))
    names = [p.rsplit("/", 1)[-1] for p in list_checkpoints(tmp_path / "ckpt")]
    assert "ckpt-e00001-s0000000.pt" in names and names[-1] > "ckpt-e00001-s0000000.pt", (
        "the epoch start is kept beside the newer mid-epoch checkpoints"
    )
    chief = run_barrier(spark, train_rank, replace(job, attempt=1), 1, TorchBackend(timeout_s=60))[0]
    assert [r.epoch for r in chief.records] == list(range(EPOCHS))
    assert [r.samples for r in chief.records] == [rows] * EPOCHS, (
        "no sample skipped or seen twice in an epoch"
    )
    assert abs(held_out_accuracy(chief) - held_out_accuracy(uninterrupted)) <= 0.02


def test_fsdp_relaunched_at_a_smaller_world_size_reshards_the_epoch_start(
    spark, adult_prep, tmp_path, uninterrupted
):
    """The same under FSDP: the relaunch on 1 rank loads the 2-rank sharded checkpoint of the
    newest epoch start, resharded by DCP, and every epoch still sees every row once."""
    from sparkml_dist.errors import RankFailure
    from sparkml_dist.launch import TorchBackend, run_barrier
    from sparkml_dist.train.loop import train_rank

    fresh = TorchBackend(timeout_s=60, needs_fresh_process=True)
    job, rows = recovery_job(adult_prep, tmp_path, [Fault(rank=1, epoch=1, step=35)], "strategy=fsdp")
    with pytest.raises(RankFailure):
        run_barrier(spark, train_rank, job, 2, fresh)
    assert "ckpt-e00001-s0000000.dcp" in [p.rsplit("/", 1)[-1] for p in list_checkpoints(tmp_path / "ckpt")]
    chief = run_barrier(spark, train_rank, replace(job, attempt=1), 1, fresh)[0]
    assert [r.samples for r in chief.records] == [rows] * EPOCHS
    assert abs(held_out_accuracy(chief) - held_out_accuracy(uninterrupted)) <= 0.02
