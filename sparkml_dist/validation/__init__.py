"""Metrics as Spark aggregations, and the promotion gate."""
