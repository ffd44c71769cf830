"""docs/benchmarks.md's tables are bench/results.json's rows (`python -m bench.report --write`)."""

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
