"""Spark Connect (issue 53, its first part, for the TorchDistributor API): the session Databricks
serverless notebooks, shared clusters and Databricks Connect hand a user has no SparkContext and
no JVM on the client. `sparkml_dist.TorchDistributor` runs there as on a classic session: a local
Connect server (`SparkSession.builder.remote("local[2]")`, started by pyspark) in a process of its
own, since a classic session and a Connect one cannot share a process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CLIENT = Path(__file__).parent / "user_code" / "connect_client.py"


def test_the_torch_distributor_runs_over_spark_connect():
    done = subprocess.run(
        [sys.executable, str(CLIENT)], capture_output=True, text=True, timeout=600, cwd=CLIENT.parent
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    assert out["session"] == "pyspark.sql.connect.session" and out["is_remote"] is True
    assert out["listening"] == ["127.0.0.1"], "the local Connect server listens on loopback only"
    # two barrier ranks that trained together end with the weights of two processes on the driver
    assert out["world"] == 2 and out["max_param_diff"] <= 1e-6 and out["accuracy"] > 0.8
    # no relay reaches a Connect client: each rank's last lines come back with its result
    assert sorted(line.split(" loss ")[0] for line in out["relayed"]) == [
        "[rank 0] rank 0 epoch 2",
        "[rank 1] rank 1 epoch 2",
    ], out["relayed"]
    assert out["failure"] == {
        "type": "ValueError",
        "message": "bad value on rank 1",
        "tail": "rank 1 starting",
    }, "a failing rank's own report reaches the client, through Connect's error text"
    assert out["slots"].startswith(
        "fewer task slots than ranks, 3 ranks requested: lower num_processes, or give the cluster more cores"
    ), out.get("slots")
    assert out["horovod"].startswith("the horovod backend runs its rendezvous server on the driver"), out
    assert out["dataframe"]["rows"] == out["input_rows"] == 569, "every row of the Connect DataFrame, once"
    assert out["dataframe"]["accuracy"] > 0.95
