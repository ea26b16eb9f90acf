"""Runs in the agent: `gpuhop profile` (POST /v1/jobs/{ref}/profile), a few seconds' profile
of a running job, written among its artifacts.

A TensorFlow or JAX process of the job waits for a request on its FIFO in the job's control
dir (see gpuhop.runtime.profiling): the agent writes one, the process runs its framework's
profiler for the duration into the job's TensorBoard dir, and answers with a file beside the
FIFO. A job none of whose processes has a FIFO (plain Python, or a framework not loaded
yet) is sampled from outside instead, by py-spy (as `gpuhop stacks` dumps it), into a flame
graph under `artifacts/profiles/`.

The control dir, the artifacts and everything in them are the job's, and a job is hostile:
each is opened a component at a time, following no link, a FIFO is written only if it is
one, and what the job answers is read (bounded) only for whether it worked and why not; the
files are found by the agent itself, as the run dirs that appeared meanwhile.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.host import pyspy
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.services import jobs
from gpuhop.agent.services.stacks import check_reachable, processes_of
from gpuhop.api import ErrorCode
from gpuhop.api.profile import JobProfile, ProcessProfile
from gpuhop.backends import procs
from gpuhop.home import JobPaths

# After the duration, how long a process may take to stop its profiler and write the trace
# (TensorFlow's stop() takes a few seconds on a busy CPU for a 5 s capture).
WRITE_GRACE = 90.0
# A process's answer is a short JSON object; a bigger file is not one.
MAX_ANSWER = 64 * 1024
# Processes sampled by py-spy at once (the first ones, by pid).
MAX_SAMPLED = 8
PROFILE_DIRS = ("plugins", "profile")


# The job's side names its files so (gpuhop.runtime.profiling, which the agent may not
# import: the layering keeps the runtime apart); tests/integration/test_profile.py runs both.
def fifo_name(pid: int) -> str:
    return f"profile-{pid}.fifo"


def result_name(pid: int, request: str) -> str:
    return f"profile-{pid}-{request}.json"


# The jobs a capture runs in now: job id -> (its start, time.monotonic(); its seconds).
_busy: dict[str, tuple[float, float]] = {}
_busy_lock = threading.Lock()


class _Process(NamedTuple):
    pid: int
    worker: int | None
    command: str


def capture(
    rt: AgentContext, ref: str, caller: Caller, seconds: float, worker: int | None
) -> JobProfile:
    """Profile the running job `ref` names (the caller's own, or any for an admin) for
    `seconds`: all its processes, or worker `worker`'s only. Returns once the files are
    written."""
    job = jobs.find(rt, ref, caller)
    check_reachable(rt, job, worker, "gpuhop profile", "nothing to profile")
    found = [_Process(*p) for p in processes_of(job, worker)]
    if not found:
        raise ApiError(409, ErrorCode.conflict, f"job {job.id} has just ended: nothing to profile")
    with _one_at_a_time(job.id, seconds):
        jp = rt.supervisor.job_paths(job.id)
        asked, busy = _ask(jp, found, seconds)
        if asked:
            return _framework_profile(job, jp, asked, seconds)
        if busy:
            raise ApiError(
                409,
                ErrorCode.conflict,
                f"job {job.id}'s {busy} is not taking profile requests now (a capture"
                " started by another client may be running, or it is ending); try again",
            )
        return _sampled_profile(rt, job, jp, found, seconds)


@contextmanager
def _one_at_a_time(job_id: str, seconds: float) -> Iterator[None]:
    """One capture of a job at a time; a second is refused, saying when the first ends (it
    runs its whole time, whether or not its asker still waits)."""
    with _busy_lock:
        if job_id in _busy:
            started, length = _busy[job_id]
            left = started + length - time.monotonic()
            when = f"about {left:.0f}s left" if left >= 1 else "its trace is being written"
            raise ApiError(
                409,
                ErrorCode.conflict,
                f"job {job_id} is being profiled already (a capture of {length:g}s, {when});"
                " try again when that capture ends",
            )
        _busy[job_id] = (time.monotonic(), seconds)
    try:
        yield
    finally:
        with _busy_lock:
            _busy.pop(job_id, None)


def _ask(
    jp: JobPaths, found: list[_Process], seconds: float
) -> tuple[dict[str, tuple[_Process, int]], str]:
    """Write a request to each process's FIFO. Returns ({request id: (process, its pid in
    the job)} for those asked, and a word for a process with a FIFO nobody reads now)."""
    asked: dict[str, tuple[_Process, int]] = {}
    busy = ""
    try:
        control = _open_dir(str(jp.control))
    except OSError:
        return asked, busy  # an attempt started before profiling existed, or no dir
    try:
        for process in found:
            inner = pyspy.pid_inside(process.pid)
            if inner is None:
                continue
            request = uuid.uuid4().hex[:12]
            try:
                fd = os.open(
                    fifo_name(inner), os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=control
                )
            except OSError as e:
                if e.errno == errno.ENXIO:  # a FIFO that nobody is waiting to read now
                    busy = f"process {process.pid}"
                continue
            try:
                if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                    continue
                os.write(fd, json.dumps({"seconds": seconds, "id": request}).encode())
            except OSError:
                continue
            finally:
                os.close(fd)
            asked[request] = (process, inner)
    finally:
        os.close(control)
    return asked, busy


def _framework_profile(
    job: JobRecord, jp: JobPaths, asked: dict[str, tuple[_Process, int]], seconds: float
) -> JobProfile:
    before = _runs(jp, job.spec.workers)
    answers = _answers(jp, asked, seconds)
    made = sorted(_runs(jp, job.spec.workers) - before)
    profiled = []
    frameworks = set()
    for request, (process, _inner) in asked.items():
        answer = answers.get(request) or {}
        framework = str(answer.get("framework") or "tensorflow")
        frameworks.add(framework)
        error = None if answer.get("ok") is True else _said(answer)
        profiled.append(
            ProcessProfile(
                pid=process.pid,
                worker=process.worker,
                command=process.command,
                profiler=framework,
                error=error,
            )
        )
    if not made:
        raise _no_profile(
            f"job {job.id} wrote no profile", profiled, "its processes answered nothing"
        )
    return JobProfile(
        job=job.id,
        profiler="jax" if frameworks == {"jax"} else "tensorflow",
        seconds=seconds,
        files=made,
        processes=profiled,
    )


def _no_profile(what: str, profiled: list[ProcessProfile], otherwise: str) -> ApiError:
    """The refusal for a capture that made no file: each process's reason, or `otherwise`."""
    why = "; ".join(f"process {p.pid}: {p.error}" for p in profiled if p.error)
    return ApiError(409, ErrorCode.conflict, f"{what}: {why or otherwise}")


def _answers(
    jp: JobPaths, asked: dict[str, tuple[_Process, int]], seconds: float
) -> dict[str, dict[str, object]]:
    """Each asked process's answer, once all have answered (or ended, or taken too long)."""
    deadline = time.monotonic() + seconds + WRITE_GRACE
    answers: dict[str, dict[str, object]] = {}
    waiting = dict(asked)
    while waiting and time.monotonic() < deadline:
        for request, (process, inner) in list(waiting.items()):
            answer = _read_answer(jp, result_name(inner, request))
            if answer is not None:
                answers[request] = answer
            elif procs.command_line(process.pid) is None:
                answers[request] = {"ok": False, "error": "it ended before its profile was written"}
            else:
                continue
            del waiting[request]
        if waiting:
            time.sleep(0.1)
    for request in waiting:
        answers[request] = {"ok": False, "error": f"no answer {WRITE_GRACE:.0f}s after the end"}
    return answers


def _read_answer(jp: JobPaths, name: str) -> dict[str, object] | None:
    try:
        control = _open_dir(str(jp.control))
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=control)
    except OSError:
        return None
    finally:
        os.close(control)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {"ok": False, "error": "its answer is not a file"}
        data = os.read(fd, MAX_ANSWER + 1)
    finally:
        os.close(fd)
    try:
        answer = json.loads(data) if len(data) <= MAX_ANSWER else None
    except (ValueError, RecursionError):
        answer = None
    return answer if isinstance(answer, dict) else {"ok": False, "error": "an unreadable answer"}


def _said(answer: dict[str, object]) -> str:
    """The process's own words for why it made no profile: one line, bounded."""
    error = str(answer.get("error") or "no profile")
    return " ".join(error.split())[:300]


def _runs(jp: JobPaths, workers: int) -> set[str]:
    """The profile run dirs in the job's TensorBoard dir (and each worker's), as paths under
    its artifacts dir."""
    roots: list[tuple[str, ...]] = [("tensorboard",)]
    roots += [("tensorboard", f"worker-{i}") for i in range(workers) if workers > 1]
    found = set()
    for root in roots:
        parts = (*root, *PROFILE_DIRS)
        for name in _names_in(str(jp.artifacts), parts):
            found.add("/".join((*parts, name)))
    return found


def _names_in(base: str, parts: tuple[str, ...]) -> list[str]:
    """The names in base/parts, opened a component at a time following no link ([] if it is
    not there)."""
    try:
        fd = _open_dir(base)
    except OSError:
        return []
    try:
        for part in parts:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.listdir(fd)
    except OSError:
        return []
    finally:
        os.close(fd)


def _open_dir(path: str, dir_fd: int | None = None) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)


def _sampled_profile(
    rt: AgentContext, job: JobRecord, jp: JobPaths, found: list[_Process], seconds: float
) -> JobProfile:
    """py-spy's samples of each of the job's processes, as flame graphs in its artifacts."""
    try:
        tool = pyspy.find()
    except pyspy.NoPySpy as e:
        raise ApiError(409, ErrorCode.unsupported, str(e)) from None
    sampled = found[:MAX_SAMPLED]
    whole = max(1, math.ceil(seconds))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    temps = [str(rt.paths.tmp / f"profile-{uuid.uuid4().hex}.svg") for _ in sampled]
    try:
        errors = pyspy.record(
            tool, [(p.pid, t) for p, t in zip(sampled, temps, strict=True)], whole
        )
        files, profiled = [], []
        for process, temp, error in zip(sampled, temps, errors, strict=True):
            if error == "not a Python process":
                continue
            if error is None:
                name = f"{stamp}-pid{process.pid}.svg"
                try:
                    _place(temp, str(jp.artifacts), name)
                    files.append(f"profiles/{name}")
                except OSError as e:
                    error = f"could not write it among the job's artifacts: {e.strerror}"
            profiled.append(
                ProcessProfile(
                    pid=process.pid,
                    worker=process.worker,
                    command=process.command,
                    profiler="py-spy",
                    error=error,
                )
            )
    finally:
        for temp in temps:
            try:  # noqa: SIM105 - a file py-spy never wrote
                os.unlink(temp)
            except FileNotFoundError:
                pass
    if not files:
        raise _no_profile(
            f"job {job.id} gave no profile", profiled, "none of its processes runs Python"
        )
    return JobProfile(
        job=job.id, profiler="py-spy", seconds=float(whole), files=files, processes=profiled
    )


def _place(temp: str, artifacts: str, name: str) -> None:
    """Copy the agent's file `temp` to artifacts/profiles/`name`, following no link, made
    the artifacts dir's owner's (a team job's user's, when the agent is root)."""
    base = _open_dir(artifacts)
    try:
        owner = os.fstat(base)
        try:
            os.mkdir("profiles", 0o755, dir_fd=base)
            if os.geteuid() == 0:
                os.chown("profiles", owner.st_uid, owner.st_gid, dir_fd=base, follow_symlinks=False)
        except FileExistsError:
            pass
        profiles = _open_dir("profiles", dir_fd=base)
    finally:
        os.close(base)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        out = os.open(name, flags, 0o644, dir_fd=profiles)
    finally:
        os.close(profiles)
    try:
        if os.geteuid() == 0:
            os.fchown(out, owner.st_uid, owner.st_gid)
        with open(temp, "rb") as f:
            while chunk := f.read(1 << 20):
                os.write(out, chunk)
    finally:
        os.close(out)
