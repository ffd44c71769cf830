"""docs/benchmarks.md's tables are bench/results.json's rows (`python -m bench.report --write`)."""

from bench.common import Measured, entry
from bench.report import BLOCK, DOCS, GENERATED, load_results, render


def test_the_docs_tables_are_the_results_file():
    docs = DOCS.read_text()
    assert render(docs, load_results()) == docs, (
        "run `.venv/bin/python -m bench.report --write` after `make bench`"
    )
    prefixes = [m.group(2) for m in BLOCK.finditer(docs)]
    assert "*" in prefixes, "the full table is generated"
    missing = [r["name"] for r in load_results() if f"| `{r['name']}` |" not in docs]
    assert not missing, f"recorded rows missing from docs/benchmarks.md: {missing}"
    for other in GENERATED:
        text = other.read_text()
        assert BLOCK.search(text), f"{other.name} has a generated table"
        assert render(text, load_results()) == text, (
            f"{other.name}: run `.venv/bin/python -m bench.report --write`"
        )


def test_a_changed_result_changes_the_docs():
    results = load_results()
    changed = [dict(r, ratio=r["ratio"] + 1) if r["name"] == results[0]["name"] else r for r in results]
    docs = DOCS.read_text()
    assert render(docs, changed) != docs


def test_every_row_says_when_at_which_commit_and_over_how_many_rounds():
    """A figure without its date and code cannot be compared with the code that runs now."""
    for row in load_results():
        assert row.get("measured") and row.get("commit"), f"{row['name']}: no date or commit"
        assert isinstance(row.get("rounds"), int) and row["rounds"] >= 1, f"{row['name']}: no rounds"
        if "ours_runs" in row:
            assert row["rounds"] == row["ours_runs"]["rounds"], row["name"]


def test_a_new_row_counts_its_rounds():
    alternated = entry("x", Measured([1.0, 2.0, 3.0]), Measured([1.0, 1.0, 1.0]), "s", "lower", None)
    assert alternated["rounds"] == 3 and alternated["ours_runs"]["rounds"] == 3
    assert entry("y", 2.0, 1.0, "s", "lower", None)["rounds"] == 1


def test_the_growth_rows_become_curves_of_cost_per_row_by_size():
    """bench.growth's rows, read back as docs/img/growth.png draws them: per size, smallest first."""
    from bench.growth import Point, rows_of
    from bench.report import COPY_CURVE, growth_curves

    points = [
        Point(10_000_000, Measured([4.0, 6.0]), Measured([8.0, 8.0]), Measured([2.0, 2.0])),
        Point(1_000_000, Measured([12.0, 12.0]), Measured([20.0, 22.0]), Measured([3.0, 3.0])),
    ]
    rows = rows_of(sorted(points, key=lambda p: p.rows))
    curves = growth_curves(rows)
    assert curves == {
        "preprocess": [(1_000_000, 12.0), (10_000_000, 5.0)],
        "score": [(1_000_000, 21.0), (10_000_000, 8.0)],
        COPY_CURVE: [(1_000_000, 3.0), (10_000_000, 2.0)],
    }
    growth = {r["name"]: r for r in rows if "_per_row_" in r["name"]}
    assert set(growth) == {"growth_preprocess_per_row_10m_vs_1m", "growth_score_per_row_10m_vs_1m"}
    assert growth["growth_score_per_row_10m_vs_1m"]["ratio"] == round(8.0 / 21.0, 4)
    assert growth["growth_score_per_row_10m_vs_1m"]["met"], "a cost per row that falls is within 1.3x"


def test_the_training_rows_put_n_ranks_against_n_times_one_rank():
    from bench.growth import RankRun, train_rows
    from bench.report import growth_ranks

    def runs(*rates):
        return [RankRun(rate, {"compute": rate / 100, "comm": 1.0}) for rate in rates]

    rows = train_rows({1: runs(100.0, 110.0), 2: runs(180.0, 190.0), 4: runs(200.0, 220.0)})
    assert growth_ranks(rows) == [(1, 105.0, 105.0), (2, 185.0, 210.0), (4, 210.0, 420.0)]
    by_name = {r["name"]: r for r in rows}
    assert by_name["growth_train_1_ranks"]["met"] is None, "one rank is the reference, not a result"
    assert not by_name["growth_train_4_ranks"]["met"], "half of four ranks' ideal is below 0.8"
    assert by_name["growth_train_2_ranks"]["step_ms"]["compute"] in (1.8, 1.9), "a run's own breakdown"
    assert "compute" in by_name["growth_train_2_ranks"]["note"]


def test_the_growth_plot_is_drawn_from_the_results_file(tmp_path):
    """docs/img/growth.png is what `bench.report --write` draws from bench/results.json now."""
    from bench.report import GROWTH_PLOT, growth_plot

    drawn = growth_plot(load_results(), tmp_path / "growth.png")
    assert drawn is not None and drawn.read_bytes() == GROWTH_PLOT.read_bytes(), (
        "run `.venv/bin/python -m bench.report --write` after `python -m bench.growth`"
    )
