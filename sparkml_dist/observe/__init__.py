"""What a run costs and where its time goes: the step-time breakdown (`steps`), per-rank system
metrics under MLflow's `system/` names (`system`), and energy by NVML, RAPL or a stated estimate
(`energy`). Rank code owns a `RankMonitor` (`monitor`); the records carry what it measured."""
