"""Runs in the agent: the cache of Python environments built for jobs' requirements.

An environment's id is the sha256 of everything that changes its build: the interpreter's
path and version, the requirements text, the job's variables that pip honours
(`build_env`) and, on a team agent, the user whose job asks, so the same set on the same
interpreter is built once and reused by that user's jobs and never by another user's (the
build itself runs in the job's leader: see `envbuild.py`). A team agent takes requirements
that name packages and versions only (`check_plain`). Listing and removal run here; an
environment that a queued, starting or running job uses is never removed.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from packaging.requirements import InvalidRequirement, Requirement

from gpuhop.api.data import EnvInfo
from gpuhop.backends import procs
from gpuhop.backends.local import envbuild


class EnvError(ValueError):
    """A bad interpreter or requirements file; the message says which and why."""


# How an interpreter is asked its version: one line after a marker, in whatever else it
# prints (`procs.ask`: its output capped, and killed after VERSION_SECONDS).
_VERSION_MARK = "gpuhop-python-version:"
_VERSION_ASK = f"import json, sys; print({_VERSION_MARK!r} + json.dumps(sys.version))"
VERSION_SECONDS = 60


@functools.lru_cache(maxsize=64)
def _version(python: str, mtime_ns: int) -> str:
    """`python`'s sys.version. The path may name any program on the host (`--python`): one
    that prints without end, or never ends, is stopped and refused, never read into the
    agent's memory or waited for longer."""
    if python == sys.executable:
        return sys.version
    try:
        answer = procs.ask([python, "-c", _VERSION_ASK], seconds=VERSION_SECONDS)
    except OSError as e:
        raise EnvError(f"{python} could not be run: {e}") from None
    if answer.stopped is not None:
        raise EnvError(f"{python} is not a working Python: asked its version, {answer.stopped}")
    version = answer.marked(_VERSION_MARK)
    if isinstance(version, str):
        return version
    if answer.code < 0:
        raise EnvError(
            f"{python} is not a working Python: asked its version, it was"
            f" {procs.describe_signal(-answer.code)}"
        )
    raise EnvError(f"{python} is not a working Python: {answer.out.strip()[-300:]}")


# Dirs of the state dir that hold what users sent or their jobs wrote.
USERS_FILES = ("jobs", "blobs", "trees", "checkouts", "datasets", "envs", "users", "tmp", "objects")


def check_python(python: str, home: Path) -> str:
    """An interpreter path given by a job: absolute, an executable file, and none of the
    files users sent or their jobs wrote (the agent runs it to learn its version, and a
    user's file must never run as the agent). Returns it."""
    if not os.path.isabs(python):
        raise EnvError(f"--python takes an absolute path on the GPU host, not {python!r}")
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise EnvError(f"--python {python}: no executable file there on the GPU host")
    real = Path(os.path.realpath(python))
    home = Path(os.path.realpath(home))
    if any(real.is_relative_to(home / d) for d in USERS_FILES):
        raise EnvError(
            f"--python {python}: that file lies among what users sent to the agent or their"
            f" jobs wrote ({home}); name an interpreter installed on the GPU host"
        )
    return os.path.normpath(python)


def python_version(python: str) -> str:
    return _version(python, os.stat(python).st_mtime_ns)


# pip's own reading of a requirements file (pip/_internal/req/req_file.py): a comment, a
# `${VAR}` it fills in from the environment, a PEP 263 coding line in the first two lines.
_PIP_COMMENT = re.compile(r"(^|\s+)#.*$")
_PIP_CODING = re.compile(r"coding[:=]\s*[-\w.]+")
# A name pip takes for an archive file beside the requirements (pip's ARCHIVE_EXTENSIONS).
_ARCHIVES = (
    ".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz",
    ".tar.xz", ".txz", ".tlz", ".tar.lz", ".tar.lzma",
)  # fmt: skip


def check_plain(requirements: str) -> None:
    """Refuse requirements that name anything but packages, extras, versions and markers:
    an option, a URL or a path would have pip read or fetch what the user names. The
    lines are those pip reads (continuations joined, comments dropped), split as pip does."""
    for number, line in enumerate(requirements.split("\n")[:2], start=1):
        if line.startswith("#") and _PIP_CODING.search(line):
            _refuse(number, line, "pip would read the file in the encoding it names")
    for number, line in _pip_lines(requirements):
        if any(token.startswith("-") for token in line.split(" ")):
            _refuse(number, line, "it passes pip an option")
        if "${" in line:
            _refuse(number, line, "pip would put an environment variable's value there")
        try:
            req = Requirement(line)
        except InvalidRequirement as e:
            if "://" in line or re.match(r"(git|hg|svn|bzr)\+", line):
                _refuse(number, line, "it names a URL")
            if line.startswith((".", "/", "~", "file:")):
                _refuse(number, line, "it names a path")
            _refuse(number, line, f"it is not a package name and version ({e})")
        if req.url is not None:
            _refuse(number, line, "it names a URL")
        if req.name.lower().endswith(_ARCHIVES):
            _refuse(number, line, "pip would take it for the path of an archive file")


def _pip_lines(text: str) -> list[tuple[int, str]]:
    """(number, line) of each requirement line pip would read in `text`."""
    out: list[tuple[int, str]] = []
    joined: list[str] = []
    first = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if _PIP_COMMENT.match(line):
            line = " " + line  # dropped below, also where it ends a continued line
        elif line.endswith("\\"):
            first = first or number
            joined.append(line.strip("\\"))
            continue
        if joined:
            line, number, joined, first = "".join([*joined, line]), first, [], 0
        out.append((number, line))
    if joined:
        out.append((first, "".join(joined)))
    return [(n, s) for n, line in out if (s := _PIP_COMMENT.sub("", line).strip())]


def _refuse(number: int, line: str, why: str) -> NoReturn:
    raise EnvError(
        f"requirements line {number} ({line.strip()[:200]!r}): {why}. A team agent takes package"
        " names, extras, versions and markers only (e.g. 'numpy>=1.26'): anything else would"
        " make the agent read or fetch what a user names"
    )


# What in a job's environment changes a build besides the interpreter and the text: pip's
# (and uv's) settings; where pip finds its config files and credentials; what it fetches
# through and whom it trusts; what it imports besides the venv; what compiles a package from
# source. Matched on the upper-cased name (proxies are read in either case).
BUILD_ENV_PREFIXES = ("PIP_", "UV_")
BUILD_ENV_NAMES = frozenset(
    {
        "HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "NETRC",
        "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
        "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE",
        "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE",
        "CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CUDA_HOME", "CUDA_PATH",
    }
)  # fmt: skip


def build_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of a job's environment that change how its requirements are built."""
    return {
        k: v
        for k, v in sorted(env.items())
        if k.upper().startswith(BUILD_ENV_PREFIXES) or k.upper() in BUILD_ENV_NAMES
    }


class EnvStore:
    def __init__(self, root: Path):
        self.root = root

    def spec(
        self,
        python: str,
        requirements: str,
        env: Mapping[str, str] | None = None,
        owner: str | None = None,
    ) -> dict[str, str]:
        """What the leader needs to build or reuse the environment for this set, asked for by
        a job with the variables `env`; `owner` (a team agent's caller) gets one of their own."""
        return self._spec(f"{python}\n{python_version(python)}", python, requirements, env, owner)

    def spec_on_image(
        self,
        image: str,
        requirements: str,
        env: Mapping[str, str] | None = None,
        owner: str | None = None,
    ) -> dict[str, str]:
        """As `spec`, for a job in the container image `image`: built by the image's own pip
        into a dir of the image the reference names when the job starts (envbuild.py)."""
        return self._spec(f"image\n{image}", image, requirements, env, owner)

    def _spec(
        self,
        base: str,
        python: str,
        requirements: str,
        env: Mapping[str, str] | None,
        owner: str | None,
    ) -> dict[str, str]:
        key = f"{base}\n{requirements}"
        more: dict[str, object] = {}
        if variables := build_env(env or {}):
            more["env"] = variables
        if owner is not None:
            more["owner"] = owner
        if more:
            # In front, as JSON: it cannot be read as the start of a key without it (an
            # interpreter's path starts with "/"), and an id without it stays what it was.
            key = json.dumps(more, sort_keys=True) + "\n" + key
        env_id = hashlib.sha256(key.encode()).hexdigest()
        spec = {
            "id": env_id,
            "dir": str(self.root / env_id),
            "python": python,
            "requirements_text": requirements,
        }
        if owner is not None:
            spec["owner"] = owner  # recorded with the build: only they list it
        return spec

    def _built(self, env_id: str) -> Path:
        """The dir an environment was built in: its own, or, for one on a container image,
        the one of the image it was last built for (envbuild.image_dir)."""
        folder = self.root / env_id
        if (folder / envbuild.MARKER).exists():
            return folder
        images = [d for d in folder.glob("*/") if (d / envbuild.MARKER).exists()]
        return max(images, key=lambda d: (d / envbuild.MARKER).stat().st_mtime, default=folder)

    def owner(self, env_id: str) -> str | None:
        """The user whose environment this is (a team agent's build), else None."""
        try:
            meta = json.loads((self._built(env_id) / envbuild.MARKER).read_text())
        except (OSError, ValueError):
            return None
        owner = meta.get("owner") if isinstance(meta, dict) else None
        return owner if isinstance(owner, str) else None

    def ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        # An empty dir is none: a build that failed in a job's sandbox (where its dir was a
        # mount point and could not be removed), or one about to start.
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and len(p.name) == 64 and any(p.iterdir())
        )

    def info(self, env_id: str, jobs: list[str]) -> EnvInfo:
        folder = self._built(env_id)
        try:
            meta = json.loads((folder / envbuild.MARKER).read_text())
        except (OSError, ValueError):
            meta = None
        try:
            last_used = float((folder / envbuild.LAST_USED).read_text())
        except (OSError, ValueError):
            last_used = None
        return EnvInfo(
            id=env_id,
            python=meta["python"] if meta else "?",
            requirements=meta["requirements"] if meta else "",
            created_at=_dt(meta["created_at"]) if meta else None,
            last_used=_dt(last_used),
            build_seconds=meta["build_seconds"] if meta else None,
            size=meta["size"] if meta else 0,
            ready=meta is not None,
            jobs=jobs,
        )

    def last_used(self, env_id: str) -> float:
        folder = self._built(env_id)
        for name in (envbuild.LAST_USED, envbuild.MARKER):
            try:
                return (folder / name).stat().st_mtime
            except OSError:
                continue
        return 0.0

    def remove(self, env_id: str) -> bool:
        """Remove an environment unless a build holds its lock. Returns whether it did."""
        folder = self.root / env_id
        with open(f"{folder}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            shutil.rmtree(folder, ignore_errors=True)
            Path(f"{folder}.lock").unlink(missing_ok=True)
        return True


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


def older_than(store: EnvStore, env_id: str, seconds: float) -> bool:
    return time.time() - store.last_used(env_id) > seconds
