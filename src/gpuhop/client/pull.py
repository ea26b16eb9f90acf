"""Runs on the user's machine: bringing back what a job wrote, as one `PullPlan` made before
anything is fetched (so the CLI can say how much comes back) and then fetched.

Two places come back: the job's `$GPUHOP_ARTIFACTS_DIR`, into a folder of the user's
choosing, and the files the job created or changed in its work dir, into the local work dir,
where the script would have left them had it run here. A file already here with the same
size and mtime is not fetched again. A work-dir file replaces a local one only where the
local one is still what was synced (or with `overwrite`): local edits are never lost.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote_from_bytes

# The models load on first use (gpuhop.api is lazy): a pull needs them, `logs` does not.
import gpuhop.api as api
from gpuhop.client.errors import GpuhopError
from gpuhop.client.session import Session


class PullPlan:
    """What a pull fetches, what is already here, and what it leaves alone."""

    __slots__ = ("current", "job_id", "kept", "todo", "workdir_note")

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        # (route under /v1/jobs/JOB, entry, local target) of each file to fetch.
        self.todo: list[tuple[str, api.ArtifactEntry, Path]] = []
        # (route, local path) of each file here already, unchanged.
        self.current: list[tuple[str, Path]] = []
        # Local work-dir files that differ from what was synced: kept, not overwritten.
        self.kept: list[Path] = []
        # Why the work dir's files could not be listed (a backend without them), if so.
        self.workdir_note: str | None = None

    def __repr__(self) -> str:
        return (
            f"PullPlan(job {self.job_id}: {len(self.todo)} to fetch, {len(self.current)}"
            f" current, {len(self.kept)} kept)"
        )

    @property
    def size(self) -> int:
        return sum(entry.size for _, entry, _ in self.todo)

    def files(self, route: str) -> list[Path]:
        """Every file of `route` ("artifacts", "workdir") here once fetched."""
        return [t for r, _, t in self.todo if r == route] + [
            t for r, t in self.current if r == route
        ]


def _target(root: Path, entry: api.ArtifactEntry, what: str) -> Path:
    """Where `entry` lands under `root`: its name's own bytes (see ArtifactEntry.raw)."""
    name = entry.name_bytes()
    try:
        # Checked with any bytes that are not UTF-8 replaced: the same slashes and dots.
        api.validate_relpath(name.decode("utf-8", "replace"))
    except ValueError as e:
        raise GpuhopError(f"agent sent a bad {what} path: {e}", "bad_path") from None
    target = root / os.fsdecode(name)
    if not target.resolve().is_relative_to(root.resolve()):
        raise GpuhopError(f"{what} {entry.path} would land outside {root}", "bad_path")
    return target


def _same(target: Path, entry: api.ArtifactEntry) -> bool:
    st = target.stat()
    return st.st_size == entry.size and int(st.st_mtime) == int(entry.mtime)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def plan_pull(
    session: Session,
    job_id: str,
    artifacts: str | os.PathLike[str] | None,
    workdir: str | os.PathLike[str] | None,
    overwrite: bool = False,
) -> PullPlan:
    """Plan the pull of the job's artifacts into `artifacts` and its work-dir outputs into
    `workdir` (None: not that part)."""
    out = PullPlan(job_id)
    if artifacts is not None:
        root = Path(artifacts).absolute()
        listing = session.request("GET", f"/v1/jobs/{job_id}/artifacts").json()
        for raw in listing:
            art = api.ArtifactEntry.model_validate(raw)
            target = _target(root, art, "artifact")
            if target.is_file() and _same(target, art):
                out.current.append(("artifacts", target))
            else:
                out.todo.append(("artifacts", art, target))
    if workdir is not None:
        root = Path(workdir).absolute()
        try:
            listing = session.request("GET", f"/v1/jobs/{job_id}/workdir").json()
        except GpuhopError as e:
            if e.code not in ("unsupported", "conflict"):  # a Ray agent; a running job
                raise
            out.workdir_note = e.message
            listing = []
        for raw in listing:
            entry = api.WorkdirEntry.model_validate(raw)
            target = _target(root, entry, "work-dir file")
            if target.is_symlink() or (target.exists() and not target.is_file()):
                out.kept.append(target)  # never written through a link, nor over a folder
            elif not target.exists():
                out.todo.append(("workdir", entry, target))
            elif entry.base is not None and _sha256(target) == entry.base:
                out.todo.append(("workdir", entry, target))  # still as synced: replace it
            elif _same(target, entry):
                out.current.append(("workdir", target))
            elif overwrite:
                out.todo.append(("workdir", entry, target))
            else:
                out.kept.append(target)
    return out


def fetch_planned(
    session: Session,
    pulled: PullPlan,
    on_file: Callable[[api.ArtifactEntry], None] | None = None,
    on_bytes: Callable[[int, int], None] | None = None,
) -> list[Path]:
    """Fetch what `pulled` lists; return every file now here (fetched or already current).
    `on_bytes(done, total)` is called as bytes arrive, `on_file(entry)` after each file."""
    total, done = pulled.size, 0
    written = [target for _, target in pulled.current]
    for route, entry, target in pulled.todo:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise GpuhopError(f"cannot make a folder for {target}: {e}", "bad_path") from None
        part = target.with_name(target.name + ".gpuhop-part")
        url = f"/v1/jobs/{pulled.job_id}/{route}/{quote_from_bytes(entry.name_bytes(), safe='/')}"
        with session.stream("GET", url) as response, open(part, "wb") as f:
            for chunk in response.iter_bytes(1 << 20):
                f.write(chunk)
                done += len(chunk)
                if on_bytes is not None:
                    on_bytes(done, max(total, done))
        os.utime(part, (entry.mtime, entry.mtime))
        os.replace(part, target)
        written.append(target)
        if on_file is not None:
            on_file(entry)
    return written
