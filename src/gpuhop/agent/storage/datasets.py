"""Runs in the agent: the dataset store, versions of named file trees kept next to the GPU.

A version is a manifest (files as lists of chunk digests) kept as `datasets/NAME/vN.json`,
and the tree assembled from it once, in `datasets/NAME/vN/`, read-only (files 0444,
directories 0555). Jobs get that tree through a read-only bind mount (see `sandbox.py`),
never a copy. A single-chunk file is a hard link to its blob, and a file unchanged since the
previous version is a hard link to it there; other files are their chunks as they arrived
(a run, moved into place) or copied into place (copy_file_range), and are from then on
where those chunks are kept (see `chunkstore`): every byte is stored once.
A version exists once its JSON is written, which happens last, by atomic rename, so a crash
mid-push leaves no half version. Before that, every file the assembly wrote and every
directory of the tree is flushed to the disk (linked files are blobs, flushed when stored),
and after it the dataset's directory: a push that answered survives a power loss whole. (A
version named before its files' bytes reached the disk came back from one as files of the
right names and no content.)

A dataset is its pusher's: on a team agent other users neither see nor mount it unless it
is shared, with everyone or with named users, in `datasets/NAME/sharing.json` (for every
version, present and future). A version recorded without an owner (pushed before datasets
had owners) is readable by all, as it always was.

Blobs are not deleted with a dataset: garbage collection (`gpuhop.agent.services.gc`)
removes those that no version names.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from gpuhop.agent.storage import settle
from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.chunkstore import ChunkStore, Run
from gpuhop.agent.storage.trees import MissingBlobs, TreeError, check_paths
from gpuhop.api.data import DatasetFile, DatasetInfo, DatasetManifest
from gpuhop.api.models import check_dataset_name


class DatasetNotFound(LookupError):
    pass


# In sharing.json's users: shared with every user of the agent.
EVERYONE = "*"
# Threads copying a version's many-chunk files into place at once.
ASSEMBLERS = 2


# In a dataset's folder: the highest version number it has had, so that a version removed
# (`data rm NAME:N`) leaves its number unused. Removing every version removes the folder, and
# the name starts again at 1.
LAST_VERSION = "last-version"


class DatasetStore:
    def __init__(self, root: Path, blobs: BlobStore):
        self.root = root
        self.blobs = blobs
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()
        root.mkdir(exist_ok=True)
        self.chunks = ChunkStore(blobs, self._layouts)

    def locked(self, name: str) -> threading.RLock:
        """The lock of one dataset name. Re-entrant: a caller holds it across its own checks
        (who owns the name) and the `push` or `remove` that takes it again."""
        with self._guard:
            return self._locks.setdefault(name, threading.RLock())

    def record_path(self, name: str, version: int) -> Path:
        return self.root / check_dataset_name(name) / f"v{version}.json"

    def tree_path(self, name: str, version: int) -> Path:
        """The assembled, read-only tree of a version: what jobs see at their mount point."""
        return self.root / check_dataset_name(name) / f"v{version}"

    # -- reading ----------------------------------------------------------------------------

    def versions(self, name: str) -> list[int]:
        folder = self.root / check_dataset_name(name)
        found = []
        for p in folder.glob("v*.json") if folder.is_dir() else ():
            number = p.stem[1:]
            if number.isdigit():
                found.append(int(number))
        return sorted(found)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and self.versions(p.name))

    def info(self, name: str, version: int | None = None) -> DatasetInfo:
        """A version's summary; the latest without `version`. Raises DatasetNotFound."""
        versions = self.versions(name)
        if not versions:
            raise DatasetNotFound(f"no dataset named {name!r} (gpuhop data ls lists them)")
        if version is None:
            version = versions[-1]
        elif version not in versions:
            have = ", ".join(f"v{v}" for v in versions)
            raise DatasetNotFound(f"dataset {name!r} has no version {version} (it has {have})")
        record = json.loads(self.record_path(name, version).read_text())
        return _info(record)

    def sharing(self, name: str) -> list[str]:
        """Whom `name` is shared with: user names, or EVERYONE; [] when private."""
        try:
            users = json.loads((self.root / check_dataset_name(name) / "sharing.json").read_text())
        except (OSError, ValueError):
            return []
        return sorted(str(u) for u in users) if isinstance(users, list) else []

    def share(self, name: str, add: Iterable[str] = (), drop: Iterable[str] = ()) -> list[str]:
        """Share `name` with more users (or EVERYONE), or with fewer; returns the new list."""
        with self.locked(name):
            if not self.versions(name):
                raise DatasetNotFound(f"no dataset named {name!r} (gpuhop data ls lists them)")
            users = sorted((set(self.sharing(name)) | set(add)) - set(drop))
            _write_atomic(self.root / name / "sharing.json", json.dumps(users).encode())
            return users

    def readable_by(self, name: str, user: str) -> bool:
        """Whether `user` (not an admin: they read everything) may see and mount `name`: its
        pusher, whoever it is shared with, and everyone for a version without an owner."""
        owners = {self.info(name, v).owner for v in self.versions(name)}
        if None in owners or user in owners:
            return True
        shared = self.sharing(name)
        return EVERYONE in shared or user in shared

    def manifest(self, name: str, version: int) -> list[dict]:
        files: list[dict] = json.loads(self.record_path(name, version).read_text())["files"]
        return files

    def _layouts(self) -> Iterator[tuple[Path, list[dict]]]:
        """Every version's tree and its files (for `chunkstore`: where chunks are kept)."""
        for name in self.names():
            for version in self.versions(name):
                with contextlib.suppress(OSError, ValueError, KeyError):
                    yield self.tree_path(name, version), self.manifest(name, version)

    # -- writing ----------------------------------------------------------------------------

    def sweep_leftovers(self, cutoff: float, dry_run: bool = False) -> list[int]:
        """Remove what interrupted pushes and removals left (a `.vN-*` tree half assembled,
        a `.tmp-*` record, a `vN` tree without its record) older than `cutoff`; return the
        bytes of each. A name whose push is in progress (its lock held) is left alone."""
        freed = []
        for folder in self.root.iterdir() if self.root.is_dir() else ():
            lock = self.locked(folder.name)
            if not folder.is_dir() or not lock.acquire(blocking=False):
                continue
            try:
                for path in folder.iterdir():
                    if not (path.name.startswith((".v", ".tmp-")) or _unrecorded(path)):
                        continue
                    try:
                        if path.lstat().st_mtime >= cutoff:
                            continue
                    except OSError:
                        continue
                    freed.append(_bytes(path))
                    if not dry_run:
                        _remove_tree(path) if path.is_dir() else path.unlink(missing_ok=True)
            finally:
                lock.release()
        return freed

    def push(self, name: str, raw: bytes, owner: str | None = None) -> DatasetInfo:
        """Make a new version of `name` from an uploaded manifest, unless it equals the
        latest. Raises pydantic's ValidationError, TreeError or MissingBlobs; any of them
        leaves what is stored as it was."""
        check_dataset_name(name)
        manifest = DatasetManifest.model_validate_json(raw)
        check_paths([f.path for f in manifest.files], what="dataset")
        missing = self.chunks.missing([d for f in manifest.files for d in f.chunks])
        if missing:
            raise MissingBlobs(missing)
        files = [f.model_dump() for f in sorted(manifest.files, key=lambda f: f.path)]
        digest = hashlib.sha256(json.dumps(files, separators=(",", ":")).encode()).hexdigest()
        with self.locked(name):
            versions = self.versions(name)
            if versions:
                latest = self.info(name, versions[-1])
                if latest.digest == digest:
                    return latest.model_copy(update={"new": False})
            # Never a number a removed version had: a job pinned to NAME:N would read
            # other data under the same name, silently.
            version = max(versions[-1] if versions else 0, self._last_version(name)) + 1
            folder = self.root / name
            folder.mkdir(exist_ok=True)
            # A tree of this number without a record was left by a push or a removal that a
            # crash interrupted: no job can mount it, and the new version takes its place.
            _remove_tree(self.tree_path(name, version))
            tmp = Path(tempfile.mkdtemp(dir=folder, prefix=f".v{version}-"))
            previous = (
                (self.tree_path(name, versions[-1]), self.manifest(name, versions[-1]))
                if versions
                else None
            )
            try:
                sizes, staged, copied = self._assemble(manifest.files, tmp, previous)
                os.replace(tmp, self.tree_path(name, version))
                settle.flush_dir(folder)
            except BaseException:
                _remove_tree(tmp)
                raise
            self.blobs.count_added(copied)
            for f in files:
                if f["path"] in sizes:
                    f["sizes"] = sizes[f["path"]]
            record = {
                "name": name,
                "version": version,
                "digest": digest,
                "created_at": time.time(),
                "bytes": sum(f.size for f in manifest.files),
                "chunks": sum(len(f.chunks) for f in manifest.files),
                "files": files,
                "owner": owner,
            }
            _write_atomic(self.record_path(name, version), json.dumps(record).encode())
            _write_atomic(folder / LAST_VERSION, str(version).encode())
            self.chunks.add_version(self.tree_path(name, version), files, staged)
            return _info(record)

    def _last_version(self, name: str) -> int:
        """The highest version number `name` has had (0: none, or unknown)."""
        try:
            return int((self.root / name / LAST_VERSION).read_text())
        except (OSError, ValueError):
            return 0

    def _assemble(
        self, files: list[DatasetFile], into: Path, previous: tuple[Path, list[dict]] | None
    ) -> tuple[dict[str, list[int]], set[str], int]:
        """Build a version's tree. A file unchanged since the previous version is a hard link
        to it there (both are read-only), so a re-push costs what changed, not the whole. A
        file of one chunk is a hard link to that blob; a file that arrived as one run of
        chunks is that run, moved into place (see `chunkstore`). Other files are their
        chunks copied into place, on ASSEMBLERS threads (the kernel copies; the GIL is let
        go). Returns the chunk sizes of each file of several chunks (where they are kept from
        now on), the staged chunks copied, and the bytes copied (checked against the quota
        first: a link or a run moved takes no more room)."""
        before: dict[str, dict] = {}
        if previous is not None:
            before = {f["path"]: f for f in previous[1]}
        links: list[tuple[str, Path]] = []
        runs: dict[Run, Path] = {}
        copies: dict[str, tuple[int, Path, list[str]]] = {}  # path -> size, dest, chunks
        made: list[tuple[DatasetFile, Path]] = []  # not linked to the previous version
        sizes: dict[str, list[int]] = {}
        for f in files:
            dest = into / f.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            old = before.get(f.path, {})
            same = (old.get("chunks"), old.get("executable")) == (f.chunks, f.executable)
            if previous is not None and same:
                os.link(previous[0] / f.path, dest)
                if "sizes" in old:
                    sizes[f.path] = old["sizes"]
                continue
            made.append((f, dest))
            if len(f.chunks) == 1 and not f.executable and self.chunks.linkable(f.chunks[0]):
                links.append((f.chunks[0], dest))
                continue
            run = self.chunks.whole_run(f.chunks, f.size) if len(f.chunks) > 1 else None
            if run is not None and run not in runs:  # two files of equal content: one copied
                runs[run] = dest
                sizes[f.path] = [run.chunks[offset][1] for offset in sorted(run.chunks)]
            else:
                copies[f.path] = (f.size, dest, f.chunks)
        copied = sum(size for size, _dest, _chunks in copies.values())
        self.blobs.check_quota(copied)
        staged: set[str] = set()
        with ThreadPoolExecutor(settle.FLUSHERS, thread_name_prefix="gpuhop-link") as pool:
            # A staged chunk that is a whole file is made a blob first.
            for _ in pool.map(lambda link: os.link(self.chunks.settle(link[0]), link[1]), links):
                pass
        workers = min(ASSEMBLERS, os.cpu_count() or 1)
        with ThreadPoolExecutor(workers, thread_name_prefix="gpuhop-assemble") as pool:
            done = [
                (p, pool.submit(self._concatenate, dest, c)) for p, (_s, dest, c) in copies.items()
            ]
            for path, future in done:
                sizes[path], used = future.result()  # the first error, once every copy ended
                staged.update(used)
        with ThreadPoolExecutor(settle.FLUSHERS, thread_name_prefix="gpuhop-flush") as pool:
            # Last, as copies may read from them: runs flushed and moved into place.
            for _ in pool.map(lambda item: _move(self.chunks.take(item[0]), item[1]), runs.items()):
                pass
        for f, dest in made:
            actual = dest.stat().st_size
            if actual != f.size:
                raise TreeError(f"{f.path}: its chunks add up to {actual} bytes, not {f.size}")
            os.chmod(dest, 0o555 if f.executable else 0o444)
        for dirpath, _dirs, _files in os.walk(into, topdown=False):
            os.chmod(dirpath, 0o555)
        settle.flush_dirs(into)  # the files copied are flushed as they are copied
        return sizes, staged, copied

    def _concatenate(self, dest: Path, chunks: list[str]) -> tuple[list[int], list[str]]:
        """Copy a file's chunks into place; return each one's size and those staged."""
        sizes, staged = [], []
        with open(dest, "wb") as out:
            for digest in chunks:
                path, offset, size, was_staged = self.chunks.source(digest)
                try:
                    src = os.open(path, os.O_RDONLY)
                except FileNotFoundError:  # its version removed meanwhile: sent again
                    raise MissingBlobs([digest]) from None
                try:
                    sizes.append(_copy_range(src, out.fileno(), offset, size))
                finally:
                    os.close(src)
                if was_staged:
                    staged.append(digest)
            os.fsync(out.fileno())  # on the disk before the version names it
        return sizes, staged

    def remove(self, name: str, version: int | None) -> list[int]:
        """Remove one version, or all of them; returns the versions removed."""
        with self.locked(name):
            targets = [self.info(name, version).version] if version else self.versions(name)
            if not targets:
                raise DatasetNotFound(f"no dataset named {name!r}")
            for v in targets:
                self.record_path(name, v).unlink(missing_ok=True)
                _remove_tree(self.tree_path(name, v))
            folder = self.root / name
            if not self.versions(name):
                _remove_tree(folder)
            self.chunks.forget_versions()
            return targets


def _info(record: dict) -> DatasetInfo:
    return DatasetInfo(
        name=record["name"],
        version=record["version"],
        digest=record["digest"],
        files=len(record["files"]),
        bytes=record["bytes"],
        chunks=record["chunks"],
        created_at=datetime.fromtimestamp(record["created_at"], tz=UTC),
        owner=record.get("owner"),
    )


def _move(run: Path, dest: Path) -> None:
    """A run, flushed to the disk (and out of the page cache), becomes a version's file."""
    fd = os.open(run, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    os.rename(run, dest)


def _copy_range(src: int, dst: int, offset: int, size: int | None) -> int:
    """Append `size` bytes of `src` from `offset` (to its end: None) to `dst`: in the kernel
    where it can, by reads and writes if not. Returns the bytes copied."""
    left = os.fstat(src).st_size - offset if size is None else size
    pos = offset
    try:
        while left > 0 and (n := os.copy_file_range(src, dst, left, pos)):
            pos, left = pos + n, left - n
    except OSError:
        while left > 0 and (data := os.pread(src, min(left, 1 << 20), pos)):
            os.write(dst, data)
            pos, left = pos + len(data), left - len(data)
    return pos - offset


def _write_atomic(path: Path, data: bytes) -> None:
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        settle.durable(f)
    os.replace(name, path)
    settle.flush_dir(path.parent)  # the new name too


def _unrecorded(path: Path) -> bool:
    """Whether `path` is a version's tree (`vN`) whose record (`vN.json`) is missing."""
    number = path.name[1:]
    return (
        path.name.startswith("v")
        and number.isdigit()
        and path.is_dir()
        and not path.with_name(f"{path.name}.json").exists()
    )


def _bytes(path: Path) -> int:
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _remove_tree(path: Path) -> None:
    """Remove a read-only tree (its directories are 0555, so make them writable first)."""
    if not path.exists():
        return
    for dirpath, _dirs, _files in os.walk(path):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(path, ignore_errors=True)
