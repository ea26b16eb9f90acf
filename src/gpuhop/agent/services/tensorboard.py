"""Runs in the agent: TensorBoard server jobs (`gpuhop tensorboard JOB`).

A job writes TensorBoard event files under `$GPUHOP_TENSORBOARD_DIR`, the `tensorboard/`
dir of its artifacts. A TensorBoard server for it is an ordinary job (ps, logs and cancel
apply; it holds no GPU) running TensorBoard over that dir, read live while the job writes.
It runs in a private network namespace and listens on `PORT` there: no other host and no
other user of this host can reach it. Clients forward that port through the agent
(`services.ports`) with their own credentials. What marks a TensorBoard job is its spec
file, `tensorboard.json` in its job dir, naming the job it serves.

Only a caller who may see the job (its owner, or an admin) may start one. The server
belongs to the job's owner, so both find it, and a second request for the same job gets
the running server back rather than a second one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.services import jobs, outputs
from gpuhop.api import ErrorCode, JobState, TensorBoardInfo
from gpuhop.api.spec import JobSpec
from gpuhop.backends import jobdeps
from gpuhop.home import JobPaths

SPEC_FILE = "tensorboard.json"
LAUNCHER = "gpuhop_tensorboard.py"
# The job's program (gpuhop.runtime.tbserver), copied as a file: the agent does not import it.
LAUNCHER_SOURCE = Path(__file__).resolve().parents[2] / "runtime" / "tbserver.py"
# Inside the server's own network namespace nothing else listens: the port is always free.
PORT = 6006
ACTIVE = [JobState.queued, JobState.starting, JobState.running]
PROBE = "import importlib.util, sys; sys.exit(importlib.util.find_spec('tensorboard') is None)"
HOW_TO_LOG = (
    "log there with callbacks=gpuhop.tf.callbacks(tensorboard=True), or"
    " tf.summary.create_file_writer(str(gpuhop.runtime.tensorboard_dir()))"
)

# One start at a time, so two requests for the same job cannot both start a server.
_starting = threading.Lock()
# Interpreters found to have TensorBoard (a missing one is asked again: it may be installed).
_has_tensorboard: set[str] = set()


def start(rt: AgentContext, ref: str, caller: Caller) -> TensorBoardInfo:
    source = jobs.find(rt, ref, caller)
    if _spec(rt, source.id) is not None:
        raise ApiError(
            400,
            ErrorCode.bad_request,
            f"job {source.id} is itself a TensorBoard server; name the job whose logs to show",
        )
    outputs.check_not_pruned(rt, source)
    logdir = rt.supervisor.job_paths(source.id).tensorboard
    if source.state.finished and not logdir.is_dir():
        raise not_found(
            f"job {source.id} {source.state.value} without writing TensorBoard logs: nothing"
            f" is at its $GPUHOP_TENSORBOARD_DIR ({logdir}); {HOW_TO_LOG}"
        )
    owner = source.owner or caller.user
    with _starting:
        server = _server_for(rt, source, owner)
        if server is not None:
            return _info(rt, server, source, reused=True)
        python = _python(rt, source)

        def prepare(jp: JobPaths) -> None:
            jp.work.mkdir(parents=True)
            shutil.copyfile(LAUNCHER_SOURCE, jp.work / LAUNCHER)
            (jp.root / SPEC_FILE).write_text(json.dumps({"source": source.id}))
            # The server's own view of the host shows it the job's logs, read-only.
            logdir.mkdir(parents=True, exist_ok=True)
            jobdeps.write(jp, {"readonly": [str(logdir)]})

        title = f"job {source.id}" + (f" ({source.spec.name})" if source.spec.name else "")
        command = [python, LAUNCHER, "--logdir", str(logdir), "--host", "127.0.0.1"]
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


def has_events(logdir: Path) -> bool:
    """Whether any TensorBoard event file is under `logdir` yet."""
    for _dirpath, _dirs, names in os.walk(logdir):
        if any(".tfevents." in name for name in names):
            return True
    return False


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
    """An interpreter with TensorBoard: the agent's own, else the one the job ran with."""
    deps = jobdeps.read(rt.supervisor.job_paths(source.id))
    return python_with_tensorboard(
        [rt.supervisor.python, jobdeps.python(deps, rt.supervisor.python)]
    )


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
        done = subprocess.run([python, "-c", PROBE], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _info(rt: AgentContext, server: JobRecord, source: JobRecord, reused: bool) -> TensorBoardInfo:
    logdir = rt.supervisor.job_paths(source.id).tensorboard
    return TensorBoardInfo(
        job=server.id,
        name=server.spec.name,
        state=server.state,
        port=PORT,
        source_job=source.id,
        source_state=source.state,
        logdir=str(logdir),
        has_events=has_events(logdir),
        reused=reused,
        reason=server.reason,
    )
