"""Ingest, features, the Parquet dataset writer and the rank-side streaming loader."""
