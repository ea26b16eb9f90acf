"""Runs in the agent: model server jobs (`gpuhop serve`): starting one, what the agent
knows of it, and which server a request for one goes to.

A model server is an ordinary job whose command is `python -m gpuhop.serving` (the agent's
Python), so the scheduler, GPUs, logs and cancel all apply. In a container image (`serve
--image`, or agent.toml's default `image`, as for every job) it is `-m gpuhop.serving`: the
image's own `python3` runs it, with gpuhop's package mounted read-only in the container as
for every image job (gpuhop.backends.local.podman) and the image's own TensorFlow, starlette
and uvicorn; never the agent's venv. A server whose Python lacks one of those says which
and exits at once (gpuhop.serving.needs), and its failure reason says what to install.
What marks it is a spec file in its job dir (`serving.json`: model name, source,
batching). A SavedModel from a finished job (its artifacts, its work dir or its /tmp: see
`savedmodels`) never leaves the host, nor is it copied or linked: the server sees its dir
mounted read-only at `model` in its work dir (a read-only mount of the job's deps,
`jobdeps.mounts`: the sandbox binds it for a venv server, Podman for one in an image). A
job is hostile, a model server too: it must not write into another job's kept files. While
a queued or running server mounts it, retention keeps the job's files (gc); a server asked
for while gc prunes its job is refused (its SavedModel is looked for again holding
`AgentContext.uses`, which gc's pruning waits for: gpuhop.agent.storage.uses). On a host
that gives no job a view of its own (`gpuhop doctor`; never a team agent's), a venv server
reads the model in place: every job there may write every file of the agent's user anyway.
An uploaded SavedModel is the job's synced work dir.

The job runs in a private network namespace (`private_network`): its server has no
authentication, so no other job on the host may reach it, and only the agent does, through
the job's relay. The server binds its loopback there on a free port and writes it to
`serving-ready.json` in its work dir once it accepts connections. `proxy` finds the job
with the caller (another user's model is a 404, as for every job route) and hands the
request to the proxy (`gpuhop.agent.proxy.modelserver`), which passes it there.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.proxy import jobports, modelserver
from gpuhop.agent.proxy.modelserver import ModelProxy, Target, error
from gpuhop.agent.services import jobs
from gpuhop.agent.services.savedmodels import SAVED_MODEL_PB, find_saved_model
from gpuhop.api import ErrorCode, JobInfo, JobState, ServeRequest, ServingInfo
from gpuhop.backends import jobdeps, listeners
from gpuhop.home import JobPaths

SPEC_FILE = "serving.json"
READY_FILE = "serving-ready.json"
MODEL_DIR = "model"  # in the work dir, for a SavedModel from another job


# -- starting a model server ---------------------------------------------------------------


def start(rt: AgentContext, req: ServeRequest, caller: Caller) -> JobInfo:
    if rt.backend.remote:
        raise ApiError(
            400,
            ErrorCode.bad_request,
            "model servers run on the agent's own host, and this agent runs jobs on"
            f" {rt.backend.where} (--backend {rt.backend.name}); serve from an agent with the"
            " local backend",
        )
    job_spec = jobs.with_default_image(rt, req.spec())
    model_dir, source, mounts = ".", f"uploaded directory (tree {(req.tree or '')[:12]})", []
    if req.source_job is not None:
        job = jobs.find(rt, req.source_job, caller)
        files, rel = find_saved_model(rt, job, req.path)
        source = f"job {job.id}:{rel}"
        if job_spec.image is None and rt.backend.isolation() is not None:
            model_dir = str(files)  # no view of its own to mount it in (the docstring's)
        else:
            model_dir, mounts = MODEL_DIR, [{"source": str(files), "mount": MODEL_DIR}]
    spec = {
        "name": req.name,
        "source": source,
        "max_batch_size": req.max_batch_size,
        "batch_timeout_ms": req.batch_timeout_ms,
    }
    # In an image: the image's python3 (`-m` runs a module with the job's own Python).
    python = [] if job_spec.image is not None else [rt.supervisor.python]
    command = [
        *python,
        "-m",
        "gpuhop.serving",
        "--model",
        model_dir,
        "--name",
        req.name,
        "--max-batch-size",
        str(req.max_batch_size),
        "--batch-timeout-ms",
        f"{req.batch_timeout_ms:g}",
        # In the job's work dir (where it runs): the only part of its job dir, with its
        # outputs, that the job's sandbox lets it write.
        "--ready-file",
        READY_FILE,
    ]

    def prepare(jp: JobPaths) -> None:
        if req.source_job is not None:
            # Again, holding `rt.uses` (jobs.submit): gc may have pruned the job since the
            # look above, and from here until the server's row exists it waits.
            find_saved_model(rt, rt.store.get(job.id), req.path)
        if mounts:
            jobdeps.write(jp, {**jobdeps.read(jp), "mounts": mounts})
        elif req.tree is not None and SAVED_MODEL_PB not in {
            e["path"] for e in rt.trees.entries(req.tree)
        }:
            raise ApiError(
                400,
                ErrorCode.bad_request,
                f"the uploaded directory is not a SavedModel: it has no {SAVED_MODEL_PB} at its"
                " top (give the directory that model.export() or tf.saved_model.save() wrote)",
            )
        (jp.root / SPEC_FILE).write_text(json.dumps(spec))

    return jobs.submit(rt, command, job_spec, req.tree, caller, prepare=prepare)


# -- what the agent knows of one ----------------------------------------------------------


def _spec(rt: AgentContext, job: JobRecord) -> dict[str, Any]:
    try:
        spec = json.loads((rt.supervisor.job_paths(job.id).root / SPEC_FILE).read_text())
    except (OSError, ValueError):
        raise not_found(
            f"job {job.id} is not a model server (start one with gpuhop serve)"
        ) from None
    return spec if isinstance(spec, dict) else {}


def _port(rt: AgentContext, job: JobRecord) -> int | None:
    """The server's port, once it said it is ready; None before, and after the job ended."""
    if job.state != JobState.running:
        return None
    try:
        port = json.loads((rt.supervisor.job_paths(job.id).work / READY_FILE).read_text())["port"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return port if isinstance(port, int) and 0 < port < 65536 else None


def _resolve(
    rt: AgentContext, ref: str, caller: Caller
) -> tuple[JobRecord, dict[str, Any], int | None]:
    """The model server `ref` names, its spec, and its port (None: it does not answer). By
    id, that job; by name, the newest job of that name, or where it does not answer (yet,
    or any more) the newest one before it that does (`_ready_namesake`)."""
    job = jobs.find(rt, ref, caller)
    spec = _spec(rt, job)
    port = _port(rt, job)
    if port is None and job.spec.name == ref and job.id != ref:
        found = _ready_namesake(rt, job)
        if found is not None:
            return found
    return job, spec, port


def info(rt: AgentContext, ref: str, caller: Caller) -> ServingInfo:
    job, spec, port = _resolve(rt, ref, caller)
    return ServingInfo(
        job=job.id,
        name=str(spec.get("name", job.spec.name or job.id)),
        state=job.state,
        ready=port is not None,
        port=port,
        source=str(spec.get("source", "")),
        max_batch_size=int(spec.get("max_batch_size", 1)),
        batch_timeout_ms=float(spec.get("batch_timeout_ms", 0)),
        reason=job.reason,
    )


def _ready_namesake(
    rt: AgentContext, newest: JobRecord
) -> tuple[JobRecord, dict[str, Any], int] | None:
    """The newest model server of `newest`'s name and owner that answers, where `newest`
    (the name's newest job) does not yet (or no longer): a model served again under its
    name is answered by the server before until the new one has loaded it, as TF Serving
    answers with the version it has until the next is ready."""
    for job in rt.store.list(
        [JobState.running], limit=100, owner=newest.owner, name=newest.spec.name
    ):
        if job.id == newest.id or job.owner != newest.owner:
            continue
        port = _port(rt, job)
        if port is None:
            continue
        try:
            return job, _spec(rt, job), port
        except ApiError:  # a job of that name that is no model server
            continue
    return None


# -- the proxy's requests ------------------------------------------------------------------


async def proxy(
    rt: AgentContext, model_proxy: ModelProxy, ref: str, path: str, request: Request, caller: Caller
) -> Response:
    """A caller's request to the model server `ref` names, at `path`, passed on to it
    (`gpuhop.agent.proxy.modelserver`). The server is looked up for each caller at most
    once a second (`modelserver.TARGET_SECONDS`)."""
    key = (caller.user, caller.admin, ref)
    target = model_proxy.target(key)
    if target is None:
        found = await _find(rt, model_proxy, ref, caller)
        if isinstance(found, Response):
            return found
        target = found
        model_proxy.remember(key, target)
    return await modelserver.forward(rt, model_proxy, target, path, request, key)


async def _find(
    rt: AgentContext, model_proxy: ModelProxy, ref: str, caller: Caller
) -> Target | Response:
    """The model server `ref` names, if it is ready; else the error answer. Its port is
    the one the job wrote: in its private network, where only its own processes listen;
    on the host's loopback (a model server from before), taken only if the job's own
    processes are what listens there (as for `gpuhop forward`): never another user's model
    server or the agent's."""
    try:
        job, spec, port = _resolve(rt, ref, caller)
    except ApiError as e:
        return error(e.status, e.code, e.message)
    if port is None:
        if job.state.finished:
            why = job.state.said + (f" ({job.reason})" if job.reason else "")
        else:
            why = f"{job.state.said}; its model is not loaded yet (try again shortly)"
        return error(
            503, ErrorCode.conflict, f"the model server {spec.get('name')} (job {job.id}) {why}"
        )
    name = str(spec.get("name", job.spec.name or job.id))
    if jobports.private(job):
        return Target(job.id, name, port, job)
    if not model_proxy.verified(job.id, port):
        host, why = await asyncio.to_thread(listeners.job_loopback, job.pid or 0, port)
        if host != "127.0.0.1":
            return error(
                502,
                ErrorCode.not_listening,
                f"the model server of job {job.id} does not listen on 127.0.0.1:{port}"
                f" ({why or 'only on ::1'})",
            )
        model_proxy.verify(job.id, port)
    return Target(job.id, name, port)
