"""Prediction without Spark: the scoring-time output layer gives the training-time numbers, and
each task's prediction columns are what they claim to be."""

import numpy as np
import pytest
import torch

from sparkml_dist.inference.predict import ModelCache, network_outputs, predict
from sparkml_dist.models.factory import build_model
from sparkml_dist.models.spec import ModelSpec, TransformerShape
from sparkml_dist.models.weights import state_dict_to_bytes
from sparkml_dist.tasks.base import Target

SPECS = {
    "mlp, 10 classes": ModelSpec("mlp", 12, 0.0, (32,), output_dim=10),
    "transformer, 6 classes": ModelSpec("transformer", 12, 0.0, (), TransformerShape(tuple(range(12)), 16, 2, 1, 32),
                                        output_dim=6),
    "mlp, 1 output": ModelSpec("mlp", 12, 0.0, (32,)),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_the_cached_scoring_model_gives_the_trained_models_outputs(name):
    spec = SPECS[name]
    torch.manual_seed(0)
    trained = build_model(spec).eval()
    cached = ModelCache().get("k", spec, lambda: state_dict_to_bytes(trained.state_dict()))
    x = np.random.default_rng(0).normal(size=(1000, 12)).astype(np.float32)
    expected = network_outputs(trained, x)
    assert network_outputs(cached, x).shape == expected.shape
    np.testing.assert_allclose(network_outputs(cached, x), expected, rtol=1e-5, atol=1e-6)


def test_multiclass_predictions_are_a_distribution_and_its_best_class():
    target = Target("multiclass", tuple("abcdefghij"))
    logits = np.random.default_rng(1).normal(scale=4.0, size=(500, 10)).astype(np.float32)
    out = predict(lambda x: x, target, logits)  # an identity "model": the logits are its outputs
    reference = torch.softmax(torch.from_numpy(logits).double(), dim=1).numpy()
    np.testing.assert_allclose(out["probabilities"], reference, atol=1e-6)
    assert (out["prediction"] == reference.argmax(axis=1)).all()
    np.testing.assert_allclose(out["probability"], reference.max(axis=1), atol=1e-6)


def test_compact_rows_scored_in_dense_chunks_give_the_dense_rows_predictions():
    """Scoring workers keep a wide layout's rows compact and make `batch_rows` of them dense at a
    time (inference/udf.py): the predictions are those of the whole dense batch."""
    import pyarrow as pa

    from sparkml_dist.data.layout import ONEHOT, VALUE, FeatureBlock, FeatureLayout

    layout = FeatureLayout((FeatureBlock("x", VALUE, 1), FeatureBlock("city", ONEHOT, 11)))
    rng = np.random.default_rng(2)
    rows = pa.table({"x": pa.array(rng.normal(size=1001).astype(np.float32)),
                     "city": pa.array(rng.integers(0, 11, 1001, dtype=np.int32))})
    torch.manual_seed(0)
    model = build_model(ModelSpec("mlp", 12, 0.0, (32,), output_dim=10)).eval()
    target = Target("multiclass", tuple("abcdefghij"))
    whole = predict(model, target, layout.to_dense(rows))
    chunked = predict(model, target, layout.compact(rows), 64, expand=layout.expand)
    np.testing.assert_allclose(chunked["probabilities"], whole["probabilities"], rtol=1e-5, atol=1e-6)
    assert (chunked["prediction"] == whole["prediction"]).all()
