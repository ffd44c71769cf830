"""Where a run's artifacts go: with a sqlite store, beside the store, whatever the working directory."""

from __future__ import annotations

from pathlib import Path

from stores import fresh_store

from sparkml_dist.config.schema import TrackingConfig
from sparkml_dist.tracking.client import artifact_location, tracked_run


def test_artifacts_land_beside_a_sqlite_store_not_in_the_working_directory(tmp_path, monkeypatch):
    store = fresh_store(tmp_path / "store")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a scheduled job started in some other directory
    cfg = TrackingConfig(tracking_uri=store, experiment="team/adult income")
    with tracked_run(cfg, "train", {}) as run:
        run.client().log_text(run.run_id, "hello", "notes/hello.txt")
    again = TrackingConfig(tracking_uri=store, experiment="team/adult income")
    with tracked_run(again, "train", {}) as second:  # the experiment exists now: the same place
        second.client().log_text(second.run_id, "again", "notes/hello.txt")

    folder = Path(artifact_location(store, "team/adult income"))
    assert folder.parent == tmp_path / "store" / "mlruns" and folder.name.startswith("team_adult_income-")
    assert (folder / run.run_id / "artifacts" / "notes" / "hello.txt").read_text() == "hello"
    assert (folder / second.run_id / "artifacts" / "notes" / "hello.txt").read_text() == "again"
    assert not any(elsewhere.iterdir()), "nothing written where the job happened to run"
    (tmp_path / "download").mkdir()
    downloaded = run.client().download_artifacts(run.run_id, "notes/hello.txt", str(tmp_path / "download"))
    assert Path(downloaded).read_text() == "hello"


def test_experiments_whose_names_differ_only_in_unsafe_characters_get_their_own_folders(tmp_path):
    store = fresh_store(tmp_path / "store")
    folders = {
        name: artifact_location(store, name) for name in ("team/a b", "team a/b", "team_a_b", "/", "?")
    }
    assert len(set(folders.values())) == len(folders), folders
    assert Path(folders["team_a_b"]).name == "team_a_b", "a name that is a safe folder name is kept as it is"
    for name in ("team/a b", "/"):
        assert artifact_location(store, name) == folders[name], (
            "the same experiment, the same folder, every time"
        )


def test_a_version_registered_from_another_runs_model_points_at_that_runs_files(tmp_path):
    """A tune job registers its best trial's model (logged by a nested run) from its own run: the
    version must name the trial's files, or nothing can load it."""
    from mlflow.tracking import MlflowClient

    from sparkml_dist.tracking.models import register

    store = fresh_store(tmp_path / "store")
    cfg = TrackingConfig(tracking_uri=store, experiment="tuning")
    with tracked_run(cfg, "tune-trial", {}) as trial:
        trial.client().log_text(trial.run_id, "{}", "model/MLmodel")
    with tracked_run(cfg, "tune", {}) as parent:
        number = register(parent, f"runs:/{trial.run_id}/model", "tuned", {"gate_reason": "test"})
    version = MlflowClient(store, registry_uri=store).get_model_version("tuned", number)
    assert version.run_id == trial.run_id
    assert (
        Path(version.source)
        == Path(artifact_location(store, "tuning")) / trial.run_id / "artifacts" / "model"
    )
    assert (Path(version.source) / "MLmodel").exists()


def test_a_model_whose_files_are_gone_is_a_clear_error_naming_it(tmp_path):
    import pytest

    from sparkml_dist.errors import StorageError
    from sparkml_dist.tracking.models import load_bundle

    store = fresh_store(tmp_path / "store")
    with tracked_run(TrackingConfig(tracking_uri=store, experiment="gone"), "train", {}) as run:
        pass
    with pytest.raises(
        StorageError, match=f"runs:/{run.run_id}/model: its model files at .* cannot be downloaded"
    ):
        load_bundle(f"runs:/{run.run_id}/model", store, dst=str(tmp_path / "dst"))
