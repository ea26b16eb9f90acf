"""Runs on the user's machine: datasets in the SDK (`client.data`) and the environment cache
(`client.envs`).

A push chunks every file (content-defined, see `chunking`), asks the agent which chunks it
lacks, and sends only those, compressed where that pays, in batches: an interrupted push
loses at most one batch, and the next push sends only what is still missing. Chunk lists
are cached per file (keyed on size, mtime, ctime and inode), so re-pushing an unchanged
tree reads no file. Memory stays at about one chunk per file in flight, whatever the size.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import stat
import time
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from gpuhop.api.data import CachedData, DatasetInfo, EnvInfo
from gpuhop.api.models import DATASET_NAME_RULE, DataMount, check_dataset_name
from gpuhop.client.errors import GpuhopError, invalid
from gpuhop.client.session import Session, quote
from gpuhop.client.sync.chunkupload import UPLOAD_BATCH_BYTES, ChunkUpload, PushProgress
from gpuhop.client.sync.workdir import RACY_WINDOW_NS, SyncError, check_name
from gpuhop.client.transport.unixhttp import Timeout

CHUNKERS = 2  # files chunked at once


# In `share` and `unshare`: every user of the agent.
EVERYONE = "*"


@dataclass
class _File:
    path: str
    abspath: str
    size: int
    executable: bool
    key: list[int]  # size, mtime_ns, ctime_ns, inode
    chunks: list[tuple[int, str]] | None = None  # (size, digest)


@dataclass
class PushResult:
    """What a push did: the version it made (or found), and what travelled."""

    info: DatasetInfo
    files: int
    bytes: int
    chunks: int
    chunks_sent: int
    bytes_sent: int  # chunk bytes before compression
    wire_bytes: int  # what went over the connection
    files_chunked: int  # files read (not found unchanged in the cache)
    seconds: float


def _walk(root: Path) -> list[_File]:
    if not root.exists():
        raise GpuhopError(f"{root} does not exist", code="bad_request")
    if root.is_file():
        entries = [(root.name, root)]
    else:
        entries = []
        for dirpath, dirs, names in os.walk(root):
            dirs.sort()
            for name in sorted(names) + [d for d in dirs if os.path.islink(Path(dirpath, d))]:
                full = Path(dirpath, name)
                entries.append((full.relative_to(root).as_posix(), full))
    files = []
    for rel, full in entries:
        try:
            check_name(rel)
        except SyncError as e:
            raise GpuhopError(str(e), code="bad_path") from None
        try:
            st = full.stat()  # follows a link to a file: its content is pushed
        except FileNotFoundError:
            if not full.is_symlink():
                raise GpuhopError(f"{full} vanished while it was read", "bad_request") from None
            raise GpuhopError(
                f"{full} is a link to {os.readlink(full)}, which does not exist; remove the"
                " link, or push a folder without it",
                code="bad_request",
            ) from None
        except OSError as e:
            raise GpuhopError(f"{full}: {e.strerror}", code="bad_request") from None
        if not stat.S_ISREG(st.st_mode):
            raise GpuhopError(
                f"{full} is a link to a directory or not a regular file; datasets hold files",
                code="bad_request",
            )
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        executable = bool(st.st_mode & stat.S_IXUSR)
        files.append(_File(rel, str(full), st.st_size, executable, key))
    return files


class _ChunkCache:
    def __init__(self, cache_dir: Path, root: Path):
        digest = hashlib.sha256(str(root.absolute()).encode()).hexdigest()[:24]
        self.path = cache_dir / "datasets" / f"{digest}.json"
        try:
            self.entries: dict[str, list] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = {}

    def get(self, f: _File) -> list[tuple[int, str]] | None:
        hit = self.entries.get(f.path)
        if hit is None or hit[0] != f.key:
            return None
        return [(size, digest) for size, digest in hit[1]]

    def save(self, files: list[_File]) -> None:
        racy = time.time_ns() - RACY_WINDOW_NS
        self.entries = {
            f.path: [f.key, f.chunks] for f in files if f.key[1] < racy and f.chunks is not None
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries, separators=(",", ":")))
        os.replace(tmp, self.path)


class Datasets:
    """`client.data`: push, list, show and remove datasets on the agent."""

    def __init__(self, session: Session):
        self.session = session

    def push(
        self,
        path: str | os.PathLike[str],
        name: str,
        on_progress: PushProgress | None = None,
        shared: bool = False,
    ) -> PushResult:
        """Upload a file or directory as dataset `name`: a new version, or, when the content
        equals the latest version's, that version (`result.info.new` is False).

        On a team agent a dataset is its pusher's alone unless `shared` (with every user of
        the agent) or shared with some users later (`share`); admins see every dataset."""
        _named(name)  # before the files are read and hashed
        started = time.perf_counter()
        root = Path(path).absolute()
        files = _walk(root)
        cache = _ChunkCache(self.session.cache_dir, root)
        todo = sum(f.size for f in files if cache.get(f) is None)
        fresh = []
        for f in files:
            f.chunks = cache.get(f)
            if f.chunks is None:
                fresh.append(f)
        upload = ChunkUpload(self.session, on_progress, lambda data: _chunking().encode(data))
        done = 0
        batch: list[_File] = []
        batch_bytes = 0
        # Files are chunked two at a time, in threads (numpy and hashlib let go of the GIL),
        # while the chunks of the files before them are asked about and sent: the agent's
        # hashing and writing run beside the chunking, not after it. Results come in the
        # order of the files.
        pool = ThreadPoolExecutor(max_workers=min(CHUNKERS, os.cpu_count() or 1))
        try:
            chunked = iter(pool.map(_chunks_of, fresh))
            for f in files:
                batch.append(f)
                if f.chunks is None:
                    f.chunks = next(chunked)
                    done += f.size
                    if on_progress is not None:
                        on_progress("chunking", done, todo)
                    # Only what was chunked now counts: a re-push, its files mostly known
                    # from the cache, asks about them all at once, as before.
                    batch_bytes += f.size
                if batch_bytes >= UPLOAD_BATCH_BYTES:
                    upload.files(batch)
                    batch, batch_bytes = [], 0
            upload.files(batch)
            upload.close()
        finally:
            pool.shutdown(cancel_futures=True)  # an error (or ^C) chunks no further file
            upload.close(cancel=True)  # no-op after a clean close
            cache.save(files)  # the files chunked so far: a retry reads only the rest
        sent = upload.counts
        manifest = {
            "files": [
                {
                    "path": f.path,
                    "size": f.size,
                    "executable": f.executable,
                    "chunks": [d for _, d in f.chunks or ()],
                }
                for f in files
            ]
        }
        response = self.session.request(
            "POST",
            f"/v1/datasets/{quote(name)}",
            params={"shared": "true"} if shared else {},
            content=json.dumps(manifest, separators=(",", ":")).encode(),
            headers={"content-type": "application/json"},
            timeout=Timeout(3600.0, connect=5.0),
        )
        return PushResult(
            info=DatasetInfo.model_validate(response.json()),
            files=len(files),
            bytes=sum(f.size for f in files),
            chunks=len(upload.seen),
            chunks_sent=sent[0],
            bytes_sent=sent[1],
            wire_bytes=sent[2],
            files_chunked=len(fresh),
            seconds=time.perf_counter() - started,
        )

    def list(self) -> list[DatasetInfo]:
        """Every version of every dataset this caller may see: their own, those shared with
        them, those from before datasets had owners; every one for an admin."""
        response = self.session.request("GET", "/v1/datasets")
        return [DatasetInfo.model_validate(d) for d in response.json()]

    def cached(self) -> builtins.list[CachedData]:
        """The buckets' prefixes cached on the agent's host for this caller's jobs
        (`--data s3://...`), most recently used first."""
        response = self.session.request("GET", "/v1/cached-data")
        return [CachedData.model_validate(d) for d in response.json()]

    def versions(self, name: str) -> builtins.list[DatasetInfo]:
        response = self.session.request("GET", f"/v1/datasets/{_named(name)}")
        return [DatasetInfo.model_validate(d) for d in response.json()]

    def files(self, name: str, version: int | None = None) -> builtins.list[dict[str, object]]:
        """The files of a version (the latest without `version`): path, size, chunks."""
        params = _version_param(name, version)
        response = self.session.request("GET", f"/v1/datasets/{_named(name)}/files", params=params)
        files: builtins.list[dict[str, object]] = response.json()
        return files

    def share(self, name: str, user: str = EVERYONE) -> DatasetInfo:
        """Let `user` (by default every user of the agent) see and mount dataset `name`, all
        its versions; its owner or an admin only. Returns its latest version."""
        response = self.session.request(
            "PUT", f"/v1/datasets/{_named(name)}/readers/{quote(user, safe='')}"
        )
        return DatasetInfo.model_validate(response.json())

    def unshare(self, name: str, user: str = EVERYONE) -> DatasetInfo:
        """Undo a `share` (jobs already running keep their mount)."""
        response = self.session.request(
            "DELETE", f"/v1/datasets/{_named(name)}/readers/{quote(user, safe='')}"
        )
        return DatasetInfo.model_validate(response.json())

    def remove(self, name: str, version: int | None = None) -> builtins.list[int]:
        """Remove one version, or every version; returns the versions removed. Its files on
        the host go with it; the agent's garbage collection removes the chunks that no
        version holds any more."""
        params = _version_param(name, version)
        response = self.session.request("DELETE", f"/v1/datasets/{_named(name)}", params=params)
        removed: builtins.list[int] = response.json()["removed"]
        return removed


def _named(name: str) -> str:
    """A dataset's name as its routes take it; GpuhopError where it is no dataset's name
    (a '/' in it made "no such route", an empty one a redirect)."""
    try:
        return quote(check_dataset_name(name))
    except (ValueError, TypeError):
        raise GpuhopError(f"{name!r}: {DATASET_NAME_RULE}", code="bad_request") from None


class Envs:
    """`client.envs`: the Python environments the agent built for jobs' requirements."""

    def __init__(self, session: Session):
        self.session = session

    def list(self) -> list[EnvInfo]:
        return [EnvInfo.model_validate(e) for e in self.session.request("GET", "/v1/envs").json()]

    def remove(
        self, env_id: str | None = None, unused: bool = False, older_than: float | None = None
    ) -> builtins.list[str]:
        """Remove one environment, or every one no queued or running job uses (`unused`),
        optionally only those last used more than `older_than` seconds ago."""
        params: dict[str, str | float | bool] = {"unused": unused}
        if env_id is not None:
            params["id"] = env_id
        if older_than is not None:
            params["older_than"] = older_than
        removed: builtins.list[str] = self.session.request(
            "DELETE", "/v1/envs", params=params
        ).json()["removed"]
        return removed


def _version_param(name: str, version: int | None) -> dict[str, int]:
    """The query naming `version` of dataset `name` (None: no version, so all or the latest).
    Version 0 is refused, not taken for None: `remove(name, 0)` removed every version."""
    if version is None:
        return {}
    if version < 1:
        raise GpuhopError(
            f"dataset {name}: no version {version}; versions count from 1", code="bad_request"
        )
    return {"version": version}


def parse_mount(text: str) -> DataMount:
    """`NAME[:VERSION]=MOUNT` (VERSION as 3 or v3) -> a DataMount; GpuhopError if malformed."""
    spec, sep, mount = text.partition("=")
    name, colon, version = spec.partition(":")
    if not sep or not name or not mount:
        raise GpuhopError(f"--data takes NAME[:VERSION]=MOUNT, got {text!r}", code="bad_request")
    number = version[1:] if version[:1] in ("v", "V") else version
    if colon and (not number.isdigit() or int(number) < 1):
        raise GpuhopError(f"--data {text}: the version must be a number like 3 or v3, from 1")
    try:
        return DataMount(name=name, version=int(number) if colon else None, mount=mount)
    except ValidationError as e:
        raise invalid(f"--data {text}", e) from None


def _chunks_of(f: _File) -> list[tuple[int, str]]:
    try:
        return [(c.size, c.digest) for c in _chunking().chunk_file(f.abspath)]
    except OSError as e:  # unreadable (mode 000, another user's), or gone since the walk
        raise GpuhopError(f"cannot read {f.abspath}: {e.strerror}", code="bad_request") from None


def _chunking() -> types.ModuleType:
    """The chunker, with numpy: imported by the commands that push, not by every command."""
    import gpuhop.client.sync.chunking

    return gpuhop.client.sync.chunking
