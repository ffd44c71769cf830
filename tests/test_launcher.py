"""Barrier launcher: real ranks in a Spark barrier stage, real torch.distributed collectives."""

import os
from dataclasses import dataclass

import pytest

from sparkml_dist.errors import RankFailure, SlotError
from sparkml_dist.launch import TorchBackend, run_barrier
from sparkml_dist.launch.backend import joining_the_group

pytestmark = pytest.mark.spark


def allreduce_rank(ctx, payload):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return {"rank": ctx.rank, "sum": t.item(), "world": dist.get_world_size(), "env_rank": os.environ["RANK"]}


def failing_rank(ctx, payload):
    import torch
    import torch.distributed as dist

    print(f"rank {ctx.rank} is loading shard {payload}")
    if ctx.rank == 1:
        raise ValueError("shard 7 has a corrupt row group")
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1, which is gone
    return ctx.rank


@dataclass(frozen=True)
class JoinFailsAtFirst(TorchBackend):
    """Rank 1's first `joins` attempts to join the group fail the way gloo's full-mesh connect does on
    a loaded host; every later join is torch.distributed's own. Each attempt leaves a file in `marks`."""

    marks: str = ""
    joins: int = 1

    def rank_init(self, ctx):
        if ctx.rank == 1:
            attempt = len(os.listdir(self.marks))
            open(os.path.join(self.marks, f"join-{attempt}"), "w").close()
            if attempt < self.joins:
                with joining_the_group(ctx, "torch.distributed"):
                    raise RuntimeError(
                        "Gloo connectFullMesh failed with [gloo/transport/tcp/pair.cc:144] no error"
                    )
        super().rank_init(ctx)


@dataclass(frozen=True)
class RecordsPreload(TorchBackend):
    """Leaves `preload-<rank>` in `marks` when a rank preloads, and `met-<rank>` once the rank is
    past the all-gather that gives it rank 0's rendezvous port (the first wait on the others)."""

    marks: str = ""

    def preload(self):
        from pyspark import BarrierTaskContext

        super().preload()
        open(os.path.join(self.marks, f"preload-{BarrierTaskContext.get().partitionId()}"), "w").close()

    def rendezvous_gateway(self, ctx):
        open(os.path.join(self.marks, f"met-{ctx.rank}-saw-{len(os.listdir(self.marks))}"), "w").close()
        return super().rendezvous_gateway(ctx)


def test_every_rank_imports_its_backend_before_any_rank_waits_on_another(spark, tmp_path):
    """Imported behind the rendezvous, cold ranks take turns: each waits for the other's import of
    torch (about a second each here; docs/benchmarks.md, run_start_vs_torch_distributor)."""
    run_barrier(spark, allreduce_rank, None, 2, RecordsPreload(timeout_s=60, marks=str(tmp_path)))
    marks = sorted(os.listdir(tmp_path))
    assert [m for m in marks if m.startswith("preload")] == ["preload-0", "preload-1"]
    met = [m for m in marks if m.startswith("met")]
    assert len(met) == 2 and all(int(m.rsplit("-", 1)[1]) >= 2 for m in met), (
        f"a rank got past the all-gather before both ranks had preloaded: {marks}"
    )


def worker_env(_):
    yield {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}


def test_two_ranks_allreduce_and_results_come_back_in_rank_order(spark):
    results = run_barrier(spark, allreduce_rank, None, 2, TorchBackend(timeout_s=60))
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["sum"] for r in results] == [3.0, 3.0]
    assert [r["env_rank"] for r in results] == ["0", "1"]


def test_a_stage_whose_ranks_could_not_form_their_group_is_launched_once_more(spark, tmp_path):
    results = run_barrier(spark, allreduce_rank, None, 2, JoinFailsAtFirst(timeout_s=60, marks=str(tmp_path)))
    assert [r["sum"] for r in results] == [3.0, 3.0], "the second launch formed a real group"
    assert sorted(os.listdir(tmp_path)) == ["join-0", "join-1"]


def test_a_group_that_cannot_form_twice_is_reported_as_a_rendezvous_error(spark, tmp_path):
    with pytest.raises(RankFailure) as err:
        run_barrier(
            spark, allreduce_rank, None, 2, JoinFailsAtFirst(timeout_s=60, marks=str(tmp_path), joins=5)
        )
    assert err.value.in_rendezvous and err.value.ranks == [1]
    assert (
        "RendezvousError: rank 1 of 2 (host 127.0.0.1) could not join the torch.distributed process group: "
        "RuntimeError: Gloo connectFullMesh failed" in str(err.value)
    )
    assert sorted(os.listdir(tmp_path)) == ["join-0", "join-1"], "launched twice, not more"


def test_a_failure_inside_the_rank_function_is_not_launched_again(spark, tmp_path):
    with pytest.raises(RankFailure) as err:
        run_barrier(spark, failing_rank, 7, 2, JoinFailsAtFirst(timeout_s=60, marks=str(tmp_path), joins=0))
    assert not err.value.in_rendezvous
    assert os.listdir(tmp_path) == ["join-0"]


def test_rank_environment_is_restored_in_reused_python_workers(spark):
    run_barrier(spark, allreduce_rank, None, 2, TorchBackend(timeout_s=60))
    envs = spark.sparkContext.parallelize(range(2), 2).mapPartitions(worker_env).collect()
    assert envs == [{"MASTER_ADDR": None, "MASTER_PORT": None, "RANK": None, "WORLD_SIZE": None}] * 2


def test_a_raising_rank_is_reported_by_rank_with_its_output(spark):
    with pytest.raises(RankFailure) as err:
        run_barrier(spark, failing_rank, 7, 2, TorchBackend(timeout_s=60))
    failure = err.value
    assert failure.ranks == [1]
    text = str(failure)
    assert "rank 1" in text and "ValueError: shard 7 has a corrupt row group" in text
    assert "rank 1 is loading shard 7" in text, "the tail of the rank's output comes back"
    # the error pickles (it may cross process boundaries, e.g. from a notebook job)
    import pickle

    assert pickle.loads(pickle.dumps(failure)).ranks == [1]


def test_too_many_ranks_fails_fast_with_the_slot_count(spark):
    with pytest.raises(SlotError, match="4 task slots available, 5 ranks requested"):
        run_barrier(spark, allreduce_rank, None, 5, TorchBackend())


def _abort_like_gloo():
    import faulthandler

    faulthandler.disable()  # pytest's dump of the child's stack would only be noise in the log
    os.write(2, b"terminate called after throwing an instance of 'gloo::EnforceNotMet'\n")
    os.abort()


def test_a_forked_rank_that_aborts_in_native_code_reports_the_signal_and_its_message():
    from sparkml_dist.launch.isolation import run_forked

    with pytest.raises(RuntimeError, match="killed by SIGABRT") as info:
        run_forked(_abort_like_gloo)
    assert "gloo::EnforceNotMet" in str(info.value)


def test_spark_refusing_a_stage_for_want_of_slots_is_told_apart(spark):
    """The launcher waits for slots again when Spark refuses a stage at submission (an executor that
    left after the check); the refusal must be recognised in Spark's own words."""
    from sparkml_dist.launch.launcher import _launch, _SlotsGone

    with pytest.raises(_SlotsGone):
        _launch(
            spark,
            allreduce_rank,
            None,
            5,
            TorchBackend(timeout_s=60),
            False,
            None,
            "five ranks on four slots",
        )


def _workers_pyspark(_partition):
    import pyspark

    yield pyspark.__file__


def test_this_hosts_python_workers_import_the_installed_pyspark_not_sparks_zip(spark):
    """A session on this host runs its Python workers through sparkml_dist.pyspark_daemon: they
    import pyspark's compiled package, not the zip Spark puts first on their path (which every
    daemon and worker compiled again: 0.64 s against 0.13 s)."""
    files = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_workers_pyspark).collect()
    assert files and all(".zip" not in f and f.endswith("__init__.py") for f in files), files


def _daemon_maps_torch(_) -> list[bool]:
    import os

    with open(f"/proc/{os.getppid()}/maps") as maps:  # the worker's parent: the daemon that forked it
        return [any("libtorch_cpu" in line for line in maps)]


def test_this_hosts_python_workers_are_forked_with_torch_already_imported(spark):
    """The daemon imports torch before it forks a worker, so a rank or a scoring task does not
    import it again in every worker (sparkml_dist/pyspark_daemon.py: 2.8 CPU-s per worker)."""
    from sparkml_dist.pyspark_daemon import PRELOAD, preload

    assert spark.sparkContext.parallelize(range(2), 2).mapPartitions(_daemon_maps_torch).collect() == [
        True,
        True,
    ]
    assert preload(("torch", "no_such_module_here")) == ["torch"] and "pyarrow" not in PRELOAD


def test_only_the_zip_inside_an_installed_pyspark_is_replaced(tmp_path):
    from sparkml_dist.pyspark_daemon import prefer_installed_pyspark

    site = tmp_path / "site"
    (site / "pyspark" / "python" / "lib").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    installed_zip = site / "pyspark" / "python" / "lib" / "pyspark.zip"
    distribution = (
        tmp_path / "spark-4.0.0-bin" / "python" / "lib" / "pyspark.zip"
    )  # SPARK_HOME's: not a package
    py4j = site / "pyspark" / "python" / "lib" / "py4j-0.10.9.9-src.zip"
    path = [str(installed_zip), str(py4j), str(distribution), "/usr/lib/python3.11"]
    assert prefer_installed_pyspark(path) == [str(site), str(py4j), str(distribution), "/usr/lib/python3.11"]
