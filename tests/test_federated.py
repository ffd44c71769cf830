"""Federated learning on Adult with a natural client key (occupation: 15 clients from 9 to
4,140 rows, positive rates from 0.01 to 0.48): real Spark partitions, one per client."""

import os

import numpy as np
import pytest
import torch
from cryptography.exceptions import InvalidTag

from sparkml_dist.methods.federated import privacy, secure
from sparkml_dist.methods.federated.server import ReceivedLog, UnexpectedPayload


def masked_round(updates: list[np.ndarray], salt: bytes):
    """Each client's key pair, sealed and unsealed as the two passes do, and its masked words."""
    keys = {i: secure.new_key() for i in range(len(updates))}
    digests = {i: secure.rows_digest(np.full(3, i, np.float32)) for i in keys}
    sealed = {i: secure.seal(k, digests[i], salt) for i, k in keys.items()}
    publics = {i: secure.public_bytes(k) for i, k in keys.items()}
    opened = {i: secure.unseal(sealed[i], digests[i], salt) for i in keys}
    return publics, [
        secure.masked(i, opened[i], publics, salt, secure.quantise(u, len(updates)))
        for i, u in enumerate(updates)
    ]


def test_the_masked_sum_equals_the_plain_sum_exactly_in_the_ring():
    rng = np.random.default_rng(0)
    updates = [rng.normal(0, 50, 1000) for _ in range(5)]
    _, masked = masked_round(updates, os.urandom(16))
    ring = sum(masked[1:], masked[0])
    plain = sum((secure.quantise(u, 5) for u in updates[1:]), secure.quantise(updates[0], 5))
    assert np.array_equal(ring, plain), "the masks cancel exactly in integers"
    error = np.abs(secure.dequantise(ring) - np.sum(updates, axis=0)).max()
    assert error <= 5 * 2.0 ** -(secure.FRACTION_BITS + 1), "rounding error within 2^-(F+1) per client"
    for words, update in zip(masked, updates):
        alone = secure.dequantise(words)
        assert np.abs(alone).mean() > 1e9, "one masked update alone is uniform noise over the ring"
        # independent of the update: r has a standard deviation of 1/sqrt(1000) ~ 0.032, so 0.2 is
        # 6 sigma (a false alarm about once in 10^9 runs; 0.1 was 3 sigma, about once in 120 runs)
        assert abs(np.corrcoef(alone, update)[0, 1]) < 0.2


def test_keys_and_dp_noise_are_fresh_each_run_on_the_same_data():
    updates = [np.ones(8), np.ones(8)]
    first, masked_1 = masked_round(updates, os.urandom(16))
    second, masked_2 = masked_round(updates, os.urandom(16))
    assert first[0] != second[0] and first[1] != second[1], "a fresh X25519 key pair per client per round"
    assert not np.array_equal(masked_1[0], masked_2[0])
    assert not torch.equal(privacy.gaussian((1000,), 1.0), privacy.gaussian((1000,), 1.0))
    noise = privacy.gaussian((200_000,), 2.0)
    assert abs(float(noise.mean())) < 0.02 and abs(float(noise.std()) - 2.0) < 0.02


def test_a_sealed_key_opens_only_with_its_own_rows_and_round_salt():
    salt, key = os.urandom(16), secure.new_key()
    sealed = secure.seal(key, secure.rows_digest(np.arange(4.0)), salt)
    with pytest.raises(InvalidTag):
        secure.unseal(sealed, secure.rows_digest(np.arange(5.0)), salt)
    with pytest.raises(InvalidTag):
        secure.unseal(sealed, secure.rows_digest(np.arange(4.0)), os.urandom(16))


def test_an_update_too_large_for_the_ring_names_the_fix():
    with pytest.raises(secure.QuantisationOverflow, match="federated.clip_norm"):
        secure.quantise(np.array([1e12]), 10)


def test_a_client_that_drops_out_after_the_key_exchange_fails_the_round_with_its_reason():
    from sparkml_dist.methods.federated.server import FederatedRoundError, _check_every_keyed_client_answered

    publics = {0: b"a", 3: b"b", 5: b"c"}
    _check_every_keyed_client_answered(publics, [{"client": c} for c in publics], 2)
    with pytest.raises(
        FederatedRoundError,
        match=r"round 3: client\(s\) \[5\] took part in the key exchange but "
        r"sent no masked update.*no dropout recovery.*resumes at this round",
    ):
        _check_every_keyed_client_answered(publics, [{"client": 0}, {"client": 3}], 2)


def test_the_accountant_reports_epsilon_that_grows_with_rounds_and_shrinks_with_noise():
    one = privacy.epsilon([privacy.RoundNoise(0.5, 1.0)], 1e-5)
    ten = privacy.epsilon([privacy.RoundNoise(0.5, 1.0)] * 10, 1e-5)
    quieter = privacy.epsilon([privacy.RoundNoise(0.5, 2.0)] * 10, 1e-5)
    assert 0 < one < ten and quieter < ten
    assert privacy.effective_multiplier(1.0, [10, 10, 10]) == pytest.approx(1.0)
    assert privacy.effective_multiplier(1.0, [100, 1, 1]) < 0.6, "a heavy client is less hidden"


def test_the_driver_refuses_anything_but_parameter_shaped_updates():
    log = ReceivedLog({"w": (2, 3)})
    log.check(
        {
            "client": 0,
            "samples": 5,
            "update": {"w": torch.zeros(2, 3)},
            "late": False,
            "norm": 0.0,
            "clipped": False,
        }
    )
    with pytest.raises(UnexpectedPayload, match="unexpected fields \\['rows'\\]"):
        log.check({"client": 1, "samples": 5, "rows": [[1.0, 2.0]]})
    with pytest.raises(UnexpectedPayload, match="not shaped like the model's parameters"):
        log.check({"client": 2, "samples": 5, "update": {"w": torch.zeros(7, 3)}})
    with pytest.raises(UnexpectedPayload, match="6 ring words"):
        log.check({"client": 3, "samples": 5, "masked": np.zeros(7, np.uint64)})


@pytest.mark.spark
def test_a_round_runs_one_task_per_sampled_client_and_no_other(spark):
    """A task for a client that is not sampled would leave its rows unread, and pyspark starts a
    new Python worker (which imports torch again) after such a task: a round ran 3-4x slower."""
    from sparkml_dist.methods.federated.placement import on_partitions

    sc = spark.sparkContext
    clients = sc.parallelize(range(40), 8)  # 8 clients of 5 rows
    sc.setJobGroup("federated-round", "one round")
    try:
        out = on_partitions(
            spark, clients, (1, 5, 6), lambda index, rows, task: (index, len(list(rows)), task), "t"
        )
    finally:
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            sc.setLocalProperty(key, None)
    assert out == [(1, 5, "t"), (5, 5, "t"), (6, 5, "t")], "each sampled client's rows, in sampled order"
    tracker = sc.statusTracker()
    stages = [
        s for job in tracker.getJobIdsForGroup("federated-round") for s in tracker.getJobInfo(job).stageIds
    ]
    assert sum(tracker.getStageInfo(s).numTasks for s in stages) == 3


def centralized_accuracy(adult_prep, tmp_path, epochs: int) -> float:
    """The same MLP trained on all rows in one process, scored on the same test rows."""

    from test_training import ONE_RANK, job_for

    from sparkml_dist.data.loader import read_split
    from sparkml_dist.models.factory import build_model
    from sparkml_dist.models.weights import state_dict_from_bytes
    from sparkml_dist.train.loop import train_rank

    cfg, prep = adult_prep
    job = job_for(cfg, prep, tmp_path / "central", f"epochs={epochs}")
    result = train_rank(ONE_RANK, job)
    model = build_model(job.model_spec)
    model.load_state_dict(state_dict_from_bytes(result.weights))
    x, y = read_split(prep.path, "test")
    with torch.no_grad():
        return float(((model(torch.tensor(x)) > 0).numpy() == (y > 0.5)).mean())


def run(spark, cfg, slow_clients=None):
    """The federated method through the train stage's own logging (as the `federated` job runs it)."""
    from sparkml_dist.methods import TrainRequest, get_method
    from sparkml_dist.stages.train import record_outcome
    from sparkml_dist.tracking.client import EpochLogger, tracked_run

    with tracked_run(cfg.tracking, "federated", cfg.flat_params()) as handle:
        request = TrainRequest(spark, cfg, None, "", sink=EpochLogger(handle))
        trained = record_outcome(handle, cfg, get_method("federated").run(request, slow_clients=slow_clients))
        return trained, trained.outcome.detail, handle.run_id


@pytest.mark.spark
@pytest.mark.slow
def test_fedavg_over_occupations_comes_within_2pc_of_centralized(
    spark, make_adult_config, adult_prep, tmp_path
):
    from mlflow.tracking import MlflowClient

    cfg = make_adult_config("federated.client_column=occupation", "federated.rounds=5")
    trained, result, run_id = run(spark, cfg)
    central = centralized_accuracy(adult_prep, tmp_path, epochs=3)
    assert result.score >= central - 0.02, f"federated {result.score:.4f} vs centralized {central:.4f}"

    sizes = np.array(list(result.clients.values()))
    assert len(sizes) == 15 and sizes.sum() == 32561, "every training row belongs to exactly one client"
    assert sizes.max() / sizes.min() > 100, "strongly unequal clients"
    # 15 clients x 5 rounds, and nothing but parameter-shaped updates ever reached the driver
    assert result.received.payloads == 75
    history = MlflowClient(cfg.tracking.tracking_uri).get_metric_history(run_id, "test_accuracy")
    assert [m.step for m in history] == [0, 1, 2, 3, 4], (
        "each round measured on the driver's test rows, named so"
    )
    assert all(r.evaluation.rows == "test" for r in result.records)
    assert [r.role for r in trained.outcome.ranks] == ["client"] * 15
    # the logged model carries its feature pipeline: the Spark UDF scores raw test rows with it
    from sparkml_dist.stages.evaluate import evaluate

    scored = evaluate(spark, cfg, trained.model_uri, cfg.tracking.tracking_uri).metrics
    assert scored["accuracy"] == pytest.approx(result.score, abs=1e-3)


@pytest.mark.spark
@pytest.mark.slow
def test_secure_aggregation_with_a_late_client_clipping_noise_and_fedprox(spark, make_adult_config):
    from mlflow.tracking import MlflowClient

    # the slow client's 4,140 rows, 65 batches of 64 at 0.25 s each, take over 16 s, far past the
    # 8 s budget; the largest other client has as many batches without the sleep, and room to be
    # slowed by another test worker without being late too
    cfg = make_adult_config(
        "federated.client_column=occupation",
        "federated.rounds=3",
        "federated.secure_aggregation=true",
        "federated.algorithm=fedprox",
        "federated.clip_norm=2.0",
        "federated.noise_multiplier=0.05",
        "federated.round_timeout_s=8",
        "federated.client_fraction=0.8",
    )
    _, result, run_id = run(spark, cfg, slow_clients={"Prof-specialty": 0.25})
    late = [r.counters["late"] for r in result.records]
    sampled_slow = sum(1 for r in result.records if r.counters["late"])
    assert sum(late) == sampled_slow >= 1, "the slow client is dropped from the rounds it was sampled for"
    assert result.score > 0.80, "masks cancel: the sum of masked updates is the real update"
    assert result.received.largest_value > 1e6, "no single masked update says what it is"
    run_data = MlflowClient(cfg.tracking.tracking_uri).get_run(run_id).data
    params = run_data.params
    assert params["federated.noise_multiplier"] == "0.05" and params["federated.clip_norm"] == "2.0"
    spent = [r.counters["dp_epsilon"] for r in result.records]
    assert spent == sorted(spent) and spent[0] > 0, "the accountant's epsilon grows with each released round"
    assert run_data.metrics["dp_epsilon"] == pytest.approx(spent[-1])


@pytest.mark.spark
@pytest.mark.slow
def test_federated_is_a_train_strategy_of_the_same_pipeline(spark, make_adult_config):
    from mlflow.tracking import MlflowClient

    from sparkml_dist.pipeline import run_pipeline

    cfg = make_adult_config(
        "train.strategy=federated", "federated.client_column=occupation", "federated.rounds=4"
    )
    summary = run_pipeline(spark, cfg)
    assert summary.test_metrics["accuracy"] >= 0.84
    assert summary.rows["scored"] == 16281 and summary.alias == "champion"
    losses = MlflowClient(cfg.tracking.tracking_uri).get_metric_history(summary.run_id, "train_loss")
    assert len(losses) == 4 and losses[-1].value < losses[0].value, (
        "the clients' local loss falls round by round"
    )


@pytest.mark.spark
@pytest.mark.slow
def test_a_rerun_after_the_driver_died_resumes_at_the_next_round(spark, make_adult_config):
    """The driver dies after round 1 of 3 (here: the round sink raises, as a crash would stop it).
    Running the job again resumes at round 2 with the saved model, records and client sampler, and
    ends where an uninterrupted run ends; the round checkpoints are removed once it finishes."""
    from sparkml_dist import storage
    from sparkml_dist.methods.federated.checkpoints import rounds_dir
    from sparkml_dist.methods.federated.server import run_federated

    cfg = make_adult_config(
        "federated.client_column=occupation", "federated.rounds=3", "federated.client_fraction=0.6"
    )

    class DriverDied(Exception):
        pass

    def dies_after_round_1(record):
        if record.epoch == 0:
            raise DriverDied()

    with pytest.raises(DriverDied):
        run_federated(spark, cfg, sink=dies_after_round_1)
    assert storage.exists(rounds_dir(cfg))
    seen = []
    resumed = run_federated(spark, cfg, sink=lambda record: seen.append(record.epoch))
    assert seen == [1, 2], "only the rounds the dead driver had not finished"
    assert [r.epoch for r in resumed.records] == [0, 1, 2]
    uninterrupted = run_federated(spark, cfg)  # the checkpoints were cleared: a fresh run
    assert [r.evaluation.value for r in resumed.records] == pytest.approx(
        [r.evaluation.value for r in uninterrupted.records], abs=2e-3
    ), "the same rounds as without the crash"
    assert resumed.received.payloads == uninterrupted.received.payloads
    assert not storage.list_files(rounds_dir(cfg))


@pytest.mark.spark
def test_clients_and_the_drivers_test_rows_hold_a_wide_category_compactly(spark, tmp_path):
    """2,000 cities are 2,001 one-hot slots but one column: clients keep (age, x, city) per row
    and the driver's test rows likewise, made dense a batch at a time. Before, the test rows were
    collected as dense vectors (nycflights13's 7,492 slots ran the driver out of heap) and every
    client row was a Python list of every slot. The dense rows and the evaluation are Spark ML's."""
    from test_ingest import COLUMNS

    from sparkml_dist.config import parse_config
    from sparkml_dist.data.features import build_feature_pipeline, to_feature_frame
    from sparkml_dist.data.ingest import ingest
    from sparkml_dist.data.labels import encode_labels, fit_target
    from sparkml_dist.data.loader import features_to_numpy
    from sparkml_dist.data.sources import schema_of
    from sparkml_dist.methods.federated.server import (
        HeldOut,
        _test_arrays,
        client_partitions,
        evaluate_arrays,
    )
    from sparkml_dist.models.factory import build_model, model_spec

    rng = np.random.default_rng(3)
    path = tmp_path / "rows.csv"
    path.write_text(
        "".join(
            f"{30 + i % 4}, {rng.normal():.3f}, city{i * 7 % 2000}, {'yes' if i % 3 else 'no'}\n"
            for i in range(4000)
        )
    )
    cfg = parse_config(
        {
            "data": {
                "train_path": str(path),
                "test_path": str(path),
                "columns": COLUMNS,
                "label": {"column": "y", "positive": "yes", "negative": "no"},
            }
        }
    )
    with ingest(spark, str(path), cfg.data) as rows_in:
        target = fit_target(cfg, rows_in.data, rows_in.accepted)
        rows = encode_labels(rows_in.accepted, target, rows_in.data).known
        pipeline = build_feature_pipeline(rows_in.data, cfg.features).fit(rows)
        clients, rdd, layout = client_partitions(pipeline, rows, "age")
        try:
            client_rows = [row for part in rdd.glom().collect() for row in part]
        finally:
            rdd.unpersist()
        test = _test_arrays(spark, cfg, pipeline, target, schema_of(rows_in.data))
        spark_ml = features_to_numpy(to_feature_frame(pipeline, rows).toArrow().column("features"))
    assert layout is not None and layout.dim == 2 + 2001 and len(layout.blocks) == 3, (
        "2,000 cities and one unseen"
    )
    assert sorted(clients.values()) == [1000] * 4 and {len(r[0]) for r in client_rows} == {3}
    assert test.x.shape == (4000, 3)
    dense = layout.expand(test.x)
    by_row = lambda m: m[np.lexsort(m.T[::-1])]  # noqa: E731 - the same rows, in one order
    np.testing.assert_allclose(by_row(dense), by_row(spark_ml), atol=1e-6)
    spec = model_spec(cfg.model, layout.dim, [f"f{i}" for i in range(layout.dim)], 1, None)
    torch.manual_seed(0)
    state = build_model(spec).state_dict()
    compact = evaluate_arrays(spec, state, test, target, batch_rows=512)
    assert compact.value == pytest.approx(
        evaluate_arrays(spec, state, HeldOut(dense, test.y), target).value, abs=1e-6
    )
