"""Runs in the agent: the host's container images, through Podman (the host's own daemonless
container runtime): list them, remove one, pull one from its registry with progress.

Podman is the one agent.toml's `podman` names (`PodmanSettings`, as the run path's: both must
see one store), run as the agent's user, on that user's image store (root's
/var/lib/containers on a team agent). Nothing here needs `--runtime` or ulimits: those are for
`podman run` only. References are checked as the wire checks them (`check_image`) before
they reach an argv.

Registry credentials are a secret of the job's (or caller's) user holding `user:password`,
as `podman login` and `--creds` take them (a registry token goes where the password does,
with the user name the registry documents for tokens, e.g. `$oauthtoken` for NGC). A pull
with credentials writes them into a 0600 docker auth file in a 0700 temporary dir, passes its
path as `--authfile`, and removes the dir after: never in an argument, never logged. A pull
without credentials gets an empty auth file, so the agent's own user's logins (root's
`podman login`) never lend a user's pull their access.

A registry's refusal comes back as Podman says it, which is in the registry's own words
("unauthorized: authentication required", "manifest unknown", "connection refused").
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuhop.api.spec import check_image
from gpuhop.backends.podman import INSTALL, PodmanSettings, find

# How long one `podman images`/`rmi` may take; a pull has no bound of its own (an NGC image is
# 10 GB) but ends when its caller cancels it.
QUICK_SECONDS = 120


class ImageError(Exception):
    """A Podman command failed; the message is its own (the registry's) words."""


class PodmanMissing(ImageError):
    """This host has no Podman."""


def podman(settings: PodmanSettings) -> str:
    """The path of the Podman agent.toml names; PodmanMissing saying what to install where
    there is none."""
    exe = find(settings)
    if exe is None:
        raise PodmanMissing(
            f"this host has no Podman ({settings.program!r} is not installed), so it holds no"
            f" container images: install it on the GPU host (Debian/Ubuntu: {INSTALL}), or"
            " set agent.toml's podman to its path"
        )
    return exe


def registry_of(reference: str) -> str:
    """The registry `reference` names (its first part, where that has a dot, a colon or is
    localhost), else Docker Hub's, as Podman reads it."""
    first, slash, _rest = reference.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def tls_verify(insecure_registries: tuple[str, ...], reference: str) -> bool:
    """Whether a pull of `reference` checks TLS: not for a registry agent.toml's
    `insecure_registries` lists (a lab's registry on plain HTTP)."""
    return registry_of(reference) not in insecure_registries


@dataclass(frozen=True)
class HostImage:
    """One image in the host's store."""

    id: str
    references: list[str]
    size: int
    created: float | None


@dataclass
class PullProgress:
    """How far a pull is, from Podman's own lines: its phase, and the image's layers (blobs)
    started and done. Podman copies a few layers at once and says when each starts, not when
    it ends, so a layer counts as done when the config's copy begins (all are then) or when
    Podman says it already had it. Layers in all, and bytes, are not in its output: None."""

    phase: str = "starting"
    layers_started: int = 0
    layers_done: int = 0
    layers_total: int | None = None
    bytes_done: int | None = None
    bytes_total: int | None = None
    lines: list[str] = field(default_factory=list)

    def note(self) -> str:
        """One line for a status: "pulling image: 3 layers of ... copied"."""
        if self.phase == "copying layers":
            return f"pulling image: copying layers, {self.layers_done}/{self.layers_started} done"
        if self.layers_started:
            return f"pulling image: {self.phase}, {self.layers_done} layers copied"
        return f"pulling image: {self.phase}"


def _read_line(progress: PullProgress, line: str) -> bool:
    """Fold one of Podman's stderr lines into `progress`; whether it changed it."""
    if line.startswith("Trying to pull "):
        progress.phase = "asking the registry"
    elif line.startswith("Copying blob "):
        progress.phase = "copying layers"
        progress.layers_started += 1
        if "skipped" in line or "already exists" in line:
            progress.layers_done += 1
    elif line.startswith("Copying config "):
        progress.phase = "copying the config"
        progress.layers_done = progress.layers_started
    elif line.startswith("Writing manifest"):
        progress.phase = "writing the manifest"
    elif line.startswith("Storing signatures"):
        progress.phase = "storing"
    else:
        return False
    return True


# How many times a listing is tried when an image went away while Podman listed it.
LIST_TRIES = 5


def list_images(settings: PodmanSettings) -> list[HostImage]:
    """Every image in the store, once, newest first (Podman 4 lists an image once for each
    of its names, each row with all of them)."""
    for tries_left in reversed(range(LIST_TRIES)):
        try:
            out = _run([podman(settings), "images", "--format", "json"])
            break
        except ImageError as e:
            # Podman lists, then reads each image: one removed in between (a `gc`, another
            # user's `images rm`, a build's intermediate) fails the whole listing with
            # "image not known", or "layer not known" where its layers went first. Listed
            # again, it is simply not there.
            gone = "image not known" in str(e) or "layer not known" in str(e)
            if not tries_left or not gone:
                raise
    try:
        rows = json.loads(out or "[]")
    except ValueError as e:
        raise ImageError(f"podman images answered what is not JSON: {e}") from None
    images = []
    seen: set[str] = set()
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or not isinstance(row.get("Id"), str) or row["Id"] in seen:
            continue
        seen.add(row["Id"])
        names = row.get("Names") or []
        created = row.get("Created")
        images.append(
            HostImage(
                id=row["Id"],
                references=[n for n in names if isinstance(n, str)],
                size=int(row.get("Size") or 0),
                created=float(created) if isinstance(created, (int, float)) else None,
            )
        )
    images.sort(key=lambda i: i.created or 0, reverse=True)
    return images


def image_id(settings: PodmanSettings, reference: str) -> str | None:
    """The id of the image `reference` (or an id) names in the store (Podman's own
    resolution), or None. Asked of Podman once per change of the store's image list (a
    Podman start, 40-100 ms, that each image job's queueing and start would pay twice):
    Podman rewrites that list (`<graph root>/<driver>-images/images.json`, a new file each
    time) whenever an image comes, goes or is tagged, and an answer is kept only while the
    list is the one it was before Podman was asked."""
    program = podman(settings)
    listing = _image_list(program)
    before = _signature(listing)
    kept = _IDS.get((program, reference))
    if before is not None and kept is not None and kept[0] == before:
        return kept[1]
    argv = [program, "image", "inspect", "--format", "{{.Id}}", "--", reference]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=QUICK_SECONDS, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise ImageError(f"podman image inspect {reference}: {e}") from None
    found = (done.stdout.strip() or None) if done.returncode == 0 else None
    if before is not None and found is not None:  # (an absent image's answer is asked again)
        with _IDS_LOCK:
            if len(_IDS) >= _IDS_MAX:
                _IDS.clear()
            _IDS[(program, reference)] = (before, found)
    return found


# (program, reference) -> (the image list's signature when asked, the id or None).
_IDS: dict[tuple[str, str], tuple[tuple[int, int, int], str | None]] = {}
_IDS_LOCK = threading.Lock()
_IDS_MAX = 4096
# program -> the path of its store's image list (None: not known, nothing is kept).
_LISTS: dict[str, Path | None] = {}


def _image_list(program: str) -> Path | None:
    """Where the Podman `program` keeps its store's image list (asked once)."""
    if program in _LISTS:
        return _LISTS[program]
    argv = [program, "info", "--format", "{{.Store.GraphRoot}}\t{{.Store.GraphDriverName}}"]
    found = None
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=QUICK_SECONDS, stdin=subprocess.DEVNULL
        )
        root, _, driver = done.stdout.strip().partition("\t")
        if done.returncode == 0 and root.startswith("/") and driver.isidentifier():
            found = Path(root) / f"{driver}-images" / "images.json"
    except (OSError, subprocess.SubprocessError):
        pass
    _LISTS[program] = found
    return found


def _signature(path: Path | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def remove(settings: PodmanSettings, image: str) -> None:
    """Remove the image `image` (an id) with all its names; ImageError in Podman's words
    (e.g. a container still uses it)."""
    _run([podman(settings), "rmi", "--force", "--", image])


def untag(settings: PodmanSettings, image: str, names: list[str]) -> None:
    """Take the names `names` off the image `image` (an id), which keeps its others."""
    _run([podman(settings), "untag", "--", image, *names])


def pull(
    settings: PodmanSettings,
    reference: str,
    *,
    credentials: str | None = None,
    tls_verify: bool = True,
    progress: Callable[[PullProgress], None] | None = None,
    cancel: threading.Event | None = None,
) -> str:
    """Pull `reference` from its registry; the pulled image's id. `credentials` is
    "user:password" for that registry (see the module's docstring); `tls_verify=False` talks
    plain HTTP or unchecked TLS to it, for this pull only (a registry the admin lists in
    agent.toml's `insecure_registries`). `progress` is called in this thread as Podman
    reports. ImageError says why not, in the registry's words; `cancel` set stops it."""
    exe = podman(settings)
    check_image(reference)
    state = PullProgress()
    with _authfile(registry_of(reference), credentials) as authfile:
        argv = [exe, "pull", f"--tls-verify={'true' if tls_verify else 'false'}"]
        argv += ["--authfile", str(authfile), "--", reference]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        watcher = None
        if cancel is not None:
            watcher = threading.Thread(target=_stop_on, args=(cancel, proc), daemon=True)
            watcher.start()
        out = ""
        try:
            assert proc.stderr is not None and proc.stdout is not None
            for raw in proc.stderr:
                line = raw.rstrip("\n")
                state.lines.append(line)
                if _read_line(state, line) and progress is not None:
                    progress(state)
            out = proc.stdout.read()
        except BaseException:
            proc.kill()  # a progress callback that raised, an interrupt: no pull left behind
            raise
        finally:
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            if watcher is not None:
                watcher.join()  # it ends as the process has
    if cancel is not None and cancel.is_set():
        raise ImageError(f"the pull of {reference} was stopped")
    if proc.returncode != 0:
        raise ImageError(_error_of(state.lines, reference))
    pulled = out.strip().splitlines()
    if not pulled:
        raise ImageError(f"podman pull {reference} said it succeeded but named no image")
    state.phase = "done"
    if progress is not None:
        progress(state)
    return pulled[-1].strip()


def _stop_on(cancel: threading.Event, proc: subprocess.Popen[str]) -> None:
    while proc.poll() is None:
        if cancel.wait(0.5):
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            return


@contextlib.contextmanager
def _authfile(registry: str, credentials: str | None):
    """A docker auth file holding `credentials` for `registry` (or none at all), 0600 in a
    0700 dir; removed on the way out."""
    folder = Path(tempfile.mkdtemp(prefix="gpuhop-pull-"))
    try:
        os.chmod(folder, 0o700)
        auths = {}
        if credentials is not None:
            user, colon, password = credentials.partition(":")
            if not colon or not user:
                raise ImageError(
                    "the registry secret must hold user:password (a token goes where the"
                    " password does)"
                )
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            auths[registry] = {"auth": token}
        path = folder / "auth.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"auths": auths}, f)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _error_of(lines: list[str], reference: str) -> str:
    """Podman's last error line, without its "Error: " and the "initializing source docker://
    REF: " that precede the registry's own words."""
    errors = [line for line in lines if line.startswith("Error: ")]
    if not errors:
        tail = "; ".join(line for line in lines[-3:] if line.strip())
        return f"podman pull {reference} failed" + (f": {tail}" if tail else "")
    text = errors[-1].removeprefix("Error: ")
    text = re.sub(r"^initializing source docker://\S+?: ", "", text)
    return f"cannot pull {reference}: {text}"


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=QUICK_SECONDS,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise ImageError(f"{' '.join(argv[1:3])} took over {QUICK_SECONDS} s") from None
    if done.returncode != 0:
        words = done.stderr.strip().splitlines()
        why = words[-1].removeprefix("Error: ") if words else f"exit status {done.returncode}"
        raise ImageError(f"{' '.join(argv[1:2])}: {why}")
    return done.stdout
