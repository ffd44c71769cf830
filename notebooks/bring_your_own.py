# Databricks notebook source
# MAGIC %md
# MAGIC # Bring your own: your torch code, your DataFrame, your network
# MAGIC
# MAGIC 1. Your training function on 2 ranks with `sparkml_dist.TorchDistributor` — the same call as
# MAGIC    pyspark's `TorchDistributor`, run here under both.
# MAGIC 2. The same function fed by a Spark DataFrame (`run_on_dataframe` + `dataframe_loader`).
# MAGIC 3. Your own network in the pipeline (`model.kind: custom`).
# MAGIC
# MAGIC Run as a script by the tests: `SPARKML_DIST_OUTPUT`, `MLFLOW_TRACKING_URI` set where it writes.

# COMMAND ----------

import os
import sys
import time

sys.path.insert(0, os.getcwd())  # the repository root, for examples.my_nets (Jupyter and Databricks do this)

import sparkml_dist as sd
from sparkml_dist.config import SparkConfig

spark = sd.build_session(SparkConfig(master="local[2]", app_name="bring-your-own"))
spark.sparkContext.setLogLevel("ERROR")
print(f"Spark {spark.version}, master {spark.sparkContext.master}")

# COMMAND ----------

# MAGIC %md ## 1. Your training function, as you would write it for torchrun


# COMMAND ----------


def train(learning_rate, epochs=10, batch_size=32):
    import torch
    import torch.distributed as dist
    from sklearn.datasets import load_breast_cancer
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT come from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = load_breast_cancer(return_X_y=True)
    x = torch.tensor((x - x.mean(0)) / x.std(0), dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.float32)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(30, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    mine = torch.arange(rank, len(x), world)
    for epoch in range(epochs):
        order = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(epoch))]
        for step in range(len(x) // world // batch_size):
            batch = order[step * batch_size:(step + 1) * batch_size]
            optimizer.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x[batch]).squeeze(-1), y[batch])
            loss.backward()
            optimizer.step()
        if epoch % 3 == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
    with torch.no_grad():
        accuracy = ((model(x).squeeze(-1) > 0).float() == y).float().mean().item()
    weights = [p.detach().clone() for p in model.module.parameters()]
    dist.destroy_process_group()
    return accuracy, weights


start = time.perf_counter()
accuracy, ours = sd.TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, 0.2)
print(f"sparkml_dist.TorchDistributor: accuracy {accuracy:.4f} in {time.perf_counter() - start:.1f} s")

# COMMAND ----------

# MAGIC %md The same function, the same arguments, under pyspark's own `TorchDistributor` (torchrun in each task):

# COMMAND ----------

from pyspark.ml.torch.distributor import TorchDistributor

start = time.perf_counter()
accuracy, theirs = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, 0.2)
print(f"pyspark TorchDistributor:      accuracy {accuracy:.4f} in {time.perf_counter() - start:.1f} s")
difference = max((a - b).abs().max().item() for a, b in zip(ours, theirs))
print(f"largest difference between the two runs' final weights: {difference:.1e}")

# COMMAND ----------

# MAGIC %md A rank that fails raises one `RankFailure` naming the rank, its exception, traceback and last output:

# COMMAND ----------


def fails_on_rank_1():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print(f"rank {dist.get_rank()} loading its shard")
    dist.barrier()  # both ranks have started (and said so) before rank 1 finds its shard missing
    if dist.get_rank() == 1:
        raise FileNotFoundError("/data/shard-1.parquet")
    dist.barrier()


try:
    sd.TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(fails_on_rank_1)
except sd.RankFailure as failure:
    print("\n".join(str(failure).splitlines()[:3]))

# COMMAND ----------

# MAGIC %md ## 2. Fed by a DataFrame: no files written, every rank the same number of steps

# COMMAND ----------

from pyspark.ml.feature import VectorAssembler
from sklearn.datasets import load_breast_cancer

data = load_breast_cancer(as_frame=True).frame.rename(columns=lambda c: c.replace(" ", "_"))
features = [c for c in data.columns if c != "target"]
rows = spark.createDataFrame(data)
df = VectorAssembler(inputCols=features, outputCol="features").transform(rows).select("features", "target")


def train_on_rows(learning_rate, epochs=10):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import sparkml_dist as sd

    dist.init_process_group("gloo")
    loader = sd.dataframe_loader(batch_size=32, label="target")  # this rank's share, as (x, y) tensors
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.BatchNorm1d(30), torch.nn.Linear(30, 16),
                                                        torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    steps, correct, seen = 0, 0, 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)  # a new shuffle each epoch
        for x, y in loader:
            optimizer.zero_grad()
            logits = model(x).squeeze(-1)
            torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float()).backward()
            optimizer.step()
            steps += 1
            if epoch == epochs - 1:
                correct += ((logits > 0).long() == y).sum().item()
                seen += len(y)
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, (loader.num_rows, steps))
    dist.destroy_process_group()
    return correct / seen, counts


accuracy, counts = sd.TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run_on_dataframe(
    train_on_rows, df, 0.1)
print(f"DataFrame-fed: last-epoch training accuracy {accuracy:.4f}; (rows, steps) per rank {counts}")

# COMMAND ----------

# MAGIC %md ## 3. Your own network in the pipeline

# COMMAND ----------

from sparkml_dist.pipeline import run_pipeline

output = os.environ.get("SPARKML_DIST_OUTPUT", "output/bring_your_own")
cfg = sd.load_config("conf/adult.yaml", [
    "model.kind=custom", "model.factory=examples.my_nets:wide_and_deep", "model.options={deep: [64, 32]}",
    "train.epochs=3", f"output.root={output}", "tracking.registered_model=adult_wide_and_deep"])
summary = run_pipeline(spark, cfg)
print(f"pipeline with your network: test accuracy {summary.test_metrics['accuracy']:.4f}; registered version "
      f"{summary.version}"
      f" as '{summary.alias}'; {summary.rows['scored']:,} rows scored")
