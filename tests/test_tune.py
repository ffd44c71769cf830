"""Hyperparameter search (`sparkml-dist tune`): the search space checked at load, losing trials
stopped at an epoch end on every rank, and a study run as docs/tuning.md shows it: trials at
once on real Spark, nested MLflow runs, the tune job SIGKILLed and re-run to continue the study,
the best model registered through the gate."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_training import job_for

from sparkml_dist.config import load_config
from sparkml_dist.errors import ConfigError
from sparkml_dist.launch import TorchBackend, run_barrier
from sparkml_dist.tasks.base import Evaluation
from sparkml_dist.train.loop import train_rank
from sparkml_dist.train.records import EpochRecord

ROOT = Path(__file__).resolve().parents[1]
TUNE = ".venv/bin/python -m sparkml_dist.cli tune --config conf/adult.yaml --set tune.trials=4 --set train.epochs=2"


@pytest.mark.parametrize(
    "space, words",
    [
        (
            "{train.learnin_rate: {loguniform: [1.0e-4, 1.0e-2]}}",
            "tune.space.train.learnin_rate: not a config key",
        ),
        (
            "{train.epochs: {int: [0, 3]}}",
            "tune.space.train.epochs: 0 is not a valid value here: train.epochs: "
            "Input should be greater than or equal to 1",
        ),
        (
            "{model.hidden: {choice: [[64], 'wide']}}",
            'tune.space.model.hidden: "wide" is not a valid value here',
        ),
        ("{train.learning_rate: {uniform: [0.1, 0.01]}}", "low < high"),
        (
            "{train.epochs: {int: [1, 3], choice: [2]}}",
            "give exactly one of loguniform, uniform, int, choice",
        ),
        (
            "{features.one_hot: {choice: [true, false]}}",
            "tune.space.features.one_hot: trials share one preprocess output",
        ),
        ("{train.num_ranks: {int: [1, 2]}}", "set that instead"),
        # Optuna's spelling: the forms this schema takes, with Optuna's log range translated
        (
            "{train.learning_rate: {low: 1.0e-4, high: 1.0e-2, log: true}}",
            "tune.space.train.learning_rate.low: unknown key; a range is {loguniform: [low, high]}, {uniform: [low, high]} "
            "(step: n), {int: [low, high]} (log: true, step: n) or {choice: [values]}; Optuna's suggest_float(name, low, "
            "high, log=True) is {loguniform: [low, high]}",
        ),
    ],
)
def test_a_search_space_outside_the_config_schema_is_refused_at_load(adult_config_path, space, words):
    with pytest.raises(ConfigError) as err:
        load_config(adult_config_path, [f"tune.space={space}"])
    assert words in str(err.value)


def test_the_documented_search_space_loads(adult_config_path):
    tune = load_config(adult_config_path).tune
    assert set(tune.space) == {"train.learning_rate", "model.hidden", "model.dropout"}
    assert tune.space["model.hidden"].kind == "choice" and tune.parallel_trials * tune.ranks_per_trial <= 2


def test_tune_metric_may_name_an_extra_held_out_metric_of_the_task(adult_config_path):
    """An imbalanced binary label is tuned on roc_auc (each epoch computes it); a metric the
    epochs do not compute is refused, naming those they do."""
    from sparkml_dist.tasks import get_task
    from sparkml_dist.tune.study import study_ref

    ref, metric = study_ref(load_config(adult_config_path, ["tune.metric=roc_auc"]), get_task("binary"))
    assert (ref.direction, metric) == ("maximize", "val_roc_auc")
    ref, metric = study_ref(load_config(adult_config_path, ["tune.metric=macro_f1"]), get_task("multiclass"))
    assert (ref.direction, metric) == ("maximize", "val_macro_f1")
    with pytest.raises(
        ConfigError,
        match=r"tune.metric 'roc_auc': each epoch validates the multiclass model on "
        r"'accuracy', 'macro_f1', 'loss'; use one of those",
    ):
        study_ref(load_config(adult_config_path, ["tune.metric=roc_auc"]), get_task("multiclass"))


def test_a_trial_that_trails_the_median_is_pruned(tmp_path):
    """The reporter rank 0 runs: a trial whose epoch-0 accuracy trails the finished trials' is stopped."""
    import optuna

    from sparkml_dist.tracking.client import EpochLogger, RunHandle
    from sparkml_dist.tune.reporting import TrialSink
    from sparkml_dist.tune.study import StudyRef

    ref = StudyRef(f"sqlite:///{tmp_path / 'study.db'}", "s", "maximize", "median", 1)
    study = optuna.create_study(study_name="s", storage=ref.storage_url, direction="maximize")
    good = study.ask()
    good.report(0.84, 0)
    study.tell(good, 0.85)
    record = lambda acc: EpochRecord(0, 0.5, 100, 1.0, Evaluation("val", 0.5, "accuracy", acc))  # noqa: E731
    for accuracy, pruned in ((0.60, True), (0.86, False)):
        trial = study.ask()
        sink = TrialSink(EpochLogger(RunHandle("", "", "")), ref, trial._trial_id, "val_accuracy")
        assert sink.open_trial().report(record(accuracy)) is pruned
        study.tell(
            trial,
            state=optuna.trial.TrialState.PRUNED if pruned else optuna.trial.TrialState.COMPLETE,
            values=None if pruned else accuracy,
        )


def test_a_seeded_study_draws_the_same_values_per_trial_whatever_order_parallel_trials_ask_in(
    adult_config_path,
):
    import optuna

    from sparkml_dist.tune.samplers import trial_seeded_tpe
    from sparkml_dist.tune.space import suggest

    space = load_config(adult_config_path).tune.space

    def draws(order: list[int]) -> dict[int, dict]:
        study = optuna.create_study(sampler=trial_seeded_tpe(5), direction="maximize")
        trials = [study.ask() for _ in order]  # all running at once, as parallel trials are
        return {trials[i].number: suggest(trials[i], space) for i in order}

    assert draws([0, 1, 2]) == draws([2, 0, 1])
    other = optuna.create_study(sampler=trial_seeded_tpe(6), direction="maximize")
    assert suggest(other.ask(), space) != draws([0])[0], "another seed, other values"


@dataclass(frozen=True)
class StopAfterFirstEpoch:
    """An epoch sink that may stop training, and does after epoch 0 (as a pruner would)."""

    may_stop: bool = True

    def __call__(self, record) -> bool:
        return record.epoch == 0

    def open(self) -> StopAfterFirstEpoch:
        return self

    def close(self) -> None:
        pass


@pytest.mark.spark
def test_a_sink_that_says_stop_ends_every_rank_after_that_epoch(spark, adult_prep, tmp_path):
    from dataclasses import replace

    cfg, prep = adult_prep
    job = replace(job_for(cfg, prep, tmp_path / "ckpt", "epochs=3"), sink=StopAfterFirstEpoch())
    results = run_barrier(spark, train_rank, job, 2, TorchBackend(timeout_s=120))
    assert [len(r.records) for r in results] == [1, 1], "both ranks stopped after epoch 0 of 3"
    assert results[0].stats.param_checksum == results[1].stats.param_checksum, "and agree on the weights"


def _study(workdir: Path):
    import optuna

    return optuna.load_study(
        study_name="tune-adult_income_mlp", storage=f"sqlite:///{workdir / 'output/adult/tune/study.db'}"
    )


def _finished(study) -> list:
    return [t for t in study.get_trials() if t.state.name in ("COMPLETE", "PRUNED")]


def _finished_so_far(workdir: Path) -> int:
    """How many trials the running job has finished, read from its database without opening it
    as optuna storage: that would create optuna's tables while the job is creating them."""
    db = workdir / "output/adult/tune/study.db"
    if not db.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
            return conn.execute(
                "SELECT count(*) FROM trials WHERE state IN ('COMPLETE', 'PRUNED')"
            ).fetchone()[0]
    except sqlite3.OperationalError:  # no tables yet
        return 0


@pytest.mark.spark
@pytest.mark.slow
def test_a_study_as_the_docs_run_it_survives_a_killed_driver(tmp_path):
    """Two trials at once; the tune job is SIGKILLed once a trial has finished, the same command
    run again continues the study (finished trials kept, the killed ones run again), and the best
    trial's model is registered through the gate."""
    from mlflow.tracking import MlflowClient

    from sparkml_dist.tracking.models import load_bundle

    assert TUNE in (ROOT / "docs" / "tuning.md").read_text(), f"docs/tuning.md shows `{TUNE}`"
    for name in ("conf", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKML_DIST_", "MLFLOW_TRACKING"))}
    first = subprocess.Popen(
        TUNE,
        shell=True,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and first.poll() is None:
            time.sleep(2)
            if _finished_so_far(tmp_path):
                break
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    before = {t.number: t.value for t in _finished(_study(tmp_path))}
    assert before and len(before) < 4, "killed with the study part done"

    done = subprocess.run(
        TUNE, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert f"has {len(before)} finished trial(s); running {4 - len(before)} more" in done.stderr
    study = _study(tmp_path)
    finished = {t.number: t.value for t in _finished(study)}
    assert len(finished) == 4 and all(finished[n] == v for n, v in before.items()), "finished trials kept"

    out = done.stdout
    assert (
        "=== sparkml_dist tune summary ===" in out
        and "registry       : adult_income_mlp version 1 -> alias 'champion'" in out
    )
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    tune_run = next(
        r
        for r in client.search_runs(client.get_experiment_by_name("adult_income").experiment_id)
        if r.info.run_name == "tune" and r.info.status == "FINISHED"
    )
    champion = client.get_model_version_by_alias("adult_income_mlp", "champion")
    assert champion.run_id == tune_run.data.tags["tune.best_run"], "the version is the best trial's model"
    bundle = load_bundle(
        "models:/adult_income_mlp@champion",
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        dst=str(tmp_path / "champion"),
    )
    assert bundle.weights, "the registered version's artifacts download (a scoring job can load it)"
    trials = client.search_runs(
        tune_run.info.experiment_id, f"tags.mlflow.parentRunId = '{tune_run.info.run_id}'"
    )
    states = {r.data.tags["tune.trial"]: r.data.tags.get("tune.state") for r in trials}
    assert sum(s in ("complete", "pruned") for s in states.values()) == 4 - len(before)
    assert tune_run.data.tags["tune.best_trial"] in {str(n) for n in finished}
    assert tune_run.data.metrics["test_accuracy"] >= 0.84
    pruned = [r for r in trials if r.data.tags.get("tune.state") == "pruned"]
    assert pruned, "conf/adult.yaml's seed gives trials 2-5 a learning rate near 1e-5: the pruner stops them"
    history = client.get_metric_history(pruned[0].info.run_id, "val_accuracy")
    assert len(history) == 1, "a pruned trial's ranks stopped after its first epoch of 2"
    spans = sorted((r.info.start_time, r.info.end_time) for r in trials if r.info.end_time)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans)), "two trials ran at once"
    artifacts = {a.path for a in client.list_artifacts(tune_run.info.run_id, "tune")}
    assert "tune/optimization_history.png" in artifacts
    all_runs = client.search_runs(tune_run.info.experiment_id, "tags.`sparkml_dist.stage` = 'tune-trial'")
    killed = [r for r in all_runs if r.data.tags.get("tune.state") == "interrupted"]
    assert killed and all(r.info.status == "KILLED" for r in killed), (
        "the trials the kill cut short end KILLED"
    )
    failed = {t.number for t in study.get_trials() if t.state.name == "FAIL"}
    assert {int(r.data.tags["tune.trial"]) for r in killed} <= failed


@pytest.mark.spark
def test_more_trial_ranks_than_slots_are_refused_before_any_trial(spark, make_adult_config, tmp_path):
    from sparkml_dist.errors import SlotError
    from sparkml_dist.tune import run_tune

    cfg = make_adult_config("tune.parallel_trials=3", "tune.ranks_per_trial=2")
    with pytest.raises(
        SlotError,
        match=r"4 task slots available, 6 ranks requested.*tune.parallel_trials=3 x "
        r"tune.ranks_per_trial=2",
    ):
        run_tune(spark, cfg)
    assert not (tmp_path / "out" / "preprocess").exists(), "refused before preprocessing"
