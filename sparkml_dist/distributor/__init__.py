"""Your own torch training code on Spark: `TorchDistributor` (a drop-in for pyspark's), DataFrame-fed
ranks (`dataframe_loader`) and what a rank knows about its launch (`launch_info`)."""
