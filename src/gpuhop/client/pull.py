"""Runs on the user's machine: bringing back what a job wrote, as one `PullPlan` made before
anything is fetched (so the CLI can say how much comes back) and then fetched.

Three parts come back, each into a folder of its own (`PullPlan.roots`): the job's
`$GPUHOP_ARTIFACTS_DIR`; the files the job created or changed in its work dir, at their
paths; and the files an ended job left in its private /tmp (`tempfile.gettempdir()`, kept
with its files). One folder of the user's choosing can hold it all (`layout`: the artifacts
at its top, the work dir's files under `workdir/`, the /tmp files under `job-tmp/`); or the
work dir's files go into the local work dir, where the script would have left them had it
run here. A file already here with the same size and mtime is not fetched again. A work-dir
file replaces a local one only where the local one is still what was synced (or with
`overwrite`): local edits are never lost.

The folder a pull makes for itself (`PullPlan.home`) gets a `.gpuhopignore` that leaves it
all out of the next sync (`*`), naming the jobs pulled there, so a pull into the synced
tree (`gpuhop run --pull out`) is never sent back up. A folder that held other files before
is not touched so: it may be the user's own, meant to be synced.
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

# Where the work dir's files go in a folder that holds a whole pull (see `layout`).
WORKDIR_PART = "workdir"
# In the artifacts' folder: what the job left in its /tmp (kept after it ended).
TMP_PART = "job-tmp"
# The ignore file a pull leaves in its own folder; the line that says it is gpuhop's.
IGNORE_FILE = ".gpuhopignore"
MARK = "# Written by gpuhop pull: the next gpuhop run does not sync this folder"
_JOB_LINE = "# job "


def layout(folder: str | os.PathLike[str]) -> dict[str, Path]:
    """Where each part of a pull goes in one folder that holds it all: the artifacts at its
    top (as `gpuhop.tf.artifacts_dir()` had them), the work dir's files under `workdir/`,
    what the job left in its /tmp under `job-tmp/`."""
    root = Path(folder)
    return {"artifacts": root, "workdir": root / WORKDIR_PART, "tmp": root / TMP_PART}


def pulled_jobs(folder: Path) -> list[str] | None:
    """The jobs a pull into `folder` recorded there; None where no pull of gpuhop made it."""
    try:
        lines = (folder / IGNORE_FILE).read_text(errors="replace").splitlines()
    except OSError:
        return None
    if not lines or lines[0] != MARK:
        return None
    return [line[len(_JOB_LINE) :].strip() for line in lines if line.startswith(_JOB_LINE)]


def _free(folder: Path) -> bool:
    """Whether `folder` holds nothing yet (or is not there)."""
    try:
        return next(os.scandir(folder), None) is None
    except FileNotFoundError:
        return True
    except OSError:
        return False


def folder_for(base: Path, job_id: str, name: str | None) -> Path:
    """The folder under `base` for a pull of the job: `NAME/` for a named job, unless it
    holds another job's pull (a rerun, a sweep's run of the same name) or other files: then
    `NAME-ID/`; `ID/` for a job without a name. The same job always gets the same folder."""
    if name is None:
        return base / job_id
    named = base / name
    jobs = pulled_jobs(named)
    if (jobs is not None and job_id in jobs) or _free(named):
        return named
    return base / f"{name}-{job_id}"


def _record(folder: Path, job_id: str) -> None:
    """Leave `folder` out of the next sync, naming `job_id` among the jobs pulled there."""
    jobs = pulled_jobs(folder) or []
    if job_id in jobs:
        return
    lines = [
        MARK,
        "# (delete this file to sync it). Jobs pulled here:",
        *(_JOB_LINE + j for j in [*jobs, job_id]),
        "*",
    ]
    (folder / IGNORE_FILE).write_text("\n".join(lines) + "\n")


class PullPlan:
    """What a pull fetches, what is already here, and what it leaves alone.

    `roots` says where each part goes; `home`, the folder the pull makes for itself (by
    default the artifacts'), marked for the sync to leave out where it is new or gpuhop's.
    """

    __slots__ = ("current", "home", "job_id", "kept", "roots", "todo", "workdir_note")

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.roots: dict[str, Path] = {}
        self.home: Path | None = None
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

    def claim(self, home: Path | None) -> None:
        """Make `home` the pull's own folder, if it is new, empty or gpuhop's already; never
        the folder the user stands in (or one above it), where their next run may start."""
        mine = (
            home is not None
            and not Path.cwd().is_relative_to(home.resolve())
            and (pulled_jobs(home) is not None or _free(home))
        )
        self.home = home if mine else None

    def files(self, route: str) -> list[Path]:
        """Every file of `route` ("artifacts", "workdir", "tmp") here once fetched."""
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


def _plan_copies(out: PullPlan, route: str, folder: Path, listing: list[dict], what: str) -> None:
    """Plan a part whose files are copies of the job's (its artifacts, its /tmp): each is
    fetched into `folder` at its path unless the one there already has its size and mtime."""
    out.roots[route] = folder
    root = folder.absolute()
    for raw in listing:
        entry = api.ArtifactEntry.model_validate(raw)
        target = _target(root, entry, what)
        if target.is_file() and _same(target, entry):
            out.current.append((route, target))
        else:
            out.todo.append((route, entry, target))


def plan_pull(
    session: Session,
    job_id: str,
    artifacts: str | os.PathLike[str] | None,
    workdir: str | os.PathLike[str] | None,
    overwrite: bool = False,
    tmp: str | os.PathLike[str] | None = None,
) -> PullPlan:
    """Plan the pull of the job's artifacts into `artifacts`, its work-dir outputs into
    `workdir` and the files it left in its /tmp into `tmp` (None: not that part)."""
    out = PullPlan(job_id)
    if tmp is not None:
        try:
            listing = session.request("GET", f"/v1/jobs/{job_id}/tmp").json()
        except GpuhopError as e:
            # A running job (its work dir's note says so), or an agent that keeps no /tmp:
            # not a part of this pull, so that nothing says the job left nothing there.
            if e.code not in ("conflict", "not_found"):
                raise
        else:
            _plan_copies(out, "tmp", Path(tmp), listing, "/tmp file")
    if artifacts is not None:
        out.claim(Path(artifacts))
        listing = session.request("GET", f"/v1/jobs/{job_id}/artifacts").json()
        _plan_copies(out, "artifacts", Path(artifacts), listing, "artifact")
    if workdir is not None:
        root = Path(workdir).absolute()
        try:
            listing = session.request("GET", f"/v1/jobs/{job_id}/workdir").json()
        except GpuhopError as e:
            if e.code not in ("unsupported", "conflict"):  # a Ray agent; a running job
                raise
            out.workdir_note = e.message  # said instead of the part's count
            listing = []
        else:
            out.roots["workdir"] = Path(workdir)
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
    _check_apart(out)
    return out


def _check_apart(plan: PullPlan) -> None:
    """Refuse a plan where two parts would write the same path (an artifact at the top of
    `-o DIR` named `workdir`, say), or one part's file where another's folder goes."""
    parts: dict[Path, str] = {}
    for route, target in [(r, t) for r, _, t in plan.todo] + plan.current:
        if parts.setdefault(target, route) != route:
            raise GpuhopError(
                f"the job's {parts[target]} and its {route} each have a file that would land"
                f" at {target}; pull them into separate folders (--only, -C)",
                "conflict",
            )
    for target, route in parts.items():
        for above in target.parents:
            if parts.get(above, route) != route:
                raise GpuhopError(
                    f"the job's {parts[above]} has a file at {above}, where its {route} go"
                    f" ({target}); pull them into separate folders (--only, -C)",
                    "conflict",
                )


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
    home = pulled.home.absolute() if pulled.home is not None else None
    if home is not None and any(t.is_relative_to(home) for _, _, t in pulled.todo):
        try:
            home.mkdir(parents=True, exist_ok=True)
            _record(home, pulled.job_id)  # first: a pull cut short is left out too
        except OSError as e:
            raise GpuhopError(f"cannot make the folder {pulled.home}: {e}", "bad_path") from None
    for route, entry, target in pulled.todo:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise GpuhopError(f"cannot make a folder for {target}: {e}", "bad_path") from None
        part = target.with_name(target.name + ".gpuhop-part")
        url = f"/v1/jobs/{pulled.job_id}/{route}/{quote_from_bytes(entry.name_bytes(), safe='/')}"
        try:
            with session.stream("GET", url) as response, open(part, "wb") as f:
                for chunk in response.iter_bytes(1 << 20):
                    f.write(chunk)
                    done += len(chunk)
                    if on_bytes is not None:
                        on_bytes(done, max(total, done))
        except BaseException as e:
            part.unlink(missing_ok=True)  # a file cut short is no file: the next pull sends it
            if isinstance(e, session.transport_errors):  # the agent went away mid-answer
                raise session.unreachable(e) from None
            raise
        os.utime(part, (entry.mtime, entry.mtime))
        os.replace(part, target)
        written.append(target)
        if on_file is not None:
            on_file(entry)
    return written
