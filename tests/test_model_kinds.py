"""A new model kind touches one place: a module with its two functions and one registration
(tests/toy_kind.py, the example in docs/architecture.md). Config validation, the spec, the
network and the methods' capability checks all read the registry entry, never the name."""

import pytest
import torch

from sparkml_dist import register_model_kind
from sparkml_dist.config import load_config
from sparkml_dist.errors import ConfigError
from sparkml_dist.models.kinds import MODEL_KINDS


@pytest.fixture
def toy_kind():
    import toy_kind

    register_model_kind(toy_kind.LINEAR, replace=True)
    yield toy_kind
    MODEL_KINDS.unregister("linear")


def test_a_registered_kind_validates_describes_and_builds(toy_kind, adult_config_path):
    from sparkml_dist.models.factory import build_model, model_spec
    from sparkml_dist.models.spec import ModelSpec

    cfg = load_config(adult_config_path, ["model.kind=linear"])
    spec = model_spec(cfg.model, 5, [f"c{i}" for i in range(5)], output_dim=3)
    assert spec.kind == "linear" and spec.input_dim == 5 and spec.output_dim == 3
    model = build_model(ModelSpec.from_json(spec.to_json()))  # as a rank or a scorer rebuilds it
    assert isinstance(model, toy_kind.Linear) and model(torch.zeros(4, 5)).shape == (4, 3)


def test_an_unknown_kind_names_the_registered_ones(toy_kind, adult_config_path):
    with pytest.raises(
        ConfigError, match=r"model.kind: unknown model kind 'resnet'; known: custom, linear, mlp"
    ):
        load_config(adult_config_path, ["model.kind=resnet"])


def test_the_methods_read_a_kinds_capabilities_not_its_name(toy_kind, adult_config_path):
    # tensor parallelism cuts a network into layers, which the linear kind says it cannot be
    with pytest.raises(ConfigError, match=r"for model.kind=linear; set model.kind=transformer"):
        load_config(adult_config_path, ["model.kind=linear", "train.strategy=tensor"])
    # model.factory belongs to kinds built from the user's code only
    with pytest.raises(ConfigError, match=r"model.factory and model.options are for model.kind=custom"):
        load_config(adult_config_path, ["model.kind=linear", "model.options={a: 1}"])
