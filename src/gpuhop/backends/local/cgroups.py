"""Runs in the agent (local backend): a memory cgroup of its own for each attempt, where the
host lets the agent make one, so that the kernel's OOM kills among the job's processes are
counted and its end says `oom-host` instead of a guess.

The cgroup is a child of the agent's own memory cgroup (cgroup v1's memory hierarchy, or
cgroup v2 where the agent's cgroup hands the memory controller to its children). It sets no
limit: the kernel counts an OOM kill in the cgroup of the process it kills, whichever limit
(the host's, a container's, or one an admin set on the job's cgroup) was reached. The
leader joins it before it execs (`wrap`), so every process of the job is born inside. Where
no cgroup can be made the job runs as before, and a SIGKILL stays `killed`.

The attempt's end removes its cgroup (`oom_kills`), SIGKILLing what of the attempt is still
in it and retrying while the kernel refuses (EBUSY: a killed process still exiting). One it
could not remove keeps its record in the job's dir, and the agent's start and stop remove
it (`sweep`): only those recorded there, so never another agent's.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import signal
import time
from pathlib import Path

from gpuhop.home import JobPaths

PROC = Path("/proc/self")
# How long `remove` waits for a cgroup's last processes to leave it (SIGKILLed, exiting).
EMPTY_SECONDS = 5.0


def _file(jp: JobPaths) -> Path:
    return jp.root / "cgroup.json"


@functools.cache
def agent_cgroup() -> tuple[Path, str] | None:
    """The agent's own memory cgroup and the file that counts OOM kills in its children;
    None where it has none it may make children in."""
    try:
        membership = (PROC / "cgroup").read_text().splitlines()
        mounts = (PROC / "mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, (fstype, _source, options, *_) = left.split(), right.split()
        root, point = fields[3], fields[4]
        if fstype == "cgroup" and "memory" in options.split(","):
            want, counter = (lambda c: "memory" in c.split(",")), "memory.oom_control"
        elif fstype == "cgroup2":
            want, counter = (lambda c: c == ""), "memory.events"
        else:
            continue
        for entry in membership:
            _, controllers, rel = entry.split(":", 2)
            if not want(controllers) or not rel.startswith(root):
                continue
            here = Path(point) / rel[len(root) :].lstrip("/")
            delegated = _read(here / "cgroup.subtree_control").split()
            if counter == "memory.events" and "memory" not in delegated:
                break  # children of this v2 cgroup get no memory controller
            # Only where the agent may make its children: an unprivileged agent's memory
            # cgroup is usually root's (a leader server told of one it cannot write to
            # fails every spare it forks).
            if here.is_dir() and os.access(here, os.W_OK | os.X_OK):
                return here, counter
            break
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def make(jp: JobPaths, name: str) -> Path | None:
    """A new cgroup for one attempt, recorded in the job's dir; None where none can be made."""
    found = _attempt_path(name)
    if found is None:
        return None
    path, counter = found
    try:
        path.mkdir(exist_ok=True)
        if not (path / counter).exists():
            path.rmdir()
            return None
        _record(jp, path, counter)
    except OSError:
        return None
    return path


def plan(jp: JobPaths, name: str) -> Path | None:
    """The path of a new cgroup for one attempt, recorded in the job's dir (so that its end
    removes it) but not made: the leader server makes it, or renames its waiting leader's cgroup
    to it (leaderserver.py). None where the agent has no memory cgroup to make it in."""
    found = _attempt_path(name)
    if found is None:
        return None
    path, counter = found
    try:
        _record(jp, path, counter)
    except OSError:
        return None
    return path


def _attempt_path(name: str) -> tuple[Path, str] | None:
    """Where the attempt `name`'s cgroup goes, under the agent's, and the memory counter
    file that tells it is a memory cgroup; None where the agent has no memory cgroup."""
    found = agent_cgroup()
    if found is None:
        return None
    parent, counter = found
    return parent / f"gpuhop-{name}", counter


def _record(jp: JobPaths, path: Path, counter: str) -> None:
    _file(jp).write_text(json.dumps({"path": str(path), "counter": counter}))


def wrap(path: Path, argv: list[str]) -> list[str]:
    """`argv` run by a shell that first moves itself into the cgroup at `path` (and runs
    `argv` anyway, outside it, if it cannot): the same pid, so nothing else changes."""
    join = 'echo $$ > "$0" 2>/dev/null; exec "$@"'
    return ["/bin/sh", "-c", join, str(path / "cgroup.procs"), *argv]


def oom_kills(jp: JobPaths) -> int:
    """How many OOM kills the attempt's cgroup counted; the cgroup is removed (its
    processes are gone by now, or are ended). 0 where the attempt had none."""
    found = _recorded(jp)
    if found is None:
        return 0
    path, counter = found
    kills = 0
    for line in _read(path / counter).splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            kills = int(value)
    if remove(path, wait=EMPTY_SECONDS):
        _file(jp).unlink(missing_ok=True)
    return kills  # else the record stays, for `sweep` to remove the cgroup later


def _recorded(jp: JobPaths) -> tuple[Path, str] | None:
    try:
        spec = json.loads(_file(jp).read_text())
        return Path(spec["path"]), str(spec["counter"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove(path: Path, wait: float = 0.0, kill: bool = True) -> bool:
    """Remove an ended attempt's cgroup; True once it is gone. The kernel refuses (EBUSY)
    while a process is in it, and for a moment after its last one was SIGKILLed, while
    that one still exits: so retry for up to `wait` seconds, SIGKILLing (with `kill`) what
    is still in it: every process in an attempt's cgroup is that attempt's."""
    deadline = time.monotonic() + wait
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
        if kill:
            for pid in _read(path / "cgroup.procs").split():
                with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.01)


def sweep(jobs: Path) -> int:
    """Remove the cgroups of this agent's attempts that a job's end could not (recorded in
    its jobs' dirs, so never another agent's) and that are empty now: a running job's is
    not, and stays. Returns how many were removed."""
    found = agent_cgroup()
    if found is None:
        return 0
    removed = 0
    for record in jobs.glob("*/cgroup.json"):
        try:
            path = Path(json.loads(record.read_text())["path"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        # Ours only: a child of the agent's cgroup, by our name (not a spare's).
        ours = path.parent == found[0] and path.name.startswith("gpuhop-")
        spare = path.name.startswith("gpuhop-spare-")
        if ours and not spare and path.is_dir() and remove(path, kill=False):
            record.unlink(missing_ok=True)
            removed += 1
    return removed
