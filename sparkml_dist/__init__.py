"""sparkml_dist: the distributed ML lifecycle on Apache Spark.

Stages (`preprocess`, `train`, `evaluate`, `register`, `score`) are plain functions
`stage(spark, cfg) -> artifact reference`; jobs, notebooks and the CLI call the same ones.
"""

__version__ = "0.1.0"
