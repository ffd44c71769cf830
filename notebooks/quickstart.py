# Databricks notebook source
# MAGIC %md
# MAGIC # sparkml_dist quickstart
# MAGIC
# MAGIC The Adult income pipeline, one stage per cell: preprocess → train (2 ranks, barrier mode) →
# MAGIC evaluate → register → score. The same functions the `spark-submit` jobs call.
# MAGIC
# MAGIC Parameters come from the environment so the test suite can run this notebook as a script:
# MAGIC `SPARKML_DIST_CONFIG`, `SPARKML_DIST_OUTPUT`, `SPARKML_DIST_EPOCHS`, `MLFLOW_TRACKING_URI`.

# COMMAND ----------

import json
import os

from sparkml_dist.config import load_config
from sparkml_dist.spark import build_session

overrides = [f"output.root={os.environ.get('SPARKML_DIST_OUTPUT', 'output/notebook')}"]
if os.environ.get("SPARKML_DIST_EPOCHS"):
    overrides.append(f"train.epochs={os.environ['SPARKML_DIST_EPOCHS']}")
cfg = load_config(os.environ.get("SPARKML_DIST_CONFIG", "conf/adult.yaml"), overrides)
spark = build_session(cfg.spark)  # on Databricks this returns the notebook's session
print(f"Spark {spark.version}, master {spark.sparkContext.master}")

# COMMAND ----------

# MAGIC %md ## 1. Preprocess: raw CSV → quarantined rejects + features → Parquet for N ranks

# COMMAND ----------

from sparkml_dist.stages import preprocess

prep = preprocess(spark, cfg)
print(json.dumps(prep.manifest.inputs, indent=1))
print(f"feature width {prep.manifest.feature_dim}; rows per split:",
      {name: split.rows for name, split in prep.manifest.splits.items()})

# COMMAND ----------

# MAGIC %md ## 2. Train: 2 ranks in one Spark barrier stage (torch.distributed DDP)

# COMMAND ----------

from sparkml_dist.stages import train
from sparkml_dist.tracking.client import end_run, start_run

run = start_run(cfg.tracking, "notebook", cfg.flat_params(), tags={"sparkml_dist.stage": "notebook"})
trained = train(spark, cfg, prep, run)
for r in trained.records:
    print(f"epoch {r.epoch + 1}: train_loss {r.train_loss:.4f} val_{r.evaluation.metric} {r.evaluation.value:.4f}")
print("ranks ended with identical parameters:", trained.ranks_in_step)

# COMMAND ----------

from sparkml_dist.storage.paths import OutputPaths

plots = OutputPaths.of(cfg).plots
try:  # show the plot inline in Jupyter / Databricks; plain scripts print the path
    from IPython.display import Image, display

    display(Image(filename=f"{plots}/loss_curves.png"))
except ImportError:
    print("loss curves:", f"{plots}/loss_curves.png")

# COMMAND ----------

# MAGIC %md ## 3. Evaluate on the official test file, 4. register through the gate, 5. score

# COMMAND ----------

from sparkml_dist.stages import evaluate, log_report, register, score

report = evaluate(spark, cfg, trained.model_uri, run.tracking_uri)
log_report(run, report, cfg, step=trained.records[-1].epoch)
decision = register(spark, cfg, run, trained.model_uri, report)
scored = score(spark, cfg)
end_run(run, ok=True)
summary = {
    "run_id": run.run_id,
    "test_metrics": report.metrics,
    "registered": f"{decision.name} v{decision.version} -> {decision.alias} ({decision.reason})",
    "scored_rows": scored.scored_rows,
    "rejected_rows": scored.rejected_rows,
    "predictions": scored.path,
}
print(json.dumps(summary, indent=1))
from sparkml_dist import storage

storage.write_json(OutputPaths.of(cfg).under("notebook_summary.json"), summary)
