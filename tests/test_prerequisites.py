"""A missing or old Java, or a bad config, is a clear message, not a stack trace."""

import subprocess
import sys

import pytest

from sparkml_dist.errors import PrerequisiteError
from sparkml_dist.spark.session import check_java


def fake_java(tmp_path, version_line):
    bin_dir = tmp_path / "jdk" / "bin"
    bin_dir.mkdir(parents=True)
    java = bin_dir / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(0o755)
    return str(tmp_path / "jdk")


def test_old_java_is_named_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", fake_java(tmp_path, 'openjdk version "11.0.2" 2019-01-15'))
    with pytest.raises(PrerequisiteError, match=r"Java 11 found .* needs Java 17\+.*openjdk-17"):
        check_java()


def test_missing_java_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(PrerequisiteError, match="Java not found"):
        check_java()


def test_java_17_passes():
    assert check_java() >= 17


def test_setup_script_refuses_old_java_clearly(tmp_path):
    env = {"JAVA_HOME": fake_java(tmp_path, 'java version "1.8.0_292"'), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(["bash", "scripts/check_java.sh"], env=env, capture_output=True, text=True)
    assert out.returncode == 1
    assert "Java 8 found" in out.stderr and "needs Java 17+" in out.stderr


def test_cli_reports_a_bad_config_key_without_a_traceback(tmp_path, adult_config_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkml_dist.cli",
            "train",
            "--config",
            str(adult_config_path),
            "--set",
            "train.num_rankz=2",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "train.num_rankz: unknown key" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_suites_jvms_map_the_class_archive_that_setup_dumped(spark):
    """`make test` dumps the classes a Spark job loads (scripts/spark_class_archive.py) and
    tests/conftest.py hands the archive to every JVM the tests start: without it each of them parses
    and verifies ~14,000 classes again. A setup whose dump failed would only be slower, so check it."""
    import os
    import re
    import shutil
    from pathlib import Path

    archive = Path(sys.prefix) / "spark-classes.jsa"
    options = os.environ.get("JDK_JAVA_OPTIONS", "")
    assert archive.is_file(), (
        f"{archive}: `make test` dumps it (scripts/test_assets.sh); see {archive.with_name('spark-class-archive.log')}"
    )
    if f"-XX:SharedArchiveFile={archive}" not in options:
        pytest.skip(
            f"JDK_JAVA_OPTIONS={options!r} was set before the tests started; conftest leaves it as it is"
        )
    jcmd = shutil.which(
        "jcmd", path=os.path.join(os.environ.get("JAVA_HOME", "/usr"), "bin")
    ) or shutil.which("jcmd")
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    info = subprocess.run([jcmd, str(pid), "VM.info"], capture_output=True, text=True, timeout=60).stdout
    mapped = re.search(r"CDS archive\(s\) mapped at: .*size (\d+)", info)
    assert mapped, f"the session's JVM mapped no class archive:\n{info[:2000]}"
    assert int(mapped.group(1)) > archive.stat().st_size, (
        "only the JDK's own archive was mapped, not the Spark one"
    )


def _cli(config, tmp_path, *overrides, **popen):
    """The CLI's preprocess with outputs and the store in `tmp_path`, then `overrides`."""
    return [
        sys.executable,
        "-m",
        "sparkml_dist.cli",
        "preprocess",
        "--config",
        str(config),
        "--set",
        f"output.root={tmp_path / 'out'}",
        "--set",
        f"tracking.tracking_uri=sqlite:///{tmp_path}/m.db",
        *(arg for o in overrides for arg in ("--set", o)),
    ]


def test_an_output_root_that_cannot_be_written_is_named_before_any_work(tmp_path, adult_config_path):
    (tmp_path / "a_file").write_text("")
    out = subprocess.run(
        _cli(adult_config_path, tmp_path, f"output.root={tmp_path}/a_file/out"),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: output.root {tmp_path}/a_file/out: this job cannot write there (Not a directory); give a "
        f"directory it can write, e.g. --set output.root=/tmp/sparkml_dist"
    )
    assert "Spark 4" not in out.stderr, "checked before a Spark session starts"


def test_a_tracking_server_that_does_not_answer_is_named_within_seconds(tmp_path, adult_config_path):
    """A port that accepts connections and never answers (a hung server, a black-holing proxy):
    MLflow's own client retries it for minutes; the job says so in seconds."""
    import socket
    import time

    with socket.create_server(("127.0.0.1", 0)) as hung:
        uri = f"http://127.0.0.1:{hung.getsockname()[1]}"
        start = time.monotonic()
        out = subprocess.run(
            _cli(adult_config_path, tmp_path, f"tracking.tracking_uri={uri}"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        seconds = time.monotonic() - start
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: tracking.tracking_uri {uri}: the tracking server does not answer (timed out; waited at most 5 s); "
        f"start it (mlflow server ...) or set tracking.tracking_uri to one that answers"
    )
    assert seconds < 20, seconds


def test_a_sqlite_store_in_a_folder_that_cannot_be_made_is_named(tmp_path, adult_config_path):
    (tmp_path / "a_file").write_text("")
    uri = f"sqlite:///{tmp_path}/a_file/m.db"
    out = subprocess.run(
        _cli(adult_config_path, tmp_path, f"tracking.tracking_uri={uri}"), capture_output=True, text=True
    )
    assert out.returncode == 2
    assert f"error: tracking.tracking_uri {uri}: the sqlite store's folder" in out.stderr


@pytest.mark.spark
def test_a_driver_jvm_that_dies_under_a_job_is_one_line_and_a_rerun_is_safe(tmp_path, adult_config_path):
    import time

    import psutil

    job = subprocess.Popen(_cli(adult_config_path, tmp_path), stderr=subprocess.PIPE, text=True)
    lines = []
    for line in job.stderr:
        lines.append(line)
        if ", master local" in line:  # the session is up: the job has started its first stage
            time.sleep(1)
            for child in psutil.Process(job.pid).children(recursive=True):
                if child.name() == "java":
                    child.kill()
            break
    lines += job.stderr.read().splitlines()
    stderr = "\n".join(lines)
    assert job.wait(timeout=120) == 3, stderr[-3000:]
    assert "Traceback" not in stderr and "Exception while sending command" not in stderr, stderr[-3000:]
    assert lines[-1].startswith(
        "error: the Spark driver's JVM was killed by signal 9 during the preprocess job ("
    ), lines[-1]
    assert not list((tmp_path / "out").rglob("manifest.json")), "no half-written output"
    again = subprocess.run(_cli(adult_config_path, tmp_path), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert '"train": {"input": 32561, "accepted": 32561, "rejected": 0}' in again.stdout
