"""`sparkml_dist.TorchDistributor`: a user's own torch code (tests/user_code, which imports nothing
of this project but the loader) on 2 ranks, as a drop-in for pyspark's TorchDistributor."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.torch.distributor import TorchDistributor as PySparkTorchDistributor
from sklearn.datasets import load_breast_cancer
from user_code.breast_cancer import (
    fail_on_rank,
    resume_after_failure,
    step_and_leave,
    train,
    train_from_dataframe,
)

import sparkml_dist as sd
from sparkml_dist.errors import ConfigError, DataError, RankFailure, SlotError, UserCodeError

SCRIPT = Path(__file__).parent / "user_code" / "train_script.py"


def barrier(**options) -> sd.TorchDistributor:
    return sd.TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, **options)


def test_users_function_trains_on_two_ranks_with_torchrun_environment(spark, caplog):
    caplog.set_level(logging.INFO, logger="sparkml_dist.ranks")
    result = barrier(spark=spark).run(train, 0.2, epochs=10)
    assert result["world"] == 2
    assert result["env"]["RANK"] == "0" and result["env"]["WORLD_SIZE"] == "2"
    assert result["env"]["MASTER_ADDR"] == "127.0.0.1" and int(result["env"]["MASTER_PORT"]) > 0
    assert result["env"]["CUDA_VISIBLE_DEVICES"] == "", "use_gpu=False: no GPU, as pyspark's ranks see none"
    assert result["env"]["LOCAL_RANK"] == "0", (
        "one process per task, as torchrun --nproc_per_node=1 in pyspark's"
    )
    assert result["accuracy"] > 0.95  # the 30-feature MLP learns the breast-cancer data
    # both ranks' prints reached the driver's log
    assert "[rank 1] rank 1 epoch 9 loss" in caplog.text and "[rank 0] rank 0 epoch 0 loss" in caplog.text


def test_same_final_parameters_as_pysparks_torch_distributor(spark):
    ours = barrier(spark=spark).run(train, 0.05, epochs=3)
    theirs = PySparkTorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        train, 0.05, epochs=3
    )
    assert len(ours["params"]) == len(theirs["params"]) == 4
    for mine, other in zip(ours["params"], theirs["params"]):
        np.testing.assert_allclose(mine, other, rtol=0, atol=1e-6)


def test_returning_right_after_destroying_the_group_never_hangs(spark):
    # without launch.pg_guard one rank hung in ~ProcessGroupGloo within a few of these launches
    distributor = barrier(spark=spark)
    assert [distributor.run(step_and_leave) for _ in range(12)] == [0] * 12


def test_local_mode_runs_processes_on_the_driver_with_the_same_result(spark):
    local = sd.TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train, 0.05, epochs=3)
    ours = barrier(spark=spark).run(train, 0.05, epochs=3)
    for a, b in zip(local["params"], ours["params"]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("local_mode", [False, True])
def test_script_path_with_arguments(spark, tmp_path, local_mode):
    out = tmp_path / "result.json"
    returned = sd.TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False, spark=spark).run(
        str(SCRIPT), "--learning-rate=0.2", "--epochs", "4", f"--out={out}"
    )
    assert returned is None  # as pyspark: a script's result is what it writes
    written = json.loads(out.read_text())
    assert written["world"] == 2 and written["accuracy"] > 0.9
    assert written["argv"] == ["--learning-rate=0.2", "--epochs", "4", f"--out={out}"]


@pytest.mark.parametrize("local_mode", [False, True])
def test_failing_rank_raises_its_report(spark, local_mode):
    with pytest.raises(RankFailure) as failure:
        sd.TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False, spark=spark).run(
            fail_on_rank, 1
        )
    report = {r.rank: r for r in failure.value.reports}[1]
    assert report.exc_type == "ValueError" and "bad value on rank 1" in report.message
    assert "fail_on_rank" in report.traceback
    assert "rank 1 starting" in report.output_tail


def test_relaunch_resumes_from_the_checkpoint_directory(spark, tmp_path):
    distributor = barrier(spark=spark, max_attempts=2, checkpoint_dir=str(tmp_path / "ckpt"))
    result = distributor.run(resume_after_failure, 4)
    assert result == {"attempt": 1, "resumed_from": 2, "max_attempts": 2}
    assert distributor.attempts_used == 2
    assert json.loads((tmp_path / "ckpt" / "state.json").read_text()) == {"epochs_done": 4}


def test_output_reaches_the_driver_while_the_rank_runs(spark, caplog):
    caplog.set_level(logging.INFO, logger="sparkml_dist.ranks")
    finished = {}

    def launch():
        barrier(spark=spark).run(print_then_wait, 4.0)
        finished["at"] = time.time()

    thread = threading.Thread(target=launch)
    thread.start()
    thread.join(timeout=120)
    early = [r for r in caplog.records if "step one done" in r.getMessage()]
    assert len(early) == 2  # one line per rank
    assert all(finished["at"] - r.created > 3.0 for r in early)  # logged seconds before the run ended


def test_rank_output_reaches_stdout_where_the_app_configured_logging(capsys):
    """As pyspark's distributor prints it: under pytest (which puts a handler on the root logger)
    and with sys.stdout replaced after an earlier distributor was built."""
    sd.TorchDistributor(num_processes=1, local_mode=True, use_gpu=False)
    sd.TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(print_then_wait, 0.0)
    out = capsys.readouterr().out
    assert "[rank 0] step one done" in out and "[rank 1] step one done" in out, out


def test_pysparks_own_distributor_tests_pass_against_ours():
    """Apache Spark's tests of its TorchDistributor, ported with the import changed
    (tests/peers/pyspark_test_distributor.py says which were left out and why), in a process of
    their own: each makes its own SparkContext."""
    import subprocess
    import sys

    port = Path(__file__).parent / "peers" / "pyspark_test_distributor.py"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider", str(port)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=port.parent,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    assert "7 passed" in out.stdout, out.stdout[-2000:]


def print_then_wait(seconds: float) -> None:
    print("step one done", flush=True)
    time.sleep(seconds)


def test_dataframe_fed_ranks_take_equal_steps_and_learn(spark):
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    names = [f"f{i}" for i in range(x.shape[1])]
    rows = [tuple(float(v) for v in r) + (int(label),) for r, label in zip(x, y)]
    raw = spark.createDataFrame(rows, [*names, "label"]).repartition(5)  # shares need not match ranks
    df = VectorAssembler(inputCols=names, outputCol="features").transform(raw).select("features", "label")
    result = barrier(spark=spark).run_on_dataframe(train_from_dataframe, df, 0.2, epochs=10)
    ranks = result["ranks"]
    assert sum(r["own_rows"] for r in ranks) == len(rows)  # every row went to exactly one rank
    assert ranks[0]["steps"] == ranks[1]["steps"] == 10 * -(-max(r["own_rows"] for r in ranks) // 32)
    assert result["accuracy"] > 0.95


def test_the_deal_hashes_keys_as_spark_does(spark):
    from sparkml_dist.launch.deal import spark_hash_long

    values = [0, 1, 2, 41, 2**31 - 1, 2**31, 2**32 + 5, 2**62, -1, -(2**40)]
    rows = spark.createDataFrame([(v,) for v in values], "v long").selectExpr("v", "hash(v) AS h").collect()
    assert {row.v: row.h for row in rows} == {v: spark_hash_long(v) for v in values}


@pytest.mark.parametrize("ranks", [2, 3, 7])
def test_rows_are_dealt_evenly_and_the_same_way_twice(spark, ranks):
    from sparkml_dist.launch.deal import deal

    df = spark.range(10_007).repartition(5)
    shares = deal(df, ranks).rdd.map(lambda row: row.id).glom().map(sorted).collect()
    assert len(shares) == ranks and sorted(v for share in shares for v in share) == list(range(10_007))
    assert max(map(len, shares)) - min(map(len, shares)) <= 5  # at most one row per input partition
    assert deal(df, ranks).rdd.map(lambda row: row.id).glom().map(sorted).collect() == shares


class _Unpicklable:
    def __init__(self):
        self.lock = threading.Lock()


def test_bad_input_is_refused_before_any_rank_starts(spark, tmp_path):
    holder = _Unpicklable()
    with pytest.raises(UserCodeError, match="training function .*cannot be sent to the ranks.*lock"):
        barrier(spark=spark).run(lambda: holder.lock)
    with pytest.raises(UserCodeError, match="does not exist"):
        barrier(spark=spark).run(str(tmp_path / "missing.py"), "--x=1")
    with pytest.raises(UserCodeError, match="command-line arguments only"):
        barrier(spark=spark).run(str(SCRIPT), lr=0.1)
    strings = spark.createDataFrame([(1.0, "a")], ["x", "city"])
    with pytest.raises(DataError, match="column 'city' has type string.*StringIndexer"):
        barrier(spark=spark).run_on_dataframe(train_from_dataframe, strings, 0.1)
    with pytest.raises(ConfigError, match="local_mode=False"):
        sd.TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run_on_dataframe(
            train_from_dataframe, strings, 0.1
        )
    with pytest.raises(SlotError, match="64 ranks requested: lower num_processes to at most"):
        sd.TorchDistributor(num_processes=64, local_mode=False, use_gpu=False, spark=spark).run(train, 0.1)
    with pytest.raises(RuntimeError, match="'spark.task.resource.gpu.amount' was unset.*use_gpu=False"):
        sd.TorchDistributor(num_processes=2, local_mode=False, use_gpu=True, spark=spark)
