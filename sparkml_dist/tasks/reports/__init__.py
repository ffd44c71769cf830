"""Each task's test report over scored rows, aggregated by Spark: the metrics a task owns, its
plots and tables. A task imports its report where it makes one (`Task.report`): pyspark stays out
of reading a config, which chooses a task."""
