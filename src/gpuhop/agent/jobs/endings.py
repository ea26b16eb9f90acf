"""Runs in the agent: why an attempt ended (`api.EndClass`), from what the backend reported,
what the agent did to it, and the tail of its log.

An ML engineer reads the class to decide what to do next: fix the code (`app-error`), ask for
more GPU memory (`oom-gpu`) or host memory (`oom-host`), or just run it again (`killed`,
`lost`); and `--retry-on infra` retries only the classes that are not the code's fault.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from gpuhop.api import EndClass, JobState
from gpuhop.runtime import legacykeras
from gpuhop.serving import needs

# How much of the log's end is searched for a framework's GPU out-of-memory error.
LOG_TAIL_BYTES = 64 * 1024

# What TensorFlow, PyTorch and JAX print when a GPU allocation fails.
GPU_OOM = re.compile(
    rb"ResourceExhaustedError"
    rb"|OOM when allocating tensor"
    rb"|CUDA out of memory"
    rb"|torch\.OutOfMemoryError"
    rb"|RESOURCE_EXHAUSTED"
)


# Signals a program raises on itself when it crashes: its own error, not one from outside.
_CRASHES = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL})


# Lines the job's own gpuhop code prints after a failure it knows the fix for (a Keras 3
# error that tf-keras fixes: see gpuhop.runtime.legacykeras; a model server whose Python
# lacks a package it needs: gpuhop.serving.needs), and what the failure line adds. The words
# added are the agent's: a job's line only picks one of them.
HINTS = {legacykeras.LINE.encode(): legacykeras.HINT, **needs.hints()}


# The last line of a Python job that ended on an import of a module its Python lacks.
NO_MODULE = re.compile(rb"^ModuleNotFoundError: No module named '([A-Za-z_][\w.]{0,99})'\s*$")


def _tail(log: Path) -> bytes:
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            return f.read()
    except OSError:
        return b""


def gpu_oom_in(log: Path) -> bool:
    """Whether the end of a job's log holds a framework's GPU out-of-memory error."""
    return GPU_OOM.search(_tail(log)) is not None


# What an image job's init (catatonit, `podman run --init`), or the waiter of a container
# started ahead of it (gpuhop.backends.local.ready), prints, then exiting 1, where it could
# not start the job's program: not in the image, or not runnable there.
NO_PROGRAM = re.compile(
    rb"^(?:ERROR \(catatonit:\d+\): failed to exec pid1"
    rb"|gpuhop: failed to exec the job's program): (.{1,200})$"
)
# What a gang's leader puts before each line of worker I's output in the job's log.
WORKER_PREFIX = re.compile(rb"^\[worker \d{1,6}\] ")


def hint_note(log: Path) -> str:
    """What a failed job's reason adds where the end of its log holds a hint line of the
    job's own gpuhop code (the line whole, at a line's start, or after a gang worker's
    prefix), or says that an image job's program could not be started in its image:
    "; HINT", or ""."""
    lines = [WORKER_PREFIX.sub(b"", line) for line in _tail(log).splitlines()]
    hint = next((f"; {hint}" for line, hint in HINTS.items() if line in lines), "")
    found = next((m for line in lines if (m := NO_PROGRAM.match(line))), None)
    if not hint and found:
        why = found.group(1).decode(errors="replace").strip()
        hint = (
            f"; its program could not be started in its image ({why}): is it installed there,"
            " on the image's PATH (a script: is the image's python3 there)?"
        )
    last = next((line for line in reversed(lines) if line.strip()), b"")
    if not hint and (missing := NO_MODULE.match(last)):
        top = missing.group(1).decode().split(".")[0]
        hint = (
            f"; its Python has no module {top!r}: a package goes in the work dir's"
            " requirements.txt (or -r FILE), or the job runs with a Python or an image that has"
            " it (--python, --image); a module of the project's own must be in the work dir"
            " (run from the project's top, or -C DIR)"
        )
    return hint


def classify(
    state: JobState,
    *,
    exit_code: int | None,
    sig: int | None,
    log: Path,
    stopped_class: str | None = None,
    oom_killed: bool = False,
) -> EndClass:
    """The class of an attempt that ended in `state`.

    `stopped_class`: the class the agent gave when it stopped the job itself (a time limit,
    a GPU fault, an idle job);
    `oom_killed`: the job's own cgroup counted an OOM kill. Without that, a SIGKILL stays
    `killed`: on a host that cannot tell, the OOM killer is not guessed at.
    """
    if state is JobState.succeeded:
        return EndClass.succeeded
    if state is JobState.cancelled:
        # The agent's own cancel (an idle job) says why; a user's is plain `cancelled`.
        return EndClass(stopped_class) if stopped_class else EndClass.cancelled
    if state is JobState.lost:
        return EndClass.lost
    if stopped_class is not None:
        return EndClass(stopped_class)
    if gpu_oom_in(log):
        return EndClass.oom_gpu
    if sig == signal.SIGKILL and oom_killed:
        return EndClass.oom_host
    if sig is not None and sig not in _CRASHES:
        return EndClass.killed
    return EndClass.app_error
