"""Runs in the agent: TensorBoard server jobs (`gpuhop tensorboard JOB`).

A job writes TensorBoard event files under `$GPUHOP_TENSORBOARD_DIR` (the `tensorboard/` dir
of its artifacts), or, run unmodified as tutorials are, anywhere in its work dir
(`TensorBoard(log_dir="logs/fit/" + stamp)`). A TensorBoard server for it is an ordinary
job (ps, logs and cancel apply; it holds no GPU) running TensorBoard over both, read live
while the job writes: its runs are named by their paths in either (`train`,
`logs/fit/20240101-120000/train`), as `tensorboard --logdir .` run in the work dir would.
It runs in a private network namespace and listens on `PORT` there: no other host and no
other user of this host can reach it. Clients forward that port through the agent
(`services.ports`, `proxy.bridge`) with their own credentials: TensorBoard has no proxy
of its own. What marks a TensorBoard job is its spec file, `tensorboard.json` in its job
dir, naming the job it serves.

Only a caller who may see the job (its owner, or an admin) may start one. The server
belongs to the job's owner, so both find it, and a second request for the same job gets
the running server back rather than a second one.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.services import jobs, outputs, workdir
from gpuhop.api import ErrorCode, JobState, TensorBoardInfo
from gpuhop.api.spec import JobSpec
from gpuhop.backends import jobdeps, procs
from gpuhop.home import JobPaths

SPEC_FILE = "tensorboard.json"
SCRIPT = "gpuhop_tensorboard.py"
# The job's program (gpuhop.runtime.tbserver), copied as a file: the agent does not import it.
SCRIPT_SOURCE = Path(__file__).resolve().parents[2] / "runtime" / "tbserver.py"
# Inside the server's own network namespace nothing else listens: the port is always free.
PORT = 6006
ACTIVE = [JobState.queued, JobState.starting, JobState.running]
PROBE = "import importlib.util, sys; sys.exit(importlib.util.find_spec('tensorboard') is None)"
HOW_TO_LOG = (
    "write them anywhere in the work dir, as tutorials do"
    " (tf.keras.callbacks.TensorBoard(log_dir='logs/fit')), or into $GPUHOP_TENSORBOARD_DIR"
    " with callbacks=gpuhop.tf.callbacks(tensorboard=True)"
)
# The run dirs a listing names at most (`event_dirs`).
MAX_LISTED = 20

# One start at a time, so two requests for the same job cannot both start a server.
_starting = threading.Lock()
# Interpreters found to have TensorBoard (a missing one is asked again: it may be installed).
_has_tensorboard: set[str] = set()


def start(rt: AgentContext, ref: str, caller: Caller) -> TensorBoardInfo:
    if rt.backend.remote:
        raise ApiError(
            400,
            ErrorCode.bad_request,
            "TensorBoard runs on the agent's own host and is reached through gpuhop forward,"
            f" and this agent runs jobs on {rt.backend.where} (--backend {rt.backend.name}):"
            " pull the job's logs (gpuhop pull JOB) and run tensorboard --logdir on them",
        )
    source = jobs.find(rt, ref, caller)
    if _spec(rt, source.id) is not None:
        raise ApiError(
            400,
            ErrorCode.bad_request,
            f"job {source.id} is itself a TensorBoard server; name the job whose logs to show",
        )
    outputs.check_not_pruned(rt, source)
    roots = logdirs(rt, source)
    if source.state.finished and not has_events(roots):
        where = f"its $GPUHOP_TENSORBOARD_DIR ({roots[0]})" + (
            " nor its work dir" if len(roots) > 1 else ""
        )
        raise not_found(
            f"job {source.id} {source.state.value} without writing TensorBoard logs: no event"
            f" files in {where}; {HOW_TO_LOG}"
        )
    owner = source.owner or caller.user
    with _starting:
        server = _server_for(rt, source, owner)
        if server is not None:
            return _info(rt, server, source, reused=True)
        python = _python(rt, source)

        def prepare(jp: JobPaths) -> None:
            jp.work.mkdir(parents=True)
            shutil.copyfile(SCRIPT_SOURCE, jp.work / SCRIPT)
            (jp.root / SPEC_FILE).write_text(json.dumps({"source": source.id}))
            # The server's own view of the host shows it the job's dirs, read-only. A queued
            # job's are made now (as its start would: it keeps them), so there is a dir to show.
            for root in roots:
                root.mkdir(parents=True, exist_ok=True)
            jobdeps.write(jp, {"readonly": [str(root) for root in roots]})

        title = f"job {source.id}" + (f" ({source.spec.name})" if source.spec.name else "")
        command = [python, SCRIPT, *_logdir_args(roots), "--host", "127.0.0.1"]
        command += ["--port", str(PORT), "--window_title", f"TensorBoard: {title}"]
        spec = JobSpec(name=f"tensorboard-{source.id}", private_network=True)
        created = jobs.submit(rt, command, spec, None, Caller(owner, caller.admin), prepare)
    return _info(rt, rt.store.get(created.id), source, reused=False)


def info(rt: AgentContext, ref: str, caller: Caller) -> TensorBoardInfo:
    """The TensorBoard server that runs (or is about to) for the job `ref` names."""
    source = jobs.find(rt, ref, caller)
    server = _server_for(rt, source, source.owner or caller.user)
    if server is None:
        raise not_found(
            f"no TensorBoard server runs for job {source.id}; start one with"
            f" gpuhop tensorboard {source.id}"
        )
    return _info(rt, server, source, reused=True)


def logdirs(rt: AgentContext, job: JobRecord) -> list[Path]:
    """Where `job`'s event files may be: its $GPUHOP_TENSORBOARD_DIR, then its work dir
    (not on a Ray agent, whose jobs run in temp dirs on its nodes)."""
    jp = rt.supervisor.job_paths(job.id)
    return [jp.tensorboard, jp.work] if workdir.on_this_host(rt) else [jp.tensorboard]


def _logdir_args(roots: list[Path]) -> list[str]:
    """TensorBoard's arguments to read `roots`, each run named by its path in its root; the
    profile plugin, which reads one dir only (and none given --logdir_spec), reads the
    first, where `gpuhop profile` writes (the server's own --profile_logdir)."""
    profiles = ["--profile_logdir", str(roots[0])]
    if len(roots) == 1 or any("," in str(root) for root in roots):
        # TensorBoard splits --logdir_spec at commas, and a path in it with none names its
        # runs by their paths below it.
        return ["--logdir", str(roots[0]), *profiles]
    return ["--logdir_spec", ",".join(str(root) for root in roots), *profiles]


def _event_dirs(roots: list[Path]) -> Iterator[str]:
    """Each dir under `roots` holding an event file, by its path in its root (as
    TensorBoard names its run). Links are not followed; `workdir.SKIPPED_DIRS` not entered."""
    for root in roots:
        for dirpath, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in workdir.SKIPPED_DIRS)
            if any(".tfevents." in name for name in names):
                yield Path(dirpath).relative_to(root).as_posix()


def has_events(roots: list[Path]) -> bool:
    """Whether any TensorBoard event file is under `roots` yet."""
    return next(_event_dirs(roots), None) is not None


def event_dirs(rt: AgentContext, ref: str, caller: Caller) -> list[str]:
    """The dirs (TensorBoard's runs) where the job `ref` names has written event files so
    far, MAX_LISTED at most: for the dashboard, which offers TensorBoard where there are."""
    job = jobs.find(rt, ref, caller)
    outputs.check_not_pruned(rt, job)
    return list(itertools.islice(_event_dirs(logdirs(rt, job)), MAX_LISTED))


def _spec(rt: AgentContext, job_id: str) -> dict[str, object] | None:
    try:
        spec = json.loads((rt.supervisor.job_paths(job_id).root / SPEC_FILE).read_text())
    except (OSError, ValueError):
        return None
    return spec if isinstance(spec, dict) else None


def _server_for(rt: AgentContext, source: JobRecord, owner: str) -> JobRecord | None:
    for job in rt.store.list(ACTIVE, owner=owner):
        spec = _spec(rt, job.id)
        if spec is not None and spec.get("source") == source.id and not job.cancel_requested:
            return job
    return None


def _python(rt: AgentContext, source: JobRecord) -> str:
    """An interpreter with TensorBoard (see `candidates`)."""
    deps = jobdeps.read(rt.supervisor.job_paths(source.id))
    return python_with_tensorboard(candidates(rt.supervisor.python, deps))


def candidates(agent_python: str, deps: dict[str, Any]) -> list[str]:
    """The interpreters asked whether they have TensorBoard: the agent's own, else the one
    the job ran with, but not where the job had an identity of its own (a team user's): its
    interpreter may be a venv its user built, whose .pth files would run as the agent (root)
    as it is asked; a team agent's own Python must have TensorBoard then."""
    if deps.get("identity"):
        return [agent_python]
    return [agent_python, jobdeps.python(deps, agent_python)]


def python_with_tensorboard(candidates: list[str]) -> str:
    """The first of `candidates` that can import tensorboard; a 409 naming them if none."""
    candidates = list(dict.fromkeys(candidates))
    for python in candidates:
        if python in _has_tensorboard or _probe(python):
            _has_tensorboard.add(python)
            return python
    raise ApiError(
        409,
        ErrorCode.unsatisfiable,
        f"TensorBoard is not installed on the GPU host (no tensorboard module for"
        f" {' or '.join(candidates)}); install it there with: {candidates[0]} -m pip install"
        " tensorboard",
    )


def _probe(python: str) -> bool:
    try:
        # Bounded: the job's interpreter may be any program its user named (`--python`).
        answer = procs.ask([python, "-c", PROBE])
    except OSError:
        return False
    return answer.code == 0 and answer.stopped is None


def _info(rt: AgentContext, server: JobRecord, source: JobRecord, reused: bool) -> TensorBoardInfo:
    roots = logdirs(rt, source)
    return TensorBoardInfo(
        job=server.id,
        name=server.spec.name,
        state=server.state,
        port=PORT,
        source_job=source.id,
        source_state=source.state,
        logdir=str(roots[0]),
        logdirs=[str(root) for root in roots],
        has_events=has_events(roots),
        reused=reused,
        reason=server.reason,
    )
