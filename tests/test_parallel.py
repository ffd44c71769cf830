"""Model-parallel strategies in the barrier stage (real gloo ranks on local Spark):
each matches one-process training step for step, holds ~1/N of the parameters, resumes
from sharded checkpoints at another world size, and trains Adult to its bar on the test file."""

import functools

import pytest
from stores import fresh_store
from test_training import job_for

from bench.probe import Probe, probe_rank, reference_losses
from sparkml_dist.errors import RankFailure
from sparkml_dist.launch import TorchBackend, run_barrier
from sparkml_dist.models.spec import ModelSpec, TransformerShape
from sparkml_dist.models.transformer import token_layout
from sparkml_dist.train.checkpoint import list_checkpoints
from sparkml_dist.train.loop import train_rank

pytestmark = pytest.mark.spark

# 4 numeric slots and 3 one-hot columns: 7 tokens (+ [CLS])
NAMES = [f"_num_scaled_{i}" for i in range(4)] + [f"c{j}__onehot_{v}" for j in range(3) for v in range(4)]
SPEC = ModelSpec(
    "transformer",
    len(NAMES),
    dropout=0.0,
    transformer=TransformerShape(tuple(token_layout(NAMES)), d_model=32, heads=4, layers=2, mlp_hidden=128),
)
# float32 with different reduction orders: the loss may differ in the last digits, never more
LOSS_RTOL = 1e-4

# the launcher forks a fresh process per model-parallel rank (the model-parallel methods ask for it too)
FRESH = TorchBackend(timeout_s=120, needs_fresh_process=True)

STRATEGIES = [
    ("ddp", 2, {}),
    ("fsdp", 2, {}),
    ("fsdp", 4, {}),
    ("tensor", 2, {}),
    ("hybrid", 4, {}),
    ("pipeline", 2, {"schedule": "1f1b"}),
    ("pipeline", 2, {"schedule": "gpipe"}),
]


@pytest.mark.parametrize(
    "strategy,ranks,options",
    STRATEGIES,
    ids=lambda v: str(v) if not isinstance(v, dict) else v.get("schedule", ""),
)
def test_strategy_matches_one_process_training_step_for_step(spark, strategy, ranks, options):
    probe = Probe(SPEC, strategy=strategy, steps=8, global_batch=64, **options)
    expected = reference_losses(probe)
    results = run_barrier(spark, probe_rank, probe, ranks, FRESH)
    for result in results:  # every rank agrees on the global loss of every step
        assert result.losses == pytest.approx(expected, rel=LOSS_RTOL)
    assert expected[-1] < expected[0], "the reference itself learns"

    full = results[0].full_param_bytes
    held = [r.param_bytes for r in results]
    if strategy == "ddp":
        assert held == [full] * ranks
    else:
        # each rank holds about 1/N (tensor parallelism keeps norms, the value embedding
        # and the head replicated; a pipeline stage split is uneven by the embedding/head)
        assert max(held) <= full / ranks * 1.15, f"{strategy}: per-rank parameter bytes {held} of {full}"
        if strategy in ("fsdp", "pipeline"):
            assert sum(held) == full, "the shards partition the model"


def transformer_job(cfg, prep, ckpt, kind="transformer", *train):
    return job_for(cfg.with_overrides(f"model.kind={kind}"), prep, ckpt, *train)


@pytest.mark.parametrize("kind", ["transformer", "mlp"])
def test_sharded_checkpoint_resumes_at_another_world_size(spark, adult_prep, tmp_path, kind):
    cfg, prep = adult_prep
    ckpt = tmp_path / "ckpt"
    job = functools.partial(transformer_job, cfg, prep, ckpt, kind, "strategy=fsdp")
    first = run_barrier(spark, train_rank, job("epochs=1", "learning_rate=0.002"), 2, FRESH)
    saved = list_checkpoints(ckpt)
    assert saved and saved[-1].endswith(".dcp") and (ckpt / saved[-1].rsplit("/", 1)[-1]).is_dir(), (
        "a DCP directory per checkpoint"
    )

    # 4 ranks load the 2-rank shards: nothing left to train, so the gathered weights are the saved ones
    reloaded = run_barrier(spark, train_rank, job("epochs=1"), 4, FRESH)
    assert reloaded[0].full_checksum == first[0].full_checksum
    assert reloaded[0].records == first[0].records

    # and training goes on at 4 ranks from there, optimizer state included
    more = run_barrier(spark, train_rank, job("epochs=2", "learning_rate=0.002"), 4, FRESH)
    records = more[0].records
    assert [r.epoch for r in records] == [0, 1]
    assert records[1].train_loss < records[0].train_loss
    assert records[1].samples == prep.manifest.splits["train"].rows, "every row once per epoch at 4 ranks"


def test_a_sharded_checkpoint_this_job_did_not_sign_is_refused_unread(spark, adult_prep, tmp_path):
    """dcp.load unpickles a checkpoint's .metadata: a changed or planted checkpoint never gets that far."""
    cfg, prep = adult_prep
    ckpt = tmp_path / "ckpt"
    job = functools.partial(transformer_job, cfg, prep, ckpt, "mlp", "strategy=fsdp")
    run_barrier(spark, train_rank, job("epochs=1"), 2, FRESH)
    latest = ckpt / list_checkpoints(ckpt)[-1].rsplit("/", 1)[-1]
    assert (latest / "SIGNATURE").is_file()
    with open(latest / ".metadata", "ab") as fh:
        fh.write(b"\x00")  # one byte changed: the HMAC over every file no longer matches
    with pytest.raises(
        RankFailure, match="not signed by this job's checkpoint key \\(a wrong signature\\)"
    ) as err:
        run_barrier(spark, train_rank, job("epochs=2"), 2, FRESH)
    assert {r.exc_type for r in err.value.reports} == {"UntrustedCheckpoint"}
    assert not err.value.retryable, "a relaunch would meet the same checkpoint"


@pytest.mark.slow
@pytest.mark.parametrize("strategy,ranks", [("fsdp", 2), ("tensor", 2), ("pipeline", 2), ("hybrid", 4)])
def test_adult_train_stage_with_each_strategy_reaches_the_bar_on_test(
    spark, adult_prep, tmp_path, strategy, ranks
):
    """The train stage (logged model with its feature pipeline) on the shared preprocessed splits, then
    the evaluate stage over the raw test file through the scoring UDF."""
    from sparkml_dist.stages import evaluate, train
    from sparkml_dist.tracking.client import tracked_run

    base, prep = adult_prep
    cfg = base.with_overrides(
        "model.kind=transformer",
        f"train.strategy={strategy}",
        f"train.num_ranks={ranks}",
        "train.epochs=2",
        "train.learning_rate=0.002",
        f"output.root={tmp_path / 'out'}",
        f"tracking.tracking_uri={fresh_store(tmp_path)}",
    )
    with tracked_run(cfg.tracking, "train", cfg.flat_params()) as run:
        trained = train(spark, cfg, prep, run)
        report = evaluate(spark, cfg, trained.model_uri, run.tracking_uri)
    assert report.metrics["accuracy"] >= 0.84  # the same bar as the MLP
    assert report.metrics["rows"] == 16281, "the exported full state_dict scores every test row in the UDF"
    assert trained.outcome.method == strategy and len(trained.outcome.ranks) == ranks
