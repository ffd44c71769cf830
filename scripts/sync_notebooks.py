"""Keep notebooks/*.ipynb in step with the Databricks-source notebooks/*.py they are made from.

python scripts/sync_notebooks.py          # rewrite the .ipynb files
python scripts/sync_notebooks.py --check  # exit 1 if any .ipynb is out of step
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADER = "# Databricks notebook source"
SEPARATOR = "# COMMAND ----------"
MAGIC_MD = "# MAGIC %md"
MAGIC = "# MAGIC"


def cells_from_databricks(text: str) -> list[dict]:
    body = text.split("\n", 1)[1] if text.startswith(HEADER) else text
    cells = []
    for chunk in body.split(SEPARATOR):
        lines = chunk.strip("\n").splitlines()
        if not lines:
            continue
        if lines[0].startswith(MAGIC_MD):
            md = [ln[len(MAGIC) :].removeprefix(" ") for ln in lines]
            md[0] = md[0].removeprefix("%md").lstrip()
            cells.append({"cell_type": "markdown", "metadata": {}, "source": _source(md)})
        else:
            cells.append(
                {
                    "cell_type": "code",
                    "metadata": {},
                    "execution_count": None,
                    "outputs": [],
                    "source": _source(lines),
                }
            )
    return cells


def _source(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    return [ln + "\n" for ln in lines[:-1]] + lines[-1:]


def notebook(cells: list[dict]) -> dict:
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def expected_ipynb(py: Path) -> str:
    nb = notebook(cells_from_databricks(py.read_text()))
    for i, cell in enumerate(nb["cells"]):
        cell["id"] = f"cell-{i}"
    return json.dumps(nb, indent=1) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for py in sorted(Path(__file__).resolve().parents[1].joinpath("notebooks").glob("*.py")):
        ipynb = py.with_suffix(".ipynb")
        want = expected_ipynb(py)
        if "--check" in argv:
            if not ipynb.exists() or ipynb.read_text() != want:
                stale.append(str(ipynb))
        else:
            ipynb.write_text(want)
    if stale:
        print("out of step with their .py source (run scripts/sync_notebooks.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
