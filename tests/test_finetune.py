"""Fine-tuning from the registry: adapters (unit), and the real job on Adult: a model trained
on everyone, fine-tuned on married women ("Wife"), gets better on them and not worse elsewhere."""

import pytest
import torch
from mlflow.tracking import MlflowClient

from sparkml_dist.errors import ConfigError
from sparkml_dist.models.factory import build_model
from sparkml_dist.train.adapters import AdaptSpec, apply_adapters, merge_adapters, trainable

SPEC = {"kind": "mlp", "input_dim": 12, "hidden": [16, 8], "dropout": 0.0}


def test_lora_starts_at_the_base_model_and_merges_back_to_its_names():
    torch.manual_seed(0)
    base = build_model(SPEC)
    x = torch.randn(32, 12)
    before = base(x).detach()
    names = set(base.state_dict())
    model = apply_adapters(build_model(SPEC), AdaptSpec(lora_rank=2))
    model.load_state_dict({k.replace(".weight", ".base.weight").replace(".bias", ".base.bias"): v
                           for k, v in base.state_dict().items()}, strict=False)
    assert torch.allclose(model(x), before), "B = 0: training starts exactly at the base model"
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad), "only adapters train"
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_b" in n:
                p.normal_()
    adapted = model(x).detach()
    merged = merge_adapters(model)
    assert set(merged.state_dict()) == names, "the exported model has the base model's parameter names"
    assert torch.allclose(merged(x), adapted, atol=1e-5)


def test_freezing_by_prefix_and_its_errors():
    model = apply_adapters(build_model(SPEC), AdaptSpec(freeze=("net.0",)))
    assert {n for n, p in model.named_parameters() if not p.requires_grad} == {"net.0.weight", "net.0.bias"}
    assert len(trainable(model.parameters())) == 4
    with pytest.raises(ValueError, match=r"no parameter starts with \['encoder'\]"):
        apply_adapters(build_model(SPEC), AdaptSpec(freeze=("encoder",)))
    with pytest.raises(ValueError, match="every parameter is frozen"):
        apply_adapters(build_model(SPEC), AdaptSpec(freeze=("net",)))


@pytest.mark.spark
def test_a_bad_where_predicate_names_the_key(spark):
    from sparkml_dist.stages.preprocess import select_rows

    rows = spark.createDataFrame([(30, "Wife")], "age int, relationship string")
    assert select_rows(rows, "age < 40").count() == 1
    with pytest.raises(ConfigError, match="finetune.where: 'salary > 3'"):
        select_rows(rows, "salary > 3")


@pytest.mark.spark
@pytest.mark.slow
def test_finetune_from_the_champion_improves_the_subset_and_keeps_the_rest(spark, make_adult_config):
    from sparkml_dist.pipeline import run_pipeline
    from sparkml_dist.stages.finetune import finetune
    from sparkml_dist.tracking.client import tracked_run

    base = run_pipeline(spark, make_adult_config("train.epochs=3"))
    assert base.alias == "champion"
    cfg = make_adult_config("finetune.where=relationship = 'Wife'", "finetune.epochs=4",
                            "finetune.learning_rate=0.0005", "finetune.max_original_drop=0.01")
    with tracked_run(cfg.tracking, "finetune", cfg.flat_params()) as run:
        result = finetune(spark, cfg, run)

    before, after = result.base_metrics, result.metrics
    assert after["subset"]["log_loss"] < before["subset"]["log_loss"], "better on the rows it was tuned on"
    assert before["test"]["accuracy"] - after["test"]["accuracy"] <= 0.01, "and not much worse on everyone"
    assert result.parent_version == base.version and result.alias == "finetuned"
    client = MlflowClient(cfg.tracking.tracking_uri, registry_uri=cfg.tracking.tracking_uri)
    version = client.get_model_version(cfg.tracking.registered_model, result.version)
    assert version.tags["parent_version"] == base.version, "the new version names its parent"
    assert version.tags["finetune.where"] == "relationship = 'Wife'"
    assert str(client.get_model_version_by_alias(cfg.tracking.registered_model, "champion").version) == base.version

    # low-rank adapters from the same parent by version: merged back, scored like any model
    lora = cfg.model_copy(update={"finetune": cfg.finetune.model_copy(update={
        "base_model": f"models:/{cfg.tracking.registered_model}/{base.version}", "lora_rank": 4,
        "learning_rate": 0.003})})
    with tracked_run(lora.tracking, "finetune", lora.flat_params()) as run:
        adapted = finetune(spark, lora, run)
    assert adapted.metrics["subset"]["log_loss"] < adapted.base_metrics["subset"]["log_loss"]
    assert adapted.parent_version == base.version
