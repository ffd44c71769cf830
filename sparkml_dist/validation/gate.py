"""The promotion gate: a candidate becomes champion only if it clears the configured bar and
beats the current champion on the same test data."""

from __future__ import annotations

from dataclasses import dataclass

from sparkml_dist.config.schema import GateConfig


@dataclass(frozen=True)
class GateDecision:
    promote: bool
    reason: str


def decide(gate: GateConfig, candidate: dict[str, float], champion: dict[str, float] | None) -> GateDecision:
    name = gate.metric
    value = candidate[name]
    if value < gate.min_value:
        return GateDecision(False, f"{name} {value:.4f} is below the gate's minimum {gate.min_value:.4f}")
    if champion is None:
        return GateDecision(True, f"{name} {value:.4f} >= {gate.min_value:.4f} and there is no champion yet")
    if gate.must_beat_champion and value <= champion[name]:
        return GateDecision(False, f"{name} {value:.4f} does not beat the champion's {champion[name]:.4f} on the same test data")
    return GateDecision(True, f"{name} {value:.4f} >= {gate.min_value:.4f} and beats the champion's {champion[name]:.4f}")
