"""Run a study: the data preprocessed once, up to `tune.parallel_trials` barrier training jobs at
once (Optuna's threads, one Spark job group each), every trial a nested MLflow run under the tune
job's run, then the best trial's model evaluated on the test split and registered through the
gate like any pipeline run. The best trial's model is reused as trained (on the train split,
validated on the validation split each epoch); it is not retrained.

A re-run of the same config continues the same study (Optuna's RDB storage): finished trials
(complete or pruned) are kept and only the missing ones run, including any a killed job left
unfinished (Optuna fails them once their heartbeat stops)."""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

from sparkml_dist import storage
from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.ingest import ingest
from sparkml_dist.data.sources import with_types_of
from sparkml_dist.errors import ConfigError, SlotError, SparkMLDistError
from sparkml_dist.spark.session import set_job_group, task_slots
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.tasks.base import get_task
from sparkml_dist.tracking.client import EpochLogger, RunHandle, end_run, log_params, start_run, tracked_run
from sparkml_dist.tune.reporting import TrialSink
from sparkml_dist.tune.space import suggest, trial_config
from sparkml_dist.tune.study import StudyRef, create_study, study_ref

if TYPE_CHECKING:
    import optuna

    from sparkml_dist.data.dataset import PreprocessResult
    from sparkml_dist.stages.register import RegistryDecision

log = logging.getLogger(__name__)


@dataclass
class TuneResult:
    study_name: str
    storage: str
    run_id: str  # the tune job's MLflow run; each trial is a nested run under it
    metric: str
    direction: str
    states: dict[str, int]  # trials of the study by final state (COMPLETE, PRUNED, FAIL)
    best_trial: int
    best_value: float
    best_params: dict[str, Any]
    model_uri: str
    test_metrics: dict[str, float]
    decision: RegistryDecision
    plots: list[str] = field(default_factory=list)


def run_tune(spark: SparkSession, cfg: JobConfig) -> TuneResult:
    from sparkml_dist.stages.preprocess import preprocess  # matplotlib, numpy: only once a tune job runs

    tune = cfg.tune
    if not tune.space:
        raise ConfigError(
            "tune.space is empty: give at least one key to search, e.g. "
            "tune.space: {train.learning_rate: {loguniform: [1.0e-4, 1.0e-2]}}"
        )
    _check_slots(spark, cfg)
    prep = preprocess(spark, cfg)
    ref, metric = study_ref(cfg, get_task(prep.manifest.target_spec.task))
    study = create_study(ref, tune)
    with tracked_run(cfg.tracking, "tune", cfg.flat_params()) as parent:
        client = parent.client()
        client.set_tag(parent.run_id, "tune.study", ref.name)
        client.set_tag(parent.run_id, "tune.storage", ref.storage_url)
        _optimize(spark, cfg, prep, parent, study, ref, metric)
        return _finish(spark, cfg, parent, study, ref, metric, prep.manifest.schema)


def _check_slots(spark: SparkSession, cfg: JobConfig) -> None:
    wanted = cfg.tune.parallel_trials * cfg.tune.ranks_per_trial
    slots = task_slots(spark, wanted=wanted)
    if wanted > slots:
        raise SlotError(
            slots,
            wanted,
            f" tune.parallel_trials={cfg.tune.parallel_trials} x tune.ranks_per_trial="
            f"{cfg.tune.ranks_per_trial} ranks run at once: lower either",
        )


def _optimize(
    spark,
    cfg: JobConfig,
    prep: PreprocessResult,
    parent: RunHandle,
    study: optuna.Study,
    ref: StudyRef,
    metric: str,
) -> None:
    import optuna

    tune = cfg.tune
    finished = _count(study, "COMPLETE", "PRUNED")
    missing = max(tune.trials - finished, 0)
    log.info(
        "tune: study %s (%s) has %d finished trial(s); running %d more, %d at a time, %d rank(s) each",
        ref.name,
        ref.storage_url,
        finished,
        missing,
        tune.parallel_trials,
        tune.ranks_per_trial,
    )
    if missing == 0:
        return
    progress = _Progress(missing, metric, tune.max_failed_trials)

    def objective(trial: optuna.Trial) -> float:
        return _run_trial(spark, cfg, prep, parent, trial, ref, metric)

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our progress lines say it once
    study.optimize(
        objective,
        n_trials=missing,
        timeout=tune.timeout_s,
        n_jobs=tune.parallel_trials,
        catch=(Exception,),
        callbacks=[progress],
    )
    if progress.failed > tune.max_failed_trials:
        raise SparkMLDistError(
            f"tune: {progress.failed} trials failed (tune.max_failed_trials={tune.max_failed_trials}); "
            f"the last: {progress.last_error}"
        )


def _run_trial(
    spark,
    cfg: JobConfig,
    prep: PreprocessResult,
    parent: RunHandle,
    trial: optuna.Trial,
    ref: StudyRef,
    metric: str,
) -> float:
    import optuna

    from sparkml_dist.stages.train import train  # matplotlib, numpy: only once a tune job runs

    values = suggest(trial, cfg.tune.space)
    root = storage.join(OutputPaths.of(cfg).root, "tune", "trials", str(trial.number))
    trial_cfg = trial_config(cfg, values, cfg.tune.ranks_per_trial, root)
    run = start_run(
        cfg.tracking,
        f"trial-{trial.number}",
        trial_cfg.flat_params(),
        tags={
            "mlflow.parentRunId": parent.run_id,
            "sparkml_dist.stage": "tune-trial",
            "tune.trial": str(trial.number),
            "tune.study": ref.name,
        },
    )
    trial.set_user_attr("run_id", run.run_id)
    # the trial's Spark jobs under one group in the UI (job groups are per thread)
    set_job_group(spark, f"tune-trial-{trial.number}", f"tune trial {trial.number}: {values}")
    # the storage id (not the number) is what reopens this trial in rank 0's process
    sink = TrialSink(EpochLogger(run), ref, trial._trial_id, metric)
    try:
        result = train(spark, trial_cfg, prep, run, sink=sink, label=f"trial {trial.number}")
    except Exception as exc:
        trial.set_user_attr("error", str(exc)[:1000])
        _close(run, "failed", ok=False, reason=str(exc))
        raise
    trial.set_user_attr("model_uri", result.model_uri)
    last = result.records[-1]
    value = last.metrics().get(metric)
    if value is None:
        _close(run, "failed", ok=False, reason=f"no {metric} in the last epoch record")
        raise SparkMLDistError(f"trial {trial.number}: its epochs report no {metric}")
    trial.set_user_attr("epochs", len(result.records))
    if len(result.records) < trial_cfg.train.epochs:
        _close(
            run, "pruned", ok=True, reason=f"after epoch {len(result.records)} of {trial_cfg.train.epochs}"
        )
        raise optuna.TrialPruned(f"pruned after epoch {len(result.records)}")
    _close(run, "complete", ok=True)
    return value


def _close(run: RunHandle, state: str, ok: bool, reason: str = "") -> None:
    client = run.client()
    client.set_tag(run.run_id, "tune.state", state)
    if reason:
        client.set_tag(run.run_id, "tune.reason", reason[:5000])
    end_run(run, ok=ok)


class _Progress:
    """One line per finished trial: its state and value, the best so far, what is left and an ETA."""

    def __init__(self, planned: int, metric: str, max_failed: int):
        self.planned, self.metric, self.max_failed = planned, metric, max_failed
        self.done, self.failed, self.last_error = 0, 0, ""
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        with self._lock:
            self.done += 1
            state = trial.state.name.lower()
            if state == "fail":
                self.failed += 1
                self.last_error = trial.user_attrs.get("error", "")
                if self.failed > self.max_failed:
                    study.stop()
            value = (
                f"{self.metric} {trial.value:.4f}"
                if trial.value is not None
                else trial.user_attrs.get("error", "")[:200]
            )
            best = _best(study)
            left = self.planned - self.done
            per_trial = (time.monotonic() - self.started) / self.done
            eta = per_trial * left
            log.info(
                "tune: trial %d %s (%s); %d/%d done, best %s; about %.0f s left",
                trial.number,
                state,
                value,
                self.done,
                self.planned,
                f"{best.value:.4f} (trial {best.number})" if best else "none yet",
                eta,
            )


def _best(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    try:
        return study.best_trial
    except ValueError:  # no complete trial yet
        return None


def _count(study: optuna.Study, *states: str) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state.name in states)


def _finish(
    spark,
    cfg: JobConfig,
    parent: RunHandle,
    study: optuna.Study,
    ref: StudyRef,
    metric: str,
    schema: Mapping[str, str],
) -> TuneResult:
    """The best trial's model evaluated on the test rows (read with the training rows' types,
    `schema`) and registered through the gate."""
    # matplotlib: only once a tune job runs
    from sparkml_dist.stages.evaluate import evaluate, log_report
    from sparkml_dist.stages.register import register

    best = _best(study)
    if best is None or best.value is None:
        raise SparkMLDistError(f"tune: study {ref.name} has no complete trial to register")
    best_value = float(best.value)
    # with one trial at a time Optuna runs them on this thread: its job group is a trial's
    set_job_group(spark, "tune", f"tune: the best trial ({best.number}) evaluated and registered")
    model_uri = best.user_attrs["model_uri"]
    log_params(parent, {f"best.{k}": str(v) for k, v in best.params.items()})
    client = parent.client()
    for key, value in (
        ("tune.best_trial", best.number),
        ("tune.best_run", best.user_attrs.get("run_id", "")),
        ("tune.best_model", model_uri),
    ):
        client.set_tag(parent.run_id, key, str(value))
    client.log_metric(parent.run_id, f"best_{metric}", best_value)
    plots = _log_plots(cfg, parent, study)
    with ingest(
        spark, cfg.data.test_path, with_types_of(cfg.data, schema), key="data.test_path"
    ) as test_input:
        report = evaluate(spark, cfg, model_uri, parent.tracking_uri, test_input.accepted)
        log_report(parent, report, cfg)
        decision = register(spark, cfg, parent, model_uri, report, test_input.accepted)
    _close_interrupted(study, parent.tracking_uri)
    states = {s: _count(study, s) for s in ("COMPLETE", "PRUNED", "FAIL")}
    return TuneResult(
        ref.name,
        ref.storage_url,
        parent.run_id,
        metric,
        ref.direction,
        states,
        best.number,
        best_value,
        dict(best.params),
        model_uri,
        report.metrics,
        decision,
        plots,
    )


def _close_interrupted(study: optuna.Study, tracking_uri: str) -> None:
    """Trials of a tune job that was killed: Optuna failed them once their heartbeat stopped; their
    MLflow runs, left RUNNING by the dead driver, end KILLED and say so."""
    import optuna
    from mlflow.tracking import MlflowClient

    with warnings.catch_warnings():  # experimental since Optuna 2.9, and the call this needs
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    client = MlflowClient(tracking_uri=tracking_uri)
    for trial in study.get_trials(deepcopy=False):
        run_id = trial.user_attrs.get("run_id")
        if trial.state.name != "FAIL" or not run_id or "error" in trial.user_attrs:
            continue
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_tag(run_id, "tune.state", "interrupted")
            client.set_tag(run_id, "tune.reason", "its tune job stopped while it ran; a re-run ran it again")
            client.set_terminated(run_id, status="KILLED")


def _log_plots(cfg: JobConfig, parent: RunHandle, study: optuna.Study) -> list[str]:
    """Optuna's optimisation history and parameter importances, as PNGs on the tune run."""
    import matplotlib
    import optuna

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    out = storage.local_path(storage.join(OutputPaths.of(cfg).plots, "tune"))
    written = []
    for name, draw in (
        ("optimization_history.png", ovm.plot_optimization_history),
        ("intermediate_values.png", ovm.plot_intermediate_values),  # where pruned trials stopped
        ("param_importances.png", ovm.plot_param_importances),
    ):
        try:
            with warnings.catch_warnings():  # Optuna marks its matplotlib plots experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                axes = draw(study)
        except (ValueError, RuntimeError) as exc:  # e.g. importances need two complete trials
            log.info("tune: no %s (%s)", name, exc)
            continue
        figure = getattr(axes, "figure", None) or plt.gcf()
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            path = out / name
            figure.savefig(path, dpi=110, bbox_inches="tight")
            parent.client().log_artifact(parent.run_id, str(path), "tune")
            written.append(str(path))
        plt.close(figure)
    return written


def result_lines(result: TuneResult) -> str:
    params = ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.best_params.items()
    )
    tests = ", ".join(
        f"{k} {v:.4f}"
        for k, v in sorted(result.test_metrics.items())
        if isinstance(v, float) and k not in ("rows", "unknown_label_rows")
    )
    return "\n".join(
        [
            "=== sparkml_dist tune summary ===",
            f"study          : {result.study_name} ({result.storage})",
            f"trials         : {result.states['COMPLETE']} complete, {result.states['PRUNED']} pruned, "
            f"{result.states['FAIL']} failed",
            f"best trial     : {result.best_trial}: {result.metric} {result.best_value:.4f} ({result.direction}) with {params}",
            f"test metrics   : {tests}",
            f"registry       : {result.decision.name} version {result.decision.version} -> alias "
            f"'{result.decision.alias}' ({result.decision.reason})",
            f"MLflow run     : {result.run_id} (one nested run per trial)",
            f"plots          : {', '.join(result.plots) or 'none'}",
        ]
    )
