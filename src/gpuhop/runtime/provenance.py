"""Runs inside the job, at the start of its first Python process: the job's half of the
record of what it ran on (the agent adds its own: gpuhop's version, the tree, the GPUs and
driver; see gpuhop.agent.jobs.provenance).

What is read here is what only the job's interpreter sees: its version and platform, the
distributions installed on its sys.path (from the names of their `.dist-info` and
`.egg-info` dirs, as the packaging standards write them: no `importlib.metadata`, which
costs a quarter of a second over a TensorFlow venv), and TensorFlow's build info (the CUDA
and cuDNN versions it was built with) from its `build_info.py` as a file, never by importing
TensorFlow. It is written as plain lines, which the agent parses; nothing here imports
more than the interpreter has already loaded (`_thread` and `atexit` are built in).

The start-up hook (startup/sitecustomize.py) loads this file by path only where
$GPUHOP_PROVENANCE_FILE names an empty file (every later process pays one stat), and
`start` writes it in a thread of its own, so the job's first line runs without waiting;
a process that ends first writes it on its way out. Several processes may start at once
(a multi-worker job): each writes its record in one append, and the agent takes the first.
"""

from __future__ import annotations

import os
import sys

ENV = "GPUHOP_PROVENANCE_FILE"
HEADER = "gpuhop-provenance 1"
END = "end"
# How long a process that ends waits for the thread still writing its record.
EXIT_WAIT_SECONDS = 2.0
# TensorFlow's distributions, any of which has the build info file.
TENSORFLOW = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tf-nightly-cpu")
BUILD_INFO = os.path.join("tensorflow", "python", "platform", "build_info.py")


def start(path: str) -> None:
    """Write the record to `path` soon, in a thread, or at exit if the process ends first."""
    import _thread
    import atexit

    lock = _thread.allocate_lock()
    done: list[bool] = []

    def write(wait: float) -> None:
        if not lock.acquire(timeout=wait):
            return
        try:
            if not done:
                done.append(True)
                _write(path)
        except Exception:
            pass  # a record is never worth a job's failure
        finally:
            lock.release()

    atexit.register(write, EXIT_WAIT_SECONDS)
    _thread.start_new_thread(write, (-1,))


def _write(path: str) -> None:
    if os.stat(path).st_size:
        return  # another process of the job wrote it
    text = "\n".join([HEADER, *lines(), END, ""])
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode("utf-8", "replace"))
    finally:
        os.close(fd)


def lines() -> list[str]:
    """The record's lines: tab-separated fields, one fact a line."""
    uname = os.uname()
    out = [
        _line("python", sys.version.split()[0], sys.implementation.name, sys.executable),
        _line("platform", uname.sysname, uname.release, uname.machine),
        _line("attempt", os.environ.get("GPUHOP_ATTEMPT", "")),
        _line("worker", os.environ.get("GPUHOP_WORKER_INDEX", "")),
    ]
    found, homes = distributions(sys.path)
    out += [_line("dist", name, version) for name, version in sorted(found.items())]
    tensorflow = next((homes[name] for name in TENSORFLOW if name in homes), None)
    if tensorflow is not None:
        out += [_line("tf-build", line) for line in _build_info(tensorflow)]
    return out


def distributions(path: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Name -> version of each distribution on `path` (the first of a name wins, as in an
    import), and name -> the dir it was found in."""
    found: dict[str, str] = {}
    homes: dict[str, str] = {}
    for entry in path:
        try:
            scan = os.scandir(entry or os.curdir)
        except OSError:
            continue
        with scan:
            for item in scan:
                stem, dot, kind = item.name.rpartition(".")
                if not dot or kind not in ("dist-info", "egg-info"):
                    continue
                name, _, version = stem.partition("-")
                # An egg's dir name goes on with "-pyX.Y": the version is the part before it.
                version = version.split("-")[0]
                key = name.lower().replace("_", "-").replace(".", "-")
                if key and version and key not in found:
                    found[key] = version
                    homes[key] = entry
    return found, homes


def _build_info(site: str) -> list[str]:
    """The lines of TensorFlow's build_info.py that set its build info (a literal the agent
    reads), or none where it has no such file."""
    try:
        with open(os.path.join(site, BUILD_INFO), encoding="utf-8", errors="replace") as f:
            text = f.read(64 * 1024)
    except OSError:
        return []
    return [line for line in text.splitlines() if line.startswith("build_info")][:20]


def _line(*fields: str) -> str:
    return "\t".join(f.replace("\t", " ").replace("\n", " ") for f in fields)
