"""Continuous scoring with Structured Streaming: a streaming source with batch ingest's checks
(`source`), the registry alias followed between micro-batches (`follow`), idempotent per-batch
outputs (`sink`) and per-batch progress into logs and MLflow (`progress`). The stage that joins
them is `stages.stream`."""
