"""Prediction without Spark: the scoring-time output layer gives the training-time numbers, and
each task's prediction columns are what they claim to be."""

import numpy as np
import pytest
import torch

from sparkml_dist.inference.predict import (
    FORWARD_CHUNK_BYTES,
    ModelCache,
    forward_rows,
    network_outputs,
    predict,
)
from sparkml_dist.models.factory import build_model
from sparkml_dist.models.spec import ModelSpec, TransformerShape
from sparkml_dist.models.weights import state_dict_to_bytes
from sparkml_dist.tasks.base import Target

SPECS = {
    "mlp, 10 classes": ModelSpec("mlp", 12, 0.0, (32,), output_dim=10),
    "transformer, 6 classes": ModelSpec(
        "transformer", 12, 0.0, (), TransformerShape(tuple(range(12)), 16, 2, 1, 32), output_dim=6
    ),
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
    rows = pa.table(
        {
            "x": pa.array(rng.normal(size=1001).astype(np.float32)),
            "city": pa.array(rng.integers(0, 11, 1001, dtype=np.int32)),
        }
    )
    torch.manual_seed(0)
    model = build_model(ModelSpec("mlp", 12, 0.0, (32,), output_dim=10)).eval()
    target = Target("multiclass", tuple("abcdefghij"))
    whole = predict(model, target, layout.to_dense(rows))
    chunked = predict(model, target, layout.compact(rows), 64, layout=layout)
    np.testing.assert_allclose(chunked["probabilities"], whole["probabilities"], rtol=1e-5, atol=1e-6)
    assert (chunked["prediction"] == whole["prediction"]).all()


@pytest.mark.parametrize(
    "spec",
    [
        ModelSpec("mlp", 12, 0.0, (2048, 64)),
        ModelSpec(
            "transformer", 12, 0.0, (), TransformerShape(tuple(range(12)), 32, 4, 1, 256), output_dim=3
        ),
    ],
    ids=["wide mlp", "transformer"],
)
def test_a_wide_model_scores_in_cache_sized_chunks_with_the_whole_batchs_outputs(spec):
    """A model whose activations for a whole batch would spill from cache runs the batch in
    smaller forward calls (scoring a 1024-wide MLP took a quarter less time): the outputs are
    those of one call over the whole batch."""
    torch.manual_seed(0)
    model = build_model(spec).eval()
    rows = forward_rows(model, 65536)
    assert rows < 4096 and rows & (rows - 1) == 0  # a power of two
    assert rows * 4 * model.activation_floats_per_row() <= FORWARD_CHUNK_BYTES
    x = np.random.default_rng(3).normal(size=(3 * rows + 5, spec.input_dim)).astype(np.float32)
    with torch.inference_mode():
        whole = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(network_outputs(model, x), whole, rtol=1e-5, atol=1e-5)


def test_a_model_that_does_not_say_its_width_runs_the_batch_as_asked():
    """A custom network has no `activation_floats_per_row`: scoring keeps the rows it asks for,
    and a narrow MLP's whole 10,000-row Arrow batch stays one call (smaller calls were slower)."""
    assert forward_rows(torch.nn.Linear(12, 1), 65536) == 65536
    assert forward_rows(build_model(ModelSpec("mlp", 32, 0.0, (64,))), 65536) >= 10_000
    assert forward_rows(build_model(ModelSpec("mlp", 32, 0.0, (64,))), 100) == 100


def test_the_transformers_token_for_a_wide_one_hot_column_is_its_hot_slots_vector_without_a_slots_by_width_tensor():
    """A one-hot block of 7,492 slots is one token: the hot slot's vector plus the token's own.
    The embedding computes it as one product per block; the elementwise form it replaced made a
    [batch, slots, width] tensor (245 MB at batch 256, width 32) every step."""
    from torch.profiler import ProfilerActivity, profile

    from sparkml_dist.models.transformer import TokenEmbedding

    torch.manual_seed(0)
    embed = TokenEmbedding([0, 1] + [2] * 7492, 32)
    hot = torch.arange(256) * 29 % 7492
    x = torch.zeros(256, 7494)
    x[:, 0], x[:, 1] = torch.linspace(-2, 2, 256), 0.5
    x[torch.arange(256), 2 + hot] = 1.0
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        tokens = embed(x)
        tokens.sum().backward()
    table = embed.tokens.weight.detach()
    values = embed.values.detach()
    torch.testing.assert_close(tokens[:, 0], table[0].expand(256, 32), msg="[CLS] is its table row alone")
    torch.testing.assert_close(tokens[:, 1], x[:, :1] * values[0] + table[1])
    torch.testing.assert_close(tokens[:, 2], (0.5 * values[1] + table[2]).expand(256, 32))
    torch.testing.assert_close(tokens[:, 3], values[2 + hot] + table[3])
    largest = max(event.cpu_memory_usage for event in prof.events())
    assert largest < 8 * 2**20, f"one op allocated {largest / 2**20:.0f} MiB"
