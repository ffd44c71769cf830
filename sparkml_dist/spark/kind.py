"""Which kind of session a job has: a classic one (a SparkContext and the driver's JVM in this
process) or a Spark Connect client's (neither: Databricks serverless, shared clusters, Databricks
Connect). No imports: code that only asks (rank code, model loading) stays free of pyspark."""

from __future__ import annotations


def is_connect(session) -> bool:
    """Whether `session` is a Spark Connect client's (no sparkContext, no JVM on this side)."""
    return session is not None and type(session).__module__.startswith("pyspark.sql.connect")


def session_master(spark) -> str:
    """The master the session's work runs on (`local[*]`, `spark://...`); on Spark Connect, the
    server's, or "" when the server does not say."""
    if is_connect(spark):
        return str(spark.conf.get("spark.master", "") or "")
    return str(spark.sparkContext.master)


def runs_in_this_process(spark) -> bool:
    """Whether the session's executors run on this host as this process's own (local mode, classic
    or a local Connect server's), so they read the files this process has on its local disk."""
    return session_master(spark).startswith("local")
