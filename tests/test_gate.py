from sparkml_dist.config import GateConfig
from sparkml_dist.validation.gate import decide


def test_below_minimum_is_refused():
    d = decide(GateConfig(min_value=0.84), {"accuracy": 0.80}, None)
    assert not d.promote and "below the gate's minimum 0.8400" in d.reason


def test_first_model_over_the_bar_becomes_champion():
    assert decide(GateConfig(min_value=0.84), {"accuracy": 0.85}, None).promote


def test_must_beat_the_champion_on_the_same_data():
    gate = GateConfig(min_value=0.84)
    d = decide(gate, {"accuracy": 0.850}, {"accuracy": 0.855})
    assert not d.promote and "does not beat the champion's 0.8550" in d.reason
    assert decide(gate, {"accuracy": 0.86}, {"accuracy": 0.855}).promote


def test_other_metric_and_no_champion_comparison():
    gate = GateConfig(metric="roc_auc", min_value=0.5, must_beat_champion=False)
    assert decide(gate, {"roc_auc": 0.6}, {"roc_auc": 0.9}).promote
