"""Command line: `sparkml-dist <command> --config conf/adult.yaml [--set key=value ...]`.
The jobs/ scripts call this same entry, so spark-submit and the console script agree.

Each command is one row of `COMMANDS`: a stage function that does the work and writes its own
outputs and records, and a line that reports what it did. The CLI itself writes nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sparkml_dist.config.header import init_config
from sparkml_dist.config.loader import load_config
from sparkml_dist.config.schema import JobConfig
from sparkml_dist.errors import SparkMLDistError
from sparkml_dist.launch.context import env_scope
from sparkml_dist.spark.session import build_session, describe_session, driver_jvm_exit, is_connect
from sparkml_dist.tracking.client import check_tracking_store, tracked_run

log = logging.getLogger("sparkml_dist.cli")


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Callable[[object, JobConfig, argparse.Namespace], str]  # (spark, cfg, args) -> report


def _preprocess(spark, cfg: JobConfig, args) -> str:
    # pyspark, matplotlib: a subcommand imports what it runs
    from sparkml_dist.stages.preprocess import preprocess

    prep = preprocess(spark, cfg)
    return (
        f"preprocess: {json.dumps(prep.manifest.inputs)} -> {prep.path} (manifest {prep.path}/manifest.json)"
    )


def _train(spark, cfg: JobConfig, args) -> str:
    # pyspark, matplotlib: a subcommand imports what it runs
    from sparkml_dist.stages.train import train_preprocessed

    result = train_preprocessed(spark, cfg)
    last = result.records[-1]
    e = last.evaluation
    held_out = f"{e.rows}_{e.metric} {e.value:.4f}" if e else ""
    return (
        f"train: run {result.run_id} ({result.outcome.method}), model {result.model_uri}, rows per rank "
        f"{[r.samples for r in result.outcome.ranks]}, {held_out}, ranks in step: {result.ranks_in_step}"
    )


def _evaluate(spark, cfg: JobConfig, args) -> str:
    # pyspark, matplotlib: a subcommand imports what it runs
    from sparkml_dist.stages.evaluate import evaluate_trained

    return "evaluate: " + json.dumps(evaluate_trained(spark, cfg, args.model_uri).metrics, indent=1)


def _register(spark, cfg: JobConfig, args) -> str:
    # pyspark, matplotlib: a subcommand imports what it runs
    from sparkml_dist.stages.register import register_evaluated

    decision = register_evaluated(spark, cfg, args.model_uri)
    return f"register: {decision.name} version {decision.version} -> {decision.alias} ({decision.reason})"


def _score(spark, cfg: JobConfig, args) -> str:
    from sparkml_dist.stages.score import score  # pyspark, matplotlib: a subcommand imports what it runs

    result = score(spark, cfg, args.model_uri, args.input, args.output)
    energy = f"; {result.energy_text()}" if result.energy_text() else ""
    return (
        f"score: {result.input_rows:,} rows in, {result.scored_rows:,} scored, {result.rejected_rows:,} rejected "
        f"-> {result.path} (model {result.model_uri}){energy}"
    )


def _stream(spark, cfg: JobConfig, args) -> str:
    from sparkml_dist.stages.stream import stream  # pyspark, matplotlib: a subcommand imports what it runs

    if not args.input:
        raise SparkMLDistError("stream: give the directory new files arrive in with --input DIR")
    stop = threading.Event()  # SIGTERM or Ctrl-C: finish the micro-batch in progress, then stop
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        result = stream(spark, cfg, args.input, args.output, args.checkpoint, args.model_uri, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    versions = sorted({b.report.model_version for b in result.batches})
    refused = "".join(f"; version {v} refused: {why}" for v, why in result.refused.items())
    return (
        f"stream: {len(result.batches)} micro-batches, {result.total('input_rows'):,} rows in, "
        f"{result.total('rejected_rows'):,} rejected, {result.total('scored_rows'):,} scored by version(s) "
        f"{', '.join(versions) or '-'} -> {result.output}/scored (checkpoint {result.checkpoint}); "
        f"{result.stopped}{refused}"
    )


def _pipeline(spark, cfg: JobConfig, args) -> str:
    # pyspark, matplotlib: a subcommand imports what it runs
    from sparkml_dist.pipeline import format_summary, run_pipeline

    return format_summary(run_pipeline(spark, cfg))


def _finetune(spark, cfg: JobConfig, args) -> str:
    # pyspark, torch: a subcommand imports what it runs
    from sparkml_dist.stages.finetune import finetune, result_lines

    with tracked_run(cfg.tracking, "finetune", cfg.flat_params()) as run:
        return result_lines(finetune(spark, cfg, run))


def _contribute(spark, cfg: JobConfig, args) -> str:
    from sparkml_dist.stages.contribute import contribute  # pyspark, torch: a subcommand imports what it runs

    if not args.delta:
        raise SparkMLDistError("contribute: give the delta with --delta <file or runs:/... URI>")
    with tracked_run(cfg.tracking, "contribute", cfg.flat_params()) as run:
        verdict = contribute(spark, cfg, run, args.delta, args.contributor)
    status = f"accepted as version {verdict.version}" if verdict.accepted else "REJECTED"
    return f"contribute: {args.delta} from {args.contributor} {status}: {verdict.reason} (sha256 {verdict.sha256[:12]})"


def _federated(spark, cfg: JobConfig, args) -> str:
    # pyspark: a subcommand imports what it runs
    from sparkml_dist.methods.federated.server import result_lines
    from sparkml_dist.stages.train import train

    with tracked_run(cfg.tracking, "federated", cfg.flat_params()) as run:
        result = train(spark, cfg, None, run, method_name="federated")
    return result_lines(result.outcome.detail, cfg, result.model_uri)


def _tune(spark, cfg: JobConfig, args) -> str:
    # pyspark, pyarrow: a subcommand imports what it runs
    from sparkml_dist.tune.runner import result_lines, run_tune

    return result_lines(run_tune(spark, cfg))


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command(
            "preprocess", "ingest, quarantine bad rows, fit features, write the Parquet splits", _preprocess
        ),
        Command("train", "train on the preprocessed splits with train.strategy's method", _train),
        Command("evaluate", "score the test rows with the last trained model (or --model-uri)", _evaluate),
        Command("register", "register the evaluated model; champion only through the gate", _register),
        Command("score", "score raw rows with models:/<name>@champion (or --model-uri)", _score),
        Command(
            "stream",
            "score files as they arrive in --input with Structured Streaming, following @champion",
            _stream,
        ),
        Command(
            "pipeline", "preprocess -> train -> evaluate -> register -> score in one MLflow run", _pipeline
        ),
        Command("finetune", "continue training a registered model on new rows", _finetune),
        Command(
            "contribute", "validate a contributor's parameter delta and merge it if it passes", _contribute
        ),
        Command("federated", "federated rounds over client partitions (federated.client_column)", _federated),
        Command(
            "tune",
            "hyperparameter search over tune.space: concurrent barrier trials, pruning, best model "
            "through the gate",
            _tune,
        ),
    )
}
STAGES = tuple(COMMANDS)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sparkml-dist",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
        + "\n".join(f"  {c.name:11s} {c.help}" for c in COMMANDS.values())
        + f"\n  {'init':11s} print a config for a CSV with a header: sparkml-dist init "
        "--data PATH --label COLUMN",
    )
    parser.add_argument("stage", choices=STAGES, metavar="command")
    parser.add_argument("--config", required=True, help="YAML job config, e.g. conf/adult.yaml")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. --set train.epochs=3 (repeatable)",
    )
    parser.add_argument(
        "--run-date",
        help="scope outputs to <output.root>/run_date=<date>; a re-run for the same "
        "date replaces them (scheduled workflows pass their logical date)",
    )
    parser.add_argument(
        "--model-uri", help="evaluate/register/score: model to use (default: last trained / @champion)"
    )
    parser.add_argument(
        "--input",
        help="score: raw rows to score (default: data.score_path or data.test_path); "
        "stream: the directory new files arrive in",
    )
    parser.add_argument(
        "--output",
        help="score: where predictions go (default: <output.root>/predictions); "
        "stream: default <output.root>/stream",
    )
    parser.add_argument(
        "--checkpoint",
        help="stream: the query's checkpoint; a restart with the same one continues "
        "(default: <output>/_checkpoint)",
    )
    parser.add_argument("--delta", help="contribute: the parameter delta, a file or an MLflow artifact URI")
    parser.add_argument("--contributor", default="anonymous", help="contribute: who submitted the delta")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["init"]:
        return _init(argv[1:])
    args = parse_args(argv)
    _configure_logging()
    try:
        cfg = load_config(args.config, args.overrides)
        if args.run_date:
            cfg = scoped_to_run_date(cfg, args.run_date)
        check_environment(cfg)

        with env_scope(_quiet_mlflow()):  # before the session: local executors inherit it
            spark = build_session(cfg.spark)
            log.info("Spark %s, %s", spark.version, describe_session(spark))
            try:
                print(COMMANDS[args.stage].run(spark, cfg, args))
            finally:
                if is_connect(spark):
                    # a Spark ML model (a loaded feature pipeline) still referenced at exit
                    # deletes its server-side copy through the active session when collected; at
                    # interpreter exit that call waits forever for a gRPC thread that can no
                    # longer start. With the session stopped, the delete is skipped
                    spark.stop()
        return 0
    except SparkMLDistError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        lost = _lost_driver(exc, args.stage)
        if lost is None:
            raise
        print(f"error: {lost}", file=sys.stderr)
        return 3


def check_environment(cfg: JobConfig) -> None:
    """What can be checked before any work, so a job does not fail minutes in (or after MLflow's
    minutes of retries) for a reason known at the start: the output root is writable and the
    tracking store answers."""
    from sparkml_dist.storage import check_writable  # pyarrow: a subcommand imports what it runs

    check_writable(cfg.output.root, "output.root")
    check_tracking_store(cfg.tracking)


def _lost_driver(exc: BaseException, stage: str) -> str | None:
    """One line for a driver JVM that died under the job, or None for any other exception.
    Which error surfaces depends on the moment of death: a refused connection, py4j's network
    error, or a plain Py4JError ("An error occurred while calling ...") when py4j gave up on
    the call itself; pyspark may wrap any of them. So the whole chain is read, and the JVM's
    exit status decides."""

    cause = _connection_failure(exc)
    if cause is None:
        return None
    how = driver_jvm_exit()
    from py4j.protocol import Py4JNetworkError

    if how is None and not isinstance(cause, Py4JNetworkError):
        return None
    return (
        f"the Spark driver's JVM {how or 'stopped answering'} during the {stage} job "
        f"({type(cause).__name__}: {_first_line(cause)}). Its own output above says why: "
        f"java.lang.OutOfMemoryError -> raise spark.driver.memory (spark.conf in the job config, or "
        f"spark-submit --driver-memory); nothing -> the OS may have killed it (dmesg). Outputs are "
        f"written atomically: re-running the same command is safe."
    )


def _connection_failure(exc: BaseException) -> BaseException | None:
    """The first error in `exc`'s chain (itself, its cause, its context) that a lost py4j
    connection raises, or None."""
    from py4j.protocol import Py4JError, Py4JJavaError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # A Py4JJavaError is an answer from a living JVM (the Java side threw), never a lost one.
        if isinstance(current, (ConnectionError, Py4JError)) and not isinstance(current, Py4JJavaError):
            return current
        current = current.__cause__ or current.__context__
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _init(argv: list[str]) -> int:
    """`sparkml-dist init --data PATH --label COLUMN`: print a complete config for a CSV with a
    header (no Spark: the header and pandas' type inference over the first rows)."""

    parser = argparse.ArgumentParser(
        prog="sparkml-dist init",
        description="print a complete job config for a CSV "
        "with a header: columns, inferred types and roles, the label's task",
    )
    parser.add_argument(
        "--data",
        required=True,
        help="the training rows: a CSV file with a header (or a directory "
        "of them), pkg://<package>/<file> too",
    )
    parser.add_argument("--label", required=True, help="the label column")
    parser.add_argument(
        "--test",
        help="held-out rows for the test metrics and the gate (default: --data; "
        "replace it with rows the model does not train on)",
    )
    parser.add_argument("--delimiter", default=",", help="field separator (default ',')")
    args = parser.parse_args(argv)
    data = {"train_path": args.data, "test_path": args.test or args.data, "label": {"column": args.label}}
    if args.delimiter != ",":
        data["delimiter"] = args.delimiter
    try:
        print(init_config(data))
    except SparkMLDistError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def scoped_to_run_date(cfg: JobConfig, run_date: str) -> JobConfig:
    if not re.fullmatch(r"[0-9A-Za-z_.:-]+", run_date):
        raise SparkMLDistError(
            f"--run-date {run_date!r}: use a date like 2026-11-29 (letters, digits, '-', '_', '.', ':')"
        )
    output = cfg.output.model_copy(
        update={"root": f"{cfg.output.root.rstrip('/')}/run_date={run_date}", "run_date": run_date}
    )
    return cfg.model_copy(update={"output": output})


def _quiet_mlflow() -> dict[str, str]:
    """MLflow draws a tqdm bar for every artifact download (a model load is one per file, 196 for
    a logged model here), rewritten in place: in a job's log that is thousands of characters of
    noise per stage. A job's log gets no bars unless the user asked for them."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    return {} if name in os.environ else {name: "false"}


def _configure_logging() -> None:
    """The CLI owns the process, so it may configure logging (library code never does)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    for noisy in ("py4j", "mlflow", "alembic", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_py4j_through_root)


def _not_py4j_through_root(record: logging.LogRecord) -> bool:
    """py4j logs a lost connection's traceback with `logging.info` (the root logger, so the
    level set for "py4j" does not reach it); the job's own error line says what happened."""
    return not (record.name == "root" and f"{os.sep}py4j{os.sep}" in record.pathname)


if __name__ == "__main__":
    sys.exit(main())
