"""`model.kind: custom`: the user's own network (tests/user_code/nets.py) through the pipeline, and the
errors a bad factory gets before any rank starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sparkml_dist.errors import ConfigError, UserCodeError
from sparkml_dist.pipeline import run_pipeline
from sparkml_dist.stages import train
from sparkml_dist.tracking.client import tracked_run

pytestmark = [pytest.mark.spark]
FACTORY = "user_code.nets:residual_mlp"


def test_custom_network_trains_registers_and_scores(spark, make_adult_config):
    cfg = make_adult_config(
        "model.kind=custom",
        f"model.factory={FACTORY}",
        "model.options={width: 48, blocks: 2}",
        "train.epochs=3",
    )
    summary = run_pipeline(spark, cfg)
    assert summary.test_metrics["accuracy"] >= 0.84  # C4.5's 84.46% bar on Adult, as the built-in models meet
    assert summary.alias == "champion"
    assert summary.rows["scored"] == 16281
    client = MlflowClient(cfg.tracking.tracking_uri)
    spec = json.loads(
        Path(client.download_artifacts(summary.run_id, "model/artifacts/spec.json")).read_text()
    )
    assert spec["kind"] == "custom" and spec["custom"]["factory"] == FACTORY
    assert spec["custom"]["options"] == {"width": 48, "blocks": 2}
    code = {a.path for a in client.list_artifacts(summary.run_id, "model/code/user_code")}
    assert "model/code/user_code/nets.py" in code, "the factory's package travels with the model"


def test_bad_factories_are_refused_before_any_rank_starts(spark, adult_prep, make_adult_config):
    _, prep = adult_prep
    cases = {
        "user_code.missing_module:build": "cannot import user_code.missing_module",
        "user_code.nets:no_such_function": "has no no_such_function",
        "user_code.nets:wrong_shape": r"must map \[rows, \d+\] to \[rows\], it returned \(2, 3\)",
        "user_code.nets:not_a_module": "returned str, not a torch.nn.Module",
    }
    for factory, message in cases.items():
        cfg = make_adult_config("model.kind=custom", f"model.factory={factory}", "train.epochs=1")
        with tracked_run(cfg.tracking, "train", {}) as run, pytest.raises(UserCodeError, match=message):
            train(spark, cfg, prep, run)


def test_custom_config_errors_name_the_key(make_adult_config):
    with pytest.raises(ConfigError, match="model.kind=custom needs model.factory"):
        make_adult_config("model.kind=custom")
    with pytest.raises(ConfigError, match="model.factory"):
        make_adult_config("model.kind=custom", "model.factory=not a reference")
    with pytest.raises(ConfigError, match="cannot do for model.kind=custom"):
        make_adult_config("model.kind=custom", f"model.factory={FACTORY}", "train.strategy=tensor")
