"""Reads and writes outside Spark, by URI: the Parquet shards the ranks read, the manifest,
checkpoints and the stages' JSON records.

A location is a plain path (relative paths are made absolute against the working directory) or
a URI. Each scheme is one entry of `SCHEMES`; Spark is given the same location through
`spark_path`, so both sides name the same files:

| scheme | here | Spark |
|---|---|---|
| plain path, `file://` | the local (or mounted) file system | `file://<absolute path>` |
| `dbfs:/x` | `/dbfs/x`, the FUSE mount on Databricks | `dbfs:/x` |
| `s3://`, `s3a://`, `s3n://` | `pyarrow.fs.S3FileSystem` (query: `region`, `endpoint_override`, `scheme`) | as given |
| `gs://` | `pyarrow.fs.GcsFileSystem` | as given |
| `abfs://`, `abfss://` | `pyarrow.fs.AzureFileSystem` | as given |
| `hdfs://`, `viewfs://` | `pyarrow.fs.HadoopFileSystem` (needs libhdfs and the Hadoop CLASSPATH) | as given |

Writes are atomic: on a local or HDFS path a temporary sibling is renamed over the target; on an
object store (no rename) the object is uploaded in one request, which the store makes visible
whole or not at all.
"""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from sparkml_dist.errors import StorageError
from sparkml_dist.registry import Registry

HIDDEN_PREFIXES = (".", "_")  # Spark's _SUCCESS, staging files, checksums


@dataclass(frozen=True)
class Scheme:
    """How one URI scheme is reached from Python.

    `filesystem(uri)` returns the pyarrow file system and the path inside it; `local_root` maps the
    URI onto a local mount instead (dbfs:/ -> /dbfs); `atomic_rename`: the file system renames
    atomically (a write goes to a temporary sibling first), else each object is one upload."""

    name: str
    filesystem: Callable[[str], tuple[pafs.FileSystem, str]] | None = None
    local_root: str | None = None
    atomic_rename: bool = False


SCHEMES: Registry[Scheme] = Registry("storage scheme", builtin_modules=())


@dataclass(frozen=True)
class Location:
    uri: str  # as the caller names it (absolute)
    fs: pafs.FileSystem | None  # None: the local file system, used through os
    path: str  # local path, or the path inside `fs`
    atomic_rename: bool = True

    @property
    def is_local(self) -> bool:
        return self.fs is None

    @property
    def remote(self) -> pafs.FileSystem:
        """The file system of a location that is not local (callers check `is_local` first)."""
        if self.fs is None:
            raise StorageError(f"{self.uri}: a local path, read through os, not a remote file system")
        return self.fs


def register_scheme(scheme: Scheme, *, replace: bool = False) -> Scheme:
    return SCHEMES.register(scheme.name, scheme, replace=replace)


def _scheme_of(uri: str) -> str:
    head, sep, _ = uri.partition(":")
    # a Windows drive letter or a plain path has no scheme; file: and dbfs: may have one slash
    return head.lower() if sep and len(head) > 1 and "/" not in head else ""


def has_scheme(uri: str) -> bool:
    """A URI (`s3://b/k`, `file:///x`, `dbfs:/x`, `runs:/<id>/x`), not a plain path."""
    return _scheme_of(str(uri)) != ""


def is_remote(uri: str) -> bool:
    """Reached through a remote file system (`s3://`, `gs://`, `abfss://`, `hdfs://`, a scheme no
    one registered), decided from the scheme alone, without connecting: a plain path, `file://`
    and a mounted scheme (`dbfs:/` -> /dbfs) are this machine's files."""
    scheme = _scheme_of(str(uri))
    if scheme in ("", "file"):
        return False
    return scheme not in SCHEMES or SCHEMES.get(scheme).local_root is None


def locate(uri: str) -> Location:
    """Where `uri` lives, for reading and writing from Python."""
    uri = str(uri)
    scheme = _scheme_of(uri)
    if scheme in ("", "file"):
        return Location(absolute(uri), None, _local_path_of(uri))
    entry = _scheme(scheme, uri)
    if entry.local_root is not None:
        rest = uri.split(":", 1)[1].lstrip("/")
        return Location(uri, None, str(Path(entry.local_root) / rest))
    if entry.filesystem is None:
        raise StorageError(f"{uri}: storage scheme '{scheme}' names neither a file system nor a local root")
    fs, path = entry.filesystem(uri)
    return Location(uri, fs, path.rstrip("/"), entry.atomic_rename)


def _scheme(scheme: str, uri: str) -> Scheme:
    if scheme not in SCHEMES:
        raise StorageError(
            f"{uri}: no storage for scheme '{scheme}://'; known: file, "
            f"{', '.join(n for n in SCHEMES.names())} (or a plain path). Register one with "
            f"sparkml_dist.storage.register_scheme"
        )
    return SCHEMES.get(scheme)


def _local_path_of(uri: str) -> str:
    if uri.startswith("file:"):
        rest = uri[len("file:") :]
        if rest.startswith("//"):
            rest = rest[2:]
            if not rest.startswith("/"):  # file://host/path: only the local host is this machine
                host, _, path = rest.partition("/")
                if host not in ("", "localhost"):
                    raise StorageError(
                        f"{uri}: file:// with host '{host}' is not this machine; use file:///path"
                    )
                rest = "/" + path
        return str(Path(rest).resolve())
    return str(Path(uri).expanduser().resolve())


def absolute(uri: str) -> str:
    """A plain path made absolute (a local directory as the user meant it from their working
    directory); a URI unchanged."""
    uri = str(uri)
    return _local_path_of(uri) if _scheme_of(uri) in ("", "file") and not uri.startswith("file:") else uri


def join(uri: str, *parts: str) -> str:
    out = str(uri).rstrip("/")
    for part in parts:
        out = f"{out}/{str(part).strip('/')}"
    return out


def name_of(uri: str) -> str:
    return str(uri).rstrip("/").rsplit("/", 1)[-1]


def spark_path(uri: str) -> str:
    """The same location as Spark should be told it: a local path as an explicit `file://` URI
    (a bare path would resolve against the cluster's default file system, e.g. HDFS)."""
    uri = str(uri)
    if _scheme_of(uri) in ("", "file"):
        # not Path.as_uri(): it percent-encodes ('=' in run_date=...), which Hadoop keeps literally
        return "file://" + _local_path_of(uri)
    return uri


def local_path(uri: str) -> Path | None:
    """The local (or mounted) path of `uri`, or None when it is only reachable remotely."""
    loc = locate(uri)
    return Path(loc.path) if loc.is_local else None


def check_writable(uri: str, key: str) -> None:
    """A local `uri` is a directory this process can write (made if missing), checked before a
    job spends minutes on work it then cannot save; a remote one is left to its first write."""
    path = local_path(absolute(uri))
    if path is None:
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise StorageError(
            f"{key} {uri}: this job cannot write there ({exc.strerror or exc}); give a "
            f"directory it can write, e.g. --set {key}=/tmp/sparkml_dist"
        ) from None


# ---- reads -----------------------------------------------------------------------------------


def exists(uri: str) -> bool:
    loc = locate(uri)
    if loc.is_local:
        return os.path.exists(loc.path)
    return loc.remote.get_file_info(loc.path).type != pafs.FileType.NotFound


def is_dir(uri: str) -> bool:
    loc = locate(uri)
    if loc.is_local:
        return os.path.isdir(loc.path)
    return loc.remote.get_file_info(loc.path).type == pafs.FileType.Directory


@dataclass(frozen=True)
class Entry:
    uri: str
    name: str
    is_dir: bool
    size: int
    mtime_ns: int


def list_dir(uri: str) -> list[Entry]:
    """Entries directly under `uri` (hidden and `_` files left out), by name; [] if it is absent."""
    loc = locate(uri)
    if loc.is_local:
        if not os.path.isdir(loc.path):
            return []
        entries = []
        for e in os.scandir(loc.path):
            if e.name.startswith(HIDDEN_PREFIXES):
                continue
            st = e.stat()
            entries.append(Entry(join(uri, e.name), e.name, e.is_dir(), st.st_size, st.st_mtime_ns))
        return sorted(entries, key=lambda e: e.name)
    infos = loc.remote.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
    out = []
    for info in infos:
        if info.base_name.startswith(HIDDEN_PREFIXES):
            continue
        mtime = info.mtime_ns or 0
        out.append(
            Entry(
                join(uri, info.base_name),
                info.base_name,
                info.type == pafs.FileType.Directory,
                info.size or 0,
                mtime,
            )
        )
    return sorted(out, key=lambda e: e.name)


def list_files(uri: str, suffix: str = "") -> list[str]:
    return [e.uri for e in list_dir(uri) if not e.is_dir and e.name.endswith(suffix)]


def read_bytes(uri: str) -> bytes:
    loc = locate(uri)
    try:
        if loc.is_local:
            return Path(loc.path).read_bytes()
        with loc.remote.open_input_stream(loc.path) as fh:
            return fh.read()
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        if not exists(uri):
            raise FileNotFoundError(f"{uri}: no such file") from None
        raise StorageError(f"{uri}: could not be read ({exc})") from exc


def read_text(uri: str) -> str:
    return read_bytes(uri).decode()


def read_json(uri: str) -> Any:
    return json.loads(read_text(uri))


def open_input(uri: str):
    """A random-access file for `uri` (what pyarrow.parquet.ParquetFile reads): a local path as
    is (pyarrow maps it), a remote one as the file system's input file."""
    loc = locate(uri)
    return loc.path if loc.is_local else loc.remote.open_input_file(loc.path)


# ---- writes ----------------------------------------------------------------------------------


@contextmanager
def atomic_writer(uri: str) -> Iterator[IO[bytes]]:
    """A binary file to fill; `uri` shows the new content only when the block ends without error."""
    loc = locate(uri)
    if loc.is_local:
        with _local_atomic(Path(loc.path)) as fh:
            yield fh
        return
    buffer = io.BytesIO()  # an upload must not start before the content is whole
    yield buffer
    _put(loc, buffer.getvalue())


@contextmanager
def _local_atomic(path: Path) -> Iterator[IO[bytes]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _put(loc: Location, data: bytes) -> None:
    parent = loc.path.rsplit("/", 1)[0] if "/" in loc.path else ""
    if parent:
        loc.remote.create_dir(parent, recursive=True)
    if not loc.atomic_rename:  # an object store: one upload is visible whole or not at all
        with loc.remote.open_output_stream(loc.path) as out:
            out.write(data)
        return
    tmp = f"{parent}/.{loc.path.rsplit('/', 1)[-1]}.{os.getpid()}.tmp" if parent else f".{loc.path}.tmp"
    with loc.remote.open_output_stream(tmp) as out:
        out.write(data)
    if loc.remote.get_file_info(loc.path).type != pafs.FileType.NotFound:
        loc.remote.delete_file(loc.path)  # HDFS renames do not replace
    loc.remote.move(tmp, loc.path)


def write_bytes(uri: str, data: bytes) -> str:
    with atomic_writer(uri) as fh:
        fh.write(data)
    return uri


def write_text(uri: str, text: str) -> str:
    return write_bytes(uri, text.encode())


def write_json(uri: str, obj: Any) -> str:
    return write_text(uri, json.dumps(obj, indent=2))


def makedirs(uri: str) -> None:
    loc = locate(uri)
    if loc.is_local:
        os.makedirs(loc.path, exist_ok=True)
    else:
        loc.remote.create_dir(loc.path, recursive=True)


def delete(uri: str) -> None:
    """Remove a file or a directory tree; nothing if it is absent."""
    loc = locate(uri)
    if loc.is_local:
        p = Path(loc.path)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        return
    info = loc.remote.get_file_info(loc.path)
    if info.type == pafs.FileType.Directory:
        loc.remote.delete_dir(loc.path)
    elif info.type == pafs.FileType.File:
        loc.remote.delete_file(loc.path)


@contextmanager
def local_copy(uri: str) -> Iterator[Path]:
    """`uri` as a local path for code that needs one (MLflow's log_artifacts, matplotlib): the
    path itself when local, else a temporary download of the file or directory tree."""
    path = local_path(uri)
    if path is not None:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="sparkml_dist_copy_") as tmp:
        target = Path(tmp) / name_of(uri)
        _download(uri, target)
        yield target


def _download(uri: str, target: Path) -> None:
    if not is_dir(uri):
        target.write_bytes(read_bytes(uri))
        return
    target.mkdir(parents=True, exist_ok=True)
    loc = locate(uri)
    base = loc.path.strip("/")
    for info in loc.remote.get_file_info(pafs.FileSelector(loc.path, recursive=True)):
        rel = info.path.strip("/")[len(base) :].lstrip("/")  # some file systems root paths at "/"
        dest = target / rel
        if info.type == pafs.FileType.Directory:
            dest.mkdir(parents=True, exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with loc.remote.open_input_stream(info.path) as fh:
                dest.write_bytes(fh.read())


def upload(local: Path, uri: str) -> str:
    """Copy a local file to `uri` (atomically); a no-op when `uri` is that same local file."""
    target = local_path(uri)
    if target is not None and target.resolve() == Path(local).resolve():
        return uri
    return write_bytes(uri, Path(local).read_bytes())


# ---- built-in schemes ------------------------------------------------------------------------


def _query(uri: str) -> tuple[str, dict[str, str]]:
    parts = urlsplit(uri)
    return f"{parts.netloc}{parts.path}", dict(parse_qsl(parts.query))


@functools.lru_cache(maxsize=16)
def _s3(options: tuple[tuple[str, str], ...]) -> pafs.FileSystem:
    # built directly, not with FileSystem.from_uri: that one asks the bucket for its region first
    return pafs.S3FileSystem(**dict(options))


def _s3_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    path, query = _query(uri)
    allowed = {k: v for k, v in query.items() if k in ("region", "endpoint_override", "scheme")}
    return _s3(tuple(sorted(allowed.items()))), path


def _from_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(uri)
    except (OSError, pa.ArrowException) as exc:
        raise StorageError(
            f"{uri}: cannot reach this file system from Python ({str(exc).splitlines()[0]})"
        ) from exc


for _name in ("s3", "s3a", "s3n"):
    register_scheme(Scheme(_name, filesystem=_s3_filesystem))
for _name in ("gs", "gcs", "abfs", "abfss"):
    register_scheme(Scheme(_name, filesystem=_from_uri))
for _name in ("hdfs", "viewfs"):
    register_scheme(Scheme(_name, filesystem=_from_uri, atomic_rename=True))
register_scheme(Scheme("dbfs", local_root="/dbfs"))
