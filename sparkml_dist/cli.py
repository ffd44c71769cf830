"""Command line: `sparkml-dist <stage> --config conf/adult.yaml [--set key=value ...]`.
The jobs/ scripts call this same entry, so spark-submit and the console script agree."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from sparkml_dist.config.loader import load_config
from sparkml_dist.errors import SparkMLDistError

STAGES = ("preprocess", "train", "evaluate", "register", "score", "pipeline", "finetune", "contribute", "federated")
log = logging.getLogger("sparkml_dist.cli")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sparkml-dist", description=__doc__)
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--config", required=True, help="YAML job config, e.g. conf/adult.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, e.g. --set train.epochs=3 (repeatable)")
    parser.add_argument("--run-date", help="scope outputs to <output.root>/run_date=<date>; a re-run for the same "
                                           "date replaces them (scheduled workflows pass their logical date)")
    parser.add_argument("--model-uri", help="evaluate/score: model to use (default: last trained / @champion)")
    parser.add_argument("--input", help="score: raw rows to score (default: data.score_path or data.test_path)")
    parser.add_argument("--output", help="score: where predictions go (default: <output.root>/predictions)")
    parser.add_argument("--delta", help="contribute: the parameter delta, a file or an MLflow artifact URI")
    parser.add_argument("--contributor", default="anonymous", help="contribute: who submitted the delta")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    _configure_logging()
    try:
        cfg = load_config(args.config, args.overrides)
        if args.run_date:
            cfg = scoped_to_run_date(cfg, args.run_date)
        from sparkml_dist.spark.session import build_session

        spark = build_session(cfg.spark)
        spark.sparkContext.setLogLevel("ERROR")
        log.info("Spark %s, master %s", spark.version, spark.sparkContext.master)
        print(_run_stage(args, cfg, spark))
        return 0
    except SparkMLDistError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def scoped_to_run_date(cfg, run_date: str):
    import re

    if not re.fullmatch(r"[0-9A-Za-z_.:-]+", run_date):
        raise SparkMLDistError(f"--run-date {run_date!r}: use a date like 2026-11-29 (letters, digits, '-', '_', '.', ':')")
    output = cfg.output.model_copy(update={"root": f"{cfg.output.root}/run_date={run_date}"})
    return cfg.model_copy(update={"output": output})


def _run_stage(args: argparse.Namespace, cfg, spark) -> str:
    from sparkml_dist import stages
    from sparkml_dist.pipeline import format_summary, log_report, run_pipeline
    from sparkml_dist.stages.paths import OutputPaths
    from sparkml_dist.tracking.client import RunHandle, resolve_tracking_uri, tracked_run

    paths = OutputPaths.of(cfg)
    if args.stage == "pipeline":
        return format_summary(run_pipeline(spark, cfg))
    if args.stage == "finetune":
        return _finetune(cfg, spark)
    if args.stage == "contribute":
        return _contribute(cfg, spark, args)
    if args.stage == "federated":
        return _federated(cfg, spark)
    if args.stage == "preprocess":
        prep = stages.preprocess(spark, cfg)
        return f"preprocess: {json.dumps(prep.manifest.inputs)} -> {prep.path} (manifest {prep.path}/manifest.json)"
    if args.stage == "train":
        from sparkml_dist.data.dataset import Manifest

        prep = stages.PreprocessResult(str(paths.preprocess), Manifest.load(paths.preprocess))
        with tracked_run(cfg.tracking, "train", cfg.flat_params()) as run:
            result = stages.train(spark, cfg, prep, run)
        last = result.history[-1]
        return (f"train: run {result.run_id}, model {result.model_uri}, rows per rank {result.rank_samples}, "
                f"val_accuracy {last['val_accuracy']:.4f}, ranks in step: {result.ranks_in_step}")
    if args.stage in ("evaluate", "register"):
        last = json.loads(paths.last_train.read_text()) if paths.last_train.exists() else {}
        uri = args.model_uri or last.get("model_uri")
        if not uri:
            raise SparkMLDistError(f"{args.stage}: no --model-uri given and no train stage output under "
                                   f"{paths.root}; run the train stage first")
        uri_tracking = resolve_tracking_uri(cfg.tracking)
        if args.stage == "evaluate":
            report = stages.evaluate(spark, cfg, uri, uri_tracking)
            paths.last_evaluate.write_text(json.dumps({"model_uri": uri, "metrics": report.metrics}))
            if last.get("run_id") and not args.model_uri:
                log_report(RunHandle(uri_tracking, last["run_id"], ""), report, cfg)
            return "evaluate: " + json.dumps(report.metrics, indent=1)
        evaluated = json.loads(paths.last_evaluate.read_text()) if paths.last_evaluate.exists() else {}
        if evaluated.get("model_uri") != uri:
            raise SparkMLDistError(f"register: {uri} has not been evaluated; run the evaluate stage first")
        decision = stages.register(spark, cfg, RunHandle(uri_tracking, last["run_id"], ""), uri, evaluated["metrics"])
        return f"register: {decision.name} version {decision.version} -> {decision.alias} ({decision.reason})"
    result = stages.score(spark, cfg, args.model_uri, args.input, args.output)
    return (f"score: {result.input_rows:,} rows in, {result.scored_rows:,} scored, {result.rejected_rows:,} rejected "
            f"-> {result.path} (model {result.model_uri})")


def _finetune(cfg, spark) -> str:
    from sparkml_dist.stages.finetune import finetune, result_lines
    from sparkml_dist.tracking.client import tracked_run

    with tracked_run(cfg.tracking, "finetune", cfg.flat_params()) as run:
        return result_lines(finetune(spark, cfg, run))


def _contribute(cfg, spark, args) -> str:
    from sparkml_dist.stages.contribute import contribute
    from sparkml_dist.tracking.client import tracked_run

    if not args.delta:
        raise SparkMLDistError("contribute: give the delta with --delta <file or runs:/... URI>")
    with tracked_run(cfg.tracking, "contribute", cfg.flat_params()) as run:
        verdict = contribute(spark, cfg, run, args.delta, args.contributor)
    status = f"accepted as version {verdict.version}" if verdict.accepted else "REJECTED"
    return f"contribute: {args.delta} from {args.contributor} {status}: {verdict.reason} (sha256 {verdict.sha256[:12]})"


def _federated(cfg, spark) -> str:
    from sparkml_dist.federated.server import result_lines, run_federated
    from sparkml_dist.tracking.client import tracked_run

    with tracked_run(cfg.tracking, "federated", cfg.flat_params()) as run:
        return result_lines(run_federated(spark, cfg, run), cfg)


def _configure_logging() -> None:
    """The CLI owns the process, so it may configure logging (library code never does)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("py4j", "mlflow", "alembic", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


if __name__ == "__main__":
    sys.exit(main())
