"""The promotion gate follows the task: any metric the task reports, in its direction, with a
default bound a constant prediction cannot pass."""

from sparkml_dist.config import GateConfig
from sparkml_dist.tasks import Target
from sparkml_dist.validation.gate import decide

BINARY = Target("binary", ("no", "yes"))
ACCURACY = GateConfig(metric="accuracy", min_value=0.84)


def test_below_minimum_is_refused():
    d = decide(ACCURACY, BINARY, {"accuracy": 0.80}, None)
    assert not d.promote and "below the gate's minimum 0.8400" in d.reason


def test_first_model_over_the_bar_becomes_champion():
    assert decide(ACCURACY, BINARY, {"accuracy": 0.85}, None).promote


def test_must_beat_the_champion_on_the_same_data():
    d = decide(ACCURACY, BINARY, {"accuracy": 0.850}, {"accuracy": 0.855})
    assert not d.promote and "does not beat the champion's 0.8550" in d.reason
    assert decide(ACCURACY, BINARY, {"accuracy": 0.86}, {"accuracy": 0.855}).promote


def test_other_metric_and_no_champion_comparison():
    gate = GateConfig(metric="roc_auc", min_value=0.5, must_beat_champion=False)
    assert decide(gate, BINARY, {"roc_auc": 0.6}, {"roc_auc": 0.9}).promote


def test_lower_is_better_for_rmse_and_log_loss():
    regression = Target("regression", mean=10.0, std=2.0)
    gate = GateConfig(metric="rmse", max_value=1.5)
    assert not decide(gate, regression, {"rmse": 1.6}, None).promote
    assert decide(gate, regression, {"rmse": 1.2}, {"rmse": 1.3}).promote, "lower beats the champion"
    d = decide(gate, regression, {"rmse": 1.4}, {"rmse": 1.3})
    assert not d.promote and "does not beat the champion's 1.3000" in d.reason
    assert decide(
        GateConfig(metric="log_loss", max_value=0.4), BINARY, {"log_loss": 0.3}, {"log_loss": 0.35}
    ).promote


def test_the_default_gate_is_better_than_a_constant_prediction_for_each_task():
    default = GateConfig()
    assert not decide(default, BINARY, {"roc_auc": 0.5}, None).promote  # a constant scores 0.5
    assert decide(default, BINARY, {"roc_auc": 0.51}, None).promote
    assert not decide(default, Target("regression"), {"r2": -0.1}, None).promote  # the mean scores 0
    three = Target("multiclass", ("a", "b", "c"), counts=(600, 300, 100))
    d = decide(default, three, {"accuracy": 0.55}, None)
    assert not d.promote and "not above the gate's minimum 0.6000 (what a constant prediction" in d.reason
    assert decide(default, three, {"accuracy": 0.7}, None).promote
