"""The promotion gate: a candidate becomes champion only if it clears the bar on the gate's
metric (in that metric's direction) and beats the current champion on the same test rows."""

from __future__ import annotations

from dataclasses import dataclass

from sparkml_dist.config.schema import GateConfig
from sparkml_dist.tasks.base import Target


@dataclass(frozen=True)
class GateDecision:
    promote: bool
    reason: str


def decide(
    gate: GateConfig, target: Target, candidate: dict[str, float], champion: dict[str, float] | None
) -> GateDecision:
    task = target.kind
    name = gate.metric or task.default_gate[0]
    value = candidate[name]
    lower = task.metrics[name] == "lower"
    bound = gate.max_value if lower else gate.min_value
    strict = (
        False  # a configured bound may be met; the default (a constant prediction's score) must be beaten
    )
    if bound is None and name == task.default_gate[0]:
        bound, strict = task.default_bound(target), True
    if bound is not None:
        short = (
            value >= bound
            if lower and strict
            else value > bound
            if lower
            else value <= bound
            if strict
            else value < bound
        )
        if short:
            side = (
                "not below the gate's maximum"
                if lower and strict
                else "above the gate's maximum"
                if lower
                else "not above the gate's minimum"
                if strict
                else "below the gate's minimum"
            )
            return GateDecision(
                False,
                f"{name} {value:.4f} is {side} {bound:.4f}"
                + (" (what a constant prediction scores)" if strict else ""),
            )
    sign = ("<" if strict else "<=") if lower else (">" if strict else ">=")
    cleared = f"{name} {value:.4f} {sign} {bound:.4f}" if bound is not None else f"{name} {value:.4f}"
    if champion is None:
        return GateDecision(True, f"{cleared} and there is no champion yet")
    if gate.must_beat_champion and not task.better(name, value, champion[name]):
        return GateDecision(
            False,
            f"{name} {value:.4f} does not beat the champion's {champion[name]:.4f} on the same test data",
        )
    return GateDecision(True, f"{cleared} and beats the champion's {champion[name]:.4f}")
