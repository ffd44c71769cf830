"""Keep the suite's measured times: `make test` writes output/test_times.json (tests/timing.py);
this script keeps its summary as tests/file_times.json (the order the scheduler gives files) and
regenerates the README's table from it.

    .venv/bin/python scripts/test_times.py            # after a full `make test`
    .venv/bin/python scripts/test_times.py --check    # exit 1 when the README's table is stale
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "output" / "test_times.json"
KEPT = ROOT / "tests" / "file_times.json"
README = ROOT / "README.md"
BEGIN = "<!-- test-times: scripts/test_times.py -->"
END = "<!-- /test-times -->"
TABLE_FILES = 8
TABLE_FIXTURES = 6


def keep(report: dict) -> dict:
    """What is worth committing from a run: per-file and per-worker seconds, the costliest fixtures."""
    return {
        "measured": report.get("date") or datetime.date.today().isoformat(),
        "wall_s": report["wall_s"],
        "cpus": report.get("cpus"),
        "cpu_busy": report.get("cpu_busy"),
        "tests": report["tests"],
        "workers_s": report["workers_s"],
        "fixtures_s": dict(list(report["fixtures_s"].items())[:TABLE_FIXTURES]),
        "files_s": {Path(f).name: s for f, s in report["files_s"].items()},
    }


def table(kept: dict) -> str:
    files = list(kept["files_s"].items())
    rest = files[TABLE_FILES:]
    workers = ", ".join(f"{w} {s:.0f} s" for w, s in kept["workers_s"].items())
    busy = kept.get("cpu_busy")
    cpu = f" The machine's {kept['cpus']} cores were {busy:.0%} busy." if busy is not None else ""
    lines = [
        BEGIN,
        f"Measured {kept['measured']}: {kept['tests']} tests in {kept['wall_s'] / 60:.1f} minutes of wall "
        f"time on {len(kept['workers_s'])} workers"
        + (f" ({workers} of test time)." if workers else ".")
        + cpu,
        "",
        "| file | seconds |",
        "|---|---:|",
    ]
    lines += [f"| `tests/{name}` | {s:.0f} |" for name, s in files[:TABLE_FILES]]
    if rest:
        lines.append(f"| {len(rest)} other files | {sum(s for _, s in rest):.0f} |")
    lines += ["", "| fixture (scope) | set-ups | seconds |", "|---|---:|---:|"]
    lines += [f"| `{name}` | {v['count']} | {v['total']:.0f} |" for name, v in kept["fixtures_s"].items()]
    lines.append(END)
    return "\n".join(lines)


def with_table(readme: str, kept: dict) -> str:
    head, _, rest = readme.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest:
        raise SystemExit(f"{README}: no '{BEGIN}' marker; add one where the table belongs")
    return head + table(kept) + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--check", action="store_true", help="fail if the README's table is not the kept times'"
    )
    parser.add_argument("--report", type=Path, default=REPORT)
    parser.add_argument(
        "--partial", action="store_true", help="keep a report of fewer tests than the kept times'"
    )
    args = parser.parse_args(argv)
    readme = README.read_text()
    if args.check:
        fresh = with_table(readme, json.loads(KEPT.read_text()))
        if fresh != readme:
            print("README's test-times table is stale: run scripts/test_times.py", file=sys.stderr)
            return 1
        return 0
    if not args.report.exists():
        raise SystemExit(f"{args.report}: no report; run `make test` first (tests/timing.py writes it)")
    report = json.loads(args.report.read_text())
    if KEPT.exists() and not args.partial:
        before = json.loads(KEPT.read_text())["tests"]
        if report["tests"] < 0.9 * before:
            raise SystemExit(
                f"{args.report}: {report['tests']} tests, the kept times {before}: a partial run "
                "(every pytest run writes the report); run the full `make test`, or pass --partial"
            )
    kept = keep(report)
    for path, text in ((KEPT, json.dumps(kept, indent=1) + "\n"), (README, with_table(readme, kept))):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    print(
        f"wrote {KEPT.relative_to(ROOT)} and the README's table ({kept['tests']} tests, {kept['wall_s']:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
