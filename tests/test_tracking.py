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
    folders = {name: artifact_location(store, name) for name in ("team/a b", "team a/b", "team_a_b", "/", "?")}
    assert len(set(folders.values())) == len(folders), folders
    assert Path(folders["team_a_b"]).name == "team_a_b", "a name that is a safe folder name is kept as it is"
    for name in ("team/a b", "/"):
        assert artifact_location(store, name) == folders[name], "the same experiment, the same folder, every time"
