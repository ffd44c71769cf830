"""What a training run cost, from its epoch records: energy (by which method) and where each
rank's step time went; logged on the run and printed in the pipeline's summary."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sparkml_dist.observe.steps import PHASES
from sparkml_dist.train.records import EpochRecord, TrainOutcome

_METHODS = {"estimate": "estimated from CPU time", "rapl": "measured by RAPL", "nvml": "measured by NVML"}


@dataclass(frozen=True)
class RunCost:
    joules: float  # every rank, every epoch (nan: not measured)
    method: str  # observe.energy: e.g. "estimate", "rapl", "nvml+rapl"
    samples: int  # rows trained on, all epochs
    per_rank_joules: Mapping[int, float] = field(default_factory=dict)
    steps_ms: Mapping[int, Mapping[str, float]] = field(default_factory=dict)  # the last epoch's means

    @staticmethod
    def of_outcome(outcome: TrainOutcome) -> RunCost:
        return RunCost.of(outcome.records, outcome.epochs_per_record)

    @staticmethod
    def of(records: Sequence[EpochRecord], epochs_per_record: int = 1) -> RunCost:
        """`epochs_per_record`: how many epochs each record's rows were trained for (async: all)."""
        per_rank: dict[int, float] = {}
        for record in records:
            for r in record.per_rank:
                per_rank[r.rank] = per_rank.get(r.rank, 0.0) + r.joules
        joules = sum(per_rank.values()) if per_rank else math.nan
        methods = sorted({record.energy_method for record in records if record.energy_method})
        last = records[-1].per_rank if records else ()
        return RunCost(
            joules,
            ", ".join(methods),
            sum(r.samples for r in records) * epochs_per_record,
            per_rank,
            {r.rank: dict(r.phases_ms) for r in last if r.phases_ms},
        )

    @property
    def measured(self) -> bool:
        return not math.isnan(self.joules)

    @property
    def joules_per_sample(self) -> float:
        return self.joules / self.samples if self.samples else math.nan

    def metrics(self) -> dict[str, float]:
        if not self.measured:
            return {}
        return {"energy_joules_total": self.joules, "energy_joules_per_sample": self.joules_per_sample}

    def energy_line(self) -> str:
        if not self.measured:
            return "not measured by this training method"
        how = " and ".join(_METHODS.get(m, m) for part in self.method.split(", ") for m in part.split("+"))
        return f"{self.joules:,.1f} J ({how}), {self.joules_per_sample:.3g} J per training sample"

    def time_line(self) -> str:
        """Each rank's mean step in the last epoch and its parts, in the order the step runs them."""
        if not self.steps_ms:
            return "not broken down (observe.step_breakdown off, or a method without steps)"
        parts = []
        for rank, ms in sorted(self.steps_ms.items()):
            total = ms.get("total", math.nan)
            shares = " ".join(f"{p} {100 * ms[p] / total:.0f}%" for p in PHASES if p in ms and total > 0)
            parts.append(f"rank{rank} {total:.2f} ms = {shares}")
        untimed = any("comm" not in ms for ms in self.steps_ms.values())
        return "; ".join(parts) + (
            " (comm runs inside compute under this method: not timed apart)" if untimed else ""
        )
