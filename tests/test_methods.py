"""A new training method touches one place: a module outside the package registers one (local
SGD, tests/toy_method.py) and the whole pipeline runs it: its own config keys validated at load,
trained in the barrier stage, logged, evaluated, registered through the gate and scored."""

import pytest
from mlflow.tracking import MlflowClient

from sparkml_dist.config import TRAIN_METHODS, load_config
from sparkml_dist.errors import ConfigError


@pytest.fixture
def toy_method():
    import toy_method

    from sparkml_dist import register_method

    register_method(toy_method.LOCAL_SGD, replace=True)
    yield toy_method
    TRAIN_METHODS.unregister("local_sgd")


def test_a_registered_method_brings_its_own_validated_keys(toy_method, adult_config_path):
    cfg = load_config(adult_config_path, ["train.strategy=local_sgd", "train.average_every=4"])
    assert type(cfg.train) is toy_method.LocalSgdConfig and cfg.train.average_every == 4
    with pytest.raises(ConfigError, match=r"train.average_every: Input should be greater than or equal to 1"):
        load_config(adult_config_path, ["train.strategy=local_sgd", "train.average_every=0"])
    with pytest.raises(ConfigError, match=r"train.average_every: unknown key"):
        load_config(adult_config_path, ["train.average_every=4"])  # not a key of ddp


def test_a_method_whose_config_does_not_name_it_is_refused(toy_method):
    from sparkml_dist import LoopMethod, register_method

    with pytest.raises(TypeError, match="must declare strategy: Literal\\['averaging'\\]"):
        register_method(LoopMethod("averaging", toy_method.LocalSgdConfig, toy_method.place_local_sgd))


@pytest.mark.spark
@pytest.mark.slow
def test_a_method_registered_outside_the_package_runs_through_the_pipeline(
    spark, toy_method, make_adult_config
):
    from sparkml_dist import run_pipeline

    cfg = make_adult_config("train.strategy=local_sgd", "train.average_every=4", "train.epochs=4")
    summary = run_pipeline(spark, cfg)
    assert summary.test_metrics["accuracy"] >= 0.84, "the same bar as DDP on Adult"
    assert summary.rows["scored"] == 16281 and summary.alias == "champion"
    run = MlflowClient(cfg.tracking.tracking_uri).get_run(summary.run_id)
    assert run.data.tags["sparkml_dist.method"] == "local_sgd"
    assert run.data.params["train.average_every"] == "4", "its own key is logged with the run"
    history = MlflowClient(cfg.tracking.tracking_uri).get_metric_history(summary.run_id, "val_accuracy")
    assert [m.step for m in history] == [0, 1, 2, 3], (
        "its epochs take the same logging path as every method's"
    )


@pytest.mark.parametrize(
    "overrides, ranks, backend, fresh",
    [
        ([], 2, "torch", False),
        (["train.backend=horovod"], 2, "horovod", True),
        (["train.strategy=fsdp", "train.num_ranks=4"], 4, "torch", True),
        (["train.strategy=async", "train.num_ranks=3"], 3, "torch", False),
        (["train.strategy=federated", "federated.client_column=occupation"], 0, "torch", False),
    ],
)
def test_each_method_says_what_it_needs_from_the_launcher(
    adult_config_path, overrides, ranks, backend, fresh
):
    from sparkml_dist.methods import get_method

    cfg = load_config(adult_config_path, overrides)
    needs = get_method(cfg.train.strategy).needs(cfg.train)
    assert (needs.ranks, needs.backend, needs.fresh_process) == (ranks, backend, fresh)
    if ranks:
        made = needs.make_backend(cfg.train.device, cfg.train.timeout_s)
        assert made.name == backend and made.needs_fresh_process == fresh
