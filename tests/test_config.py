import pytest

from sparkml_dist.config import apply_overrides, load_config, parse_config
from sparkml_dist.errors import ConfigError


def test_adult_config_loads_and_overrides_apply(adult_config_path):
    cfg = load_config(adult_config_path, ["train.epochs=3", "train.learning_rate=0.01", "model.hidden=[32]"])
    assert cfg.train.epochs == 3
    assert cfg.train.learning_rate == 0.01
    assert cfg.model.hidden == [32]
    assert cfg.data.label.positive == ">50K"
    assert cfg.flat_params()["train.epochs"] == "3"


@pytest.mark.parametrize("override, key, words", [
    ("train.epochz=3", "train.epochz", "unknown key"),
    ("train.epochs=three", "train.epochs", "integer"),
    ("train.epochs=0", "train.epochs", "greater than or equal to 1"),
    ("train.backend=mpi", "train.backend", "'torch' or 'horovod'"),
    ("data.validation_fraction=0.9", "data.validation_fraction", "less than 0.5"),
])
def test_config_errors_name_the_key_and_the_problem(adult_config_path, override, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(adult_config_path, [override])
    text = str(err.value)
    assert f"  {key}:" in text
    assert words in text
    assert "adult.yaml" in text


def test_set_needs_key_equals_value():
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["train.epochs"])


def test_set_into_a_value_is_refused():
    with pytest.raises(ConfigError, match="'train.epochs' is a value, not a section"):
        apply_overrides({"train": {"epochs": 3}}, ["train.epochs.x=1"])


def test_label_column_must_match_the_label_role():
    raw = {"data": {"train_path": "a", "test_path": "b",
                    "columns": [{"name": "x", "type": "int", "role": "numeric"},
                                {"name": "y", "type": "string", "role": "label"}],
                    "label": {"column": "z", "positive": "1", "negative": "0"}}}
    with pytest.raises(ConfigError, match="role 'label'"):
        parse_config(raw)


def test_missing_config_file_says_how_to_pass_one(tmp_path):
    with pytest.raises(ConfigError, match="--config"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("overrides, words", [
    (["train.strategy=tensor"], "set model.kind=transformer"),
    (["model.kind=transformer", "train.strategy=hybrid", "train.num_ranks=3"], "4 ranks as 2x2"),
    (["model.kind=transformer", "train.strategy=pipeline", "train.num_ranks=4"], "model.transformer.layers (2) must be >= train.num_ranks (4)"),
    (["model.kind=transformer", "train.strategy=pipeline", "train.parallel.microbatches=3"], "divisible by train.parallel.microbatches"),
    (["model.kind=transformer", "model.transformer.heads=3"], "model.transformer.d_model (32) must be divisible"),
    (["train.backend=horovod", "train.strategy=fsdp"], "Horovod does data parallelism only"),
    (["train.strategy=federated"], "needs federated.client_column"),
    (["federated.client_column=zipcode"], "federated.client_column 'zipcode' is not one of data.columns"),
    (["federated.noise_multiplier=1.0"], "needs federated.clip_norm"),
    (["train.strategy=async", "train.num_ranks=1"], "must exceed train.async_ps.servers"),
])
def test_impossible_parallel_layouts_are_refused_with_the_keys_to_change(adult_config_path, overrides, words):
    with pytest.raises(ConfigError) as err:
        load_config(adult_config_path, overrides)
    assert words in str(err.value)
