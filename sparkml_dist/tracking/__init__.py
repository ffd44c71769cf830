"""MLflow tracking with an explicit run handle (never the fluent active-run stack)."""

from sparkml_dist.tracking.client import RankTracker, RunHandle, end_run, resolve_tracking_uri, start_run

__all__ = ["RankTracker", "RunHandle", "end_run", "resolve_tracking_uri", "start_run"]
