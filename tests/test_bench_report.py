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
