"""Outputs are committed atomically: a failed write leaves the previous good output readable."""

import pytest

from sparkml_dist.data.atomic import HadoopFS, atomic_dir, recover

pytestmark = pytest.mark.spark


def write_rows(spark, path, n):
    spark.range(n).write.mode("overwrite").parquet(path)


def test_failed_write_keeps_the_previous_output_and_rerun_replaces_it(spark, tmp_path):
    final = str(tmp_path / "predictions")
    with atomic_dir(spark, final) as staging:
        write_rows(spark, f"{staging}/scored", 10)
    with pytest.raises(RuntimeError, match="killed mid-write"):
        with atomic_dir(spark, final) as staging:
            write_rows(spark, f"{staging}/scored", 99)
            raise RuntimeError("killed mid-write")
    assert spark.read.parquet(f"{final}/scored").count() == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions"], "no staging leftovers"
    with atomic_dir(spark, final) as staging:
        write_rows(spark, f"{staging}/scored", 5)
    assert spark.read.parquet(f"{final}/scored").count() == 5, "a re-run replaces, never appends"


def test_crash_between_the_two_renames_is_recovered(spark, tmp_path):
    final = tmp_path / "out"
    backup = tmp_path / "out.old-deadbeef"
    write_rows(spark, str(backup / "scored"), 7)  # state after rename #1, before rename #2
    (tmp_path / "out.staging-cafebabe").mkdir()
    recover(HadoopFS(spark), str(final))
    assert spark.read.parquet(str(final / "scored")).count() == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
