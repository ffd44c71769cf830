"""Fine-tuning from the registry: adapters (unit), and the real job on Adult: a model trained
on everyone, fine-tuned on married women ("Wife"), gets better on them and not worse elsewhere."""

import os
import re

import pytest
import torch
from mlflow.tracking import MlflowClient

from sparkml_dist.errors import ConfigError
from sparkml_dist.models.factory import build_model
from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.train.adapters import AdaptSpec, apply_adapters, merge_adapters, trainable

SPEC = ModelSpec("mlp", 12, dropout=0.0, hidden=(16, 8))


def test_lora_starts_at_the_base_model_and_merges_back_to_its_names():
    torch.manual_seed(0)
    base = build_model(SPEC)
    x = torch.randn(32, 12)
    before = base(x).detach()
    names = set(base.state_dict())
    model = apply_adapters(build_model(SPEC), AdaptSpec(lora_rank=2))
    model.load_state_dict(
        {
            k.replace(".weight", ".base.weight").replace(".bias", ".base.bias"): v
            for k, v in base.state_dict().items()
        },
        strict=False,
    )
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

    rows = spark.createDataFrame([(30, "Wife"), (50, "Husband")], "age int, relationship string")
    assert select_rows(rows, "age < 40").count() == 1
    assert select_rows(rows, "age BETWEEN 20 AND 60 AND lower(relationship) IN ('wife')").count() == 1
    with pytest.raises(
        ConfigError, match="finetune.where: 'salary > 3' names 'salary', which is not a column"
    ):
        select_rows(rows, "salary > 3")
    with pytest.raises(ConfigError, match="is int, not boolean"):
        select_rows(rows, "age + 1")
    with pytest.raises(ConfigError, match='finetune.where: "relationship = \'Wife" does not parse'):
        select_rows(rows, "relationship = 'Wife")  # the quote left open


def test_a_where_predicate_names_the_label_as_the_source_does(spark):
    """Ingest renames the label column `label`; a user filters on the name their data gives it."""
    from sparkml_dist.stages.preprocess import select_rows

    rows = spark.createDataFrame([(30, "3"), (50, "8"), (40, "1")], "age int, label string")
    kept = select_rows(rows, "target IN (3, 8) AND age < 45", label_column="target")
    assert kept.columns == ["age", "label"] and [r["label"] for r in kept.collect()] == ["3"]
    assert select_rows(rows, "label = '1'", label_column="label").count() == 1


@pytest.mark.spark
@pytest.mark.parametrize(
    "where, refused",
    [
        ("age > (SELECT max(id) FROM range(10))", "contains a Subquery"),
        ("EXISTS (SELECT 1)", "calls exists()"),
        ("reflect('java.lang.System', 'exit', '1') IS NULL", "calls reflect()"),
        ("java_method('java.lang.Runtime', 'getRuntime') IS NULL", "calls java_method()"),
        ("input_file_name() LIKE '%'", "calls input_file_name()"),
        ("rand() < 0.5", "calls rand()"),
    ],
)
def test_a_where_predicate_may_not_reach_past_the_input_rows(spark, where, refused):
    from sparkml_dist.stages.preprocess import select_rows

    rows = spark.createDataFrame([(30, "Wife")], "age int, relationship string")
    with pytest.raises(ConfigError, match=re.escape(refused)):
        select_rows(rows, where)


@pytest.mark.spark
def test_the_checked_predicate_keeps_the_rows_sparks_own_reading_of_the_text_keeps(spark, adult_prep):
    """The predicate is parsed on the client (sqlglot, no JVM: it runs over Spark Connect too) and
    Spark evaluates the checked tree written back as Spark SQL: on the Adult training rows, each
    filter keeps exactly the rows Spark's own reading of the user's text keeps."""
    from pyspark.sql import functions as F

    from sparkml_dist.data.predicate import checked_predicate
    from sparkml_dist.data.sources import read_source, resolve_path

    cfg, _ = adult_prep
    raw = read_source(spark, resolve_path(cfg.data.train_path), cfg.data.train_path, cfg.data).rows
    rows = raw.select([c for c in raw.columns if not c.startswith("_")]).cache()
    filters = [
        "relationship = 'Wife' AND age BETWEEN 30 AND 50",
        "lower(trim(sex)) = 'female' OR `hours_per_week` > 60",
        "occupation IS NULL OR occupation LIKE '%Sales%'",
        "NOT (education IN ('Bachelors', 'Masters')) AND capital_gain % 1000 = 0",
        "CASE WHEN age < 25 THEN 'young' ELSE 'older' END = 'young' AND `native_country` <=> 'Mexico'",
        "substr(workclass, 1, 3) = 'Pri' AND round(fnlwgt / 1000.0, 1) > 200.5 -- big weights",
        "coalesce(marital_status, 'unknown') RLIKE '^Married' AND CAST(`education_num` AS DOUBLE) >= 13",
        "length(race) > 5 AND greatest(age, `hours_per_week`) = age AND race <> 'White'",
    ]
    for where in filters:
        ours = rows.where(checked_predicate(rows, where)).count()
        assert 0 < ours < 32_561, (where, ours)
        assert ours == rows.where(F.expr(where)).count(), where


def test_new_rows_to_fine_tune_on_are_read_as_the_model_was_trained(spark, tmp_path):
    """A model trained from Parquet, fine-tuned on JSON lines that carry a column it never saw:
    the new rows take the model's columns and types, the extra column is not a feature (else the
    test rows, which lack it, could not be read, and the schemas would differ)."""
    import json

    from pyspark.ml import PipelineModel

    from sparkml_dist.config import parse_config
    from sparkml_dist.stages import preprocess

    rows = [(float(i % 17), ["n", "s", "e"][i % 3], 3.0 * (i % 17) + (i % 3)) for i in range(300)]
    for name in ("train", "test"):
        spark.createDataFrame(rows, "size double, side string, price double").write.parquet(
            str(tmp_path / name)
        )
    cfg = parse_config(
        {
            "data": {
                "train_path": str(tmp_path / "train"),
                "test_path": str(tmp_path / "test"),
                "label": {"column": "price"},
            },
            "output": {"root": str(tmp_path / "out")},
        }
    )
    base = preprocess(spark, cfg)
    new_rows = tmp_path / "new.jsonl"
    new_rows.write_text(
        "".join(
            json.dumps({"size": i % 17, "side": "n", "price": 3.0 * (i % 17), "agent": "acme"}) + "\n"
            for i in range(60)
        )
    )
    again = cfg.with_overrides(f"data.train_path={new_rows}")
    fitted = PipelineModel.load(base.feature_pipeline)
    tuned = preprocess(spark, again, fitted=fitted, out=str(tmp_path / "ft"), trained_on=base.manifest.schema)
    assert tuned.manifest.schema == {**base.manifest.schema, "agent": "string/ignore"}, (
        "the model's columns and types, the column it never saw not a feature"
    )
    assert tuned.manifest.inputs["train"] == {"input": 60, "accepted": 60, "rejected": 0}


@pytest.fixture(scope="module")
def tuned(spark, module_adult_config):
    """A champion trained on everyone, then fine-tuned on married women ("Wife")."""
    from sparkml_dist.pipeline import run_pipeline
    from sparkml_dist.stages.finetune import finetune
    from sparkml_dist.tracking.client import tracked_run

    base = run_pipeline(spark, module_adult_config("train.epochs=3"))
    cfg = module_adult_config(
        "finetune.where=relationship = 'Wife'",
        "finetune.epochs=4",
        "finetune.learning_rate=0.0005",
        "finetune.max_original_drop=0.01",
    )
    with tracked_run(cfg.tracking, "finetune", cfg.flat_params()) as run:
        result = finetune(spark, cfg, run)
    return cfg, base, result


@pytest.mark.spark
@pytest.mark.slow
def test_finetune_from_the_champion_improves_the_subset_and_keeps_the_rest(spark, tuned):
    from sparkml_dist.stages.finetune import finetune
    from sparkml_dist.tracking.client import tracked_run

    cfg, base, result = tuned
    assert base.alias == "champion"
    before, after = result.base_metrics, result.metrics
    assert after["subset"]["log_loss"] < before["subset"]["log_loss"], "better on the rows it was tuned on"
    assert before["test"]["accuracy"] - after["test"]["accuracy"] <= 0.01, "and not much worse on everyone"
    assert result.parent_version == base.version and result.alias == "finetuned"
    client = MlflowClient(cfg.tracking.tracking_uri, registry_uri=cfg.tracking.tracking_uri)
    version = client.get_model_version(cfg.tracking.registered_model, result.version)
    assert version.tags["parent_version"] == base.version, "the new version names its parent"
    assert version.tags["finetune.where"] == "relationship = 'Wife'"
    assert (
        str(client.get_model_version_by_alias(cfg.tracking.registered_model, "champion").version)
        == base.version
    )

    # low-rank adapters from the same parent by version: merged back, scored like any model
    lora = cfg.model_copy(
        update={
            "finetune": cfg.finetune.model_copy(
                update={
                    "base_model": f"models:/{cfg.tracking.registered_model}/{base.version}",
                    "lora_rank": 4,
                    "learning_rate": 0.003,
                }
            )
        }
    )
    with tracked_run(lora.tracking, "finetune", lora.flat_params()) as run:
        adapted = finetune(spark, lora, run)
    assert adapted.metrics["subset"]["log_loss"] < adapted.base_metrics["subset"]["log_loss"]
    assert adapted.parent_version == base.version


@pytest.mark.spark
def test_an_empty_or_small_subset_is_named_and_nothing_is_registered(spark, tuned):
    """A clause that matches no row (the data says 'Female', the user wrote 'female') fails before
    training with the count and the values that occur; no version is registered."""
    from sparkml_dist.errors import DataError
    from sparkml_dist.stages.finetune import finetune
    from sparkml_dist.tracking.client import tracked_run

    cfg, _, _ = tuned
    client = MlflowClient(cfg.tracking.tracking_uri, registry_uri=cfg.tracking.tracking_uri)
    versions = {v.version for v in client.search_model_versions(f"name='{cfg.tracking.registered_model}'")}
    messages = {}
    for where in ("sex = 'female'", "age > 88"):
        narrow = cfg.with_overrides(f"finetune.where={where}")
        with (
            pytest.raises(DataError) as caught,
            tracked_run(narrow.tracking, "finetune", narrow.flat_params()) as run,
        ):
            finetune(spark, narrow, run)
        messages[where] = str(caught.value)
    assert messages["sex = 'female'"] == (
        "finetune.where \"sex = 'female'\" matched 0 of the 32,561 accepted rows of data.train_path, fewer than one "
        "batch (train.batch_size 256); sex is one of 'Male' (21,790), 'Female' (10,771). Widen the clause or lower "
        "train.batch_size."
    )
    assert messages["age > 88"].startswith("finetune.where 'age > 88' matched 43 of the 32,561"), (
        "a number names no values"
    )
    assert {
        v.version for v in client.search_model_versions(f"name='{cfg.tracking.registered_model}'")
    } == versions


def test_a_subset_with_no_test_rows_is_not_measured_rather_than_shown_as_zeros():
    from sparkml_dist.stages.finetune import FinetuneResult, result_lines

    test = {"accuracy": 0.85, "rows": 16281.0}
    lines = result_lines(
        FinetuneResult(
            "r1",
            "runs:/r1/model",
            "models:/m@champion",
            "1",
            "2",
            None,
            "why",
            {"test": test},
            {"test": test},
        )
    ).splitlines()
    assert lines[2] == "subset  before : no row of data.test_path matches finetune.where: not measured"
    assert lines[4] == "test    before : accuracy 0.8500"


def _submit(spark, cfg, delta_path, contributor):
    from sparkml_dist.stages.contribute import contribute
    from sparkml_dist.tracking.client import tracked_run

    with tracked_run(cfg.tracking, "contribute", cfg.flat_params()) as run:
        return contribute(spark, cfg, run, str(delta_path), contributor), run.run_id


@pytest.mark.spark
@pytest.mark.slow
def test_community_contributions_accepted_poisoned_and_regressing(spark, tuned, tmp_path):
    from sparkml_dist.community.deltas import save_delta
    from sparkml_dist.models.weights import state_dict_from_bytes
    from sparkml_dist.stages.contribute import write_delta
    from sparkml_dist.tracking.models import load_bundle

    cfg, base, result = tuned
    uri, name = cfg.tracking.tracking_uri, cfg.tracking.registered_model
    client = MlflowClient(uri, registry_uri=uri)
    versions_before = len(client.search_model_versions(f"name='{name}'"))
    honest = write_delta(f"models:/{name}@champion", result.model_uri, uri, tmp_path / "honest.pt")
    delta = torch.load(honest, weights_only=True)

    accepted, run_id = _submit(spark, cfg, honest, "alice")
    assert accepted.accepted, accepted.reason
    version = client.get_model_version(name, accepted.version)
    assert version.tags["parent_version"] == base.version and version.tags["contributor"] == "alice"
    assert version.tags["contribution.sha256"] == accepted.sha256
    merged = state_dict_from_bytes(load_bundle(f"models:/{name}/{accepted.version}", uri).weights)
    parent = state_dict_from_bytes(load_bundle(f"models:/{name}/{base.version}", uri).weights)
    assert all(torch.allclose(merged[k], parent[k] + delta[k], atol=1e-6) for k in parent), (
        "base + delta, exactly"
    )

    poisoned, run_id = _submit(
        spark, cfg, save_delta({k: v * 1e4 for k, v in delta.items()}, tmp_path / "big.pt"), "mallory"
    )
    assert not poisoned.accepted and "exceeds community.max_delta_norm" in poisoned.reason
    assert client.get_run(run_id).data.tags["contribution.status"] == "rejected"
    assert [a.path for a in client.list_artifacts(run_id)] == [], "nothing of a rejected delta is kept"

    oversize = tmp_path / "oversize.pt"
    oversize.write_bytes(b"\x80" + os.urandom(3 * 2**20))  # garbage: parsing it would say "unreadable"
    huge, _ = _submit(spark, cfg, oversize, "mallory")
    assert (
        not huge.accepted and "over the" in huge.reason and "cap" in huge.reason and "not read" in huge.reason
    )
    assert "unreadable" not in huge.reason
    named, _ = _submit(spark, cfg, honest, "alice; DROP TABLE")
    assert not named.accepted and "give a plain name" in named.reason

    # small, but it flips the output layer: within the norm bound, caught by the held-out check
    last = [k for k in parent if k.endswith("weight")][-1]
    flip = {k: (-2 * parent[k] if k == last else torch.zeros_like(v)) for k, v in parent.items()}
    regressing, run_id = _submit(spark, cfg, save_delta(flip, tmp_path / "flip.pt"), "eve")
    assert not regressing.accepted and "regression on held-out rows" in regressing.reason, regressing.reason
    run = client.get_run(run_id).data
    assert (
        run.tags["contribution.reason"] == regressing.reason and run.tags["contribution.contributor"] == "eve"
    )
    assert run.tags["contribution.contributor_verified"] == "false", (
        "a name given on the command line is a claim"
    )
    assert re.search(r"about -\d\.\d\d\)$", regressing.reason), regressing.reason
    assert not re.search(r"\d\.\d{4}", regressing.reason), (
        "only a coarse change: no tuning against held-out rows"
    )
    assert [a.path for a in client.list_artifacts(run_id)] == [], "no model of a rejected merge"

    wrong = save_delta({**delta, last: torch.zeros(3, 3)}, tmp_path / "shape.pt")
    misshapen, _ = _submit(spark, cfg, wrong, "bob")
    assert not misshapen.accepted and f"{last}: shape (3, 3)" in misshapen.reason
    assert len(client.search_model_versions(f"name='{name}'")) == versions_before + 1, (
        "rejected contributions never become versions"
    )
