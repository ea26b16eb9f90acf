"""Runs in the agent: model server jobs (`gpuhop serve`) and the HTTP proxy to them.

A model server is an ordinary job whose command is `python -m gpuhop.serving` (the agent's
Python), so the scheduler, GPUs, logs and cancel all apply. What marks it is a spec file
in its job dir (`serving.json`: model name, source, batching). A SavedModel from a finished
job (its artifacts, or its work dir: see `savedmodels`) never leaves the host: its files
are hard-linked into the new job's work dir (copied across file systems). That is safe
because the serving job runs gpuhop's own server, which only reads them. An uploaded
SavedModel is the job's synced work dir.

The job runs in a private network namespace (`private_network`): its server has no
authentication, so no other job on the host may reach it, and only the agent does, through
the job's relay (`ports`). The server binds its loopback there on a free port and writes it
to `serving-ready.json` in its work dir once it accepts connections. `proxy` sends a
caller's request there: the job is found with the caller (another user's model is a 404,
as for every job route), the body is streamed up with a cap, and the answer streamed back.
The agent's token never reaches the job. Errors are TF Serving's {"error": ...} plus
gpuhop's `ErrorBody` fields, so a TF Serving client and the SDK both read them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.services import jobs, ports
from gpuhop.agent.services.savedmodels import SAVED_MODEL_PB, find_saved_model
from gpuhop.agent.services.upstream import Pool, Streams, UpstreamError, UpstreamTimeout
from gpuhop.api import ErrorCode, JobInfo, JobState, ServeRequest, ServingInfo
from gpuhop.backends import listeners
from gpuhop.home import JobPaths

SPEC_FILE = "serving.json"
READY_FILE = "serving-ready.json"
MODEL_DIR = "model"  # in the work dir, for a SavedModel from another job
# Predict bodies are parsed whole by the server; this caps what the agent passes on.
MAX_BODY = 256 * 1024 * 1024
# A model call on a busy GPU may take long; a server that says nothing for this long is hung.
READ_TIMEOUT = 300.0
# Request headers passed to the server. Nothing else: never Authorization or cookies.
PASSED_HEADERS = ("content-type", "accept")
# Bodies up to this size (both ways) are passed whole, larger ones streamed.
WHOLE = 1024 * 1024
# A model server found for a caller is used again without looking for this long: the
# store and the job's files are read once a second, not for every request. A server that
# ended in the meantime fails the request (502), and the next one looks again.
TARGET_SECONDS = 1.0
MAX_TARGETS = 4096
# Who listens on a model server's port is asked of the kernel (a walk of /proc, some ms on
# a busy host) this often per server, not at every lookup.
VERIFIED_SECONDS = 30.0


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
    model_dir, source, files = ".", f"uploaded directory (tree {(req.tree or '')[:12]})", None
    if req.source_job is not None:
        job = jobs.find(rt, req.source_job, caller)
        files, rel = find_saved_model(rt, job, req.path)
        model_dir, source = MODEL_DIR, f"job {job.id}:{rel}"
    spec = {
        "name": req.name,
        "source": source,
        "max_batch_size": req.max_batch_size,
        "batch_timeout_ms": req.batch_timeout_ms,
    }
    command = [
        rt.supervisor.python,
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
        if files is not None:
            _link_tree(files, jp.work / MODEL_DIR)
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

    return jobs.submit(rt, command, req.spec(), req.tree, caller, prepare=prepare)


def _link_tree(src: Path, dest: Path) -> None:
    """Hard-link every regular file of `src` into `dest` (a copy where linking fails).
    Links are skipped: a job's links are not followed out of its artifacts."""
    for dirpath, _dirs, names in os.walk(src):
        target = dest / Path(dirpath).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            file = Path(dirpath) / name
            if file.is_symlink() or not file.is_file():
                continue
            try:
                os.link(file, target / name)
            except OSError:
                shutil.copy2(file, target / name)


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


def info(rt: AgentContext, ref: str, caller: Caller) -> ServingInfo:
    job = jobs.find(rt, ref, caller)
    spec = _spec(rt, job)
    port = _port(rt, job)
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


# -- the proxy ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where a caller's requests to one model server go."""

    job: str
    name: str
    port: int
    # The job, where its port is in its private network (reached through its relay); None
    # where it is on the host's loopback (a model server started before they had one).
    private: JobRecord | None = None


class Upstream:
    """The agent's connections to model servers (kept and reused, see `upstream`), and
    where each caller's model servers were found lately."""

    def __init__(self) -> None:
        self.pool = Pool()
        self._targets: dict[tuple[str, bool, str], tuple[float, Target]] = {}
        self._verified: dict[tuple[str, int], float] = {}

    def target(self, key: tuple[str, bool, str]) -> Target | None:
        """The model server `key` (caller, ref) found within the last TARGET_SECONDS."""
        found = self._targets.get(key)
        if found is None or time.monotonic() - found[0] > TARGET_SECONDS:
            return None
        return found[1]

    def remember(self, key: tuple[str, bool, str], target: Target) -> None:
        if len(self._targets) >= MAX_TARGETS:
            self._targets.clear()
        self._targets[key] = (time.monotonic(), target)

    def verified(self, job: str, port: int) -> bool:
        """Whether the job's own processes were found listening on `port` lately."""
        when = self._verified.get((job, port))
        return when is not None and time.monotonic() - when <= VERIFIED_SECONDS

    def verify(self, job: str, port: int) -> None:
        if len(self._verified) >= MAX_TARGETS:
            self._verified.clear()
        self._verified[(job, port)] = time.monotonic()

    def forget(self, key: tuple[str, bool, str]) -> None:
        self._targets.pop(key, None)

    async def aclose(self) -> None:
        self.pool.close()


class _TooLarge(Exception):
    pass


def error(status: int, code: ErrorCode, message: str) -> JSONResponse:
    """TF Serving's error body, with gpuhop's `ErrorBody` fields beside it."""
    body = {"error": message, "code": code.value, "message": message, "detail": None}
    return JSONResponse(body, status_code=status)


async def proxy(
    rt: AgentContext, upstream: Upstream, ref: str, path: str, request: Request, caller: Caller
) -> Response:
    key = (caller.user, caller.admin, ref)
    target = upstream.target(key)
    if target is None:
        found = await _find(rt, upstream, ref, caller)
        if isinstance(found, Response):
            return found
        target = found
        upstream.remember(key, target)
    declared = request.headers.get("content-length")
    size = int(declared) if declared is not None and declared.isdigit() else None
    if size is not None and size > MAX_BODY:
        return error(413, ErrorCode.too_large, _too_large_message())
    target_path = "/" + quote(path, safe="/:@")
    if query := request.scope.get("query_string"):  # as sent (request.url rebuilds it all)
        target_path += "?" + query.decode("latin-1")
    headers = {k: v for k in PASSED_HEADERS if (v := request.headers.get(k)) is not None}
    body = None
    if request.method in ("POST", "PUT", "PATCH"):
        try:
            body = await _read_capped(request)
        except _TooLarge:
            return error(413, ErrorCode.too_large, _too_large_message())
    where, opener = "", None
    if target.private is not None:
        # Its port number is its own network's: connections are kept apart by job.
        where, opener = target.job, functools.partial(_relayed, rt, target.private, target.port)
    try:
        answer = await upstream.pool.send(
            target.port, request.method, target_path, headers, body, READ_TIMEOUT, where, opener
        )
        passed = {
            k: v for k in ("content-type", "content-encoding") if (v := answer.headers.get(k))
        }
        length = answer.length
        if length is not None and length <= WHOLE:
            content = await answer.read(READ_TIMEOUT)
            return Response(content, status_code=answer.status, headers=passed)
    except UpstreamTimeout:
        return error(
            504, ErrorCode.internal, f"the model server of job {target.job} did not answer in time"
        )
    except UpstreamError as e:
        upstream.forget(key)  # the job may have ended: look again next time
        return error(
            502,
            ErrorCode.not_listening,
            f"cannot reach the model server of job {target.job} on port {target.port}: {e}",
        )
    return StreamingResponse(
        answer.stream(READ_TIMEOUT),
        status_code=answer.status,
        headers=passed,
        background=BackgroundTask(answer.release),
    )


async def _relayed(rt: AgentContext, job: JobRecord, port: int) -> Streams:
    """A new connection to `port` in the job's private network."""
    try:
        return await ports.connect(rt, job, port)
    except ApiError as e:
        raise UpstreamError(e.message) from None


async def _find(
    rt: AgentContext, upstream: Upstream, ref: str, caller: Caller
) -> Target | Response:
    """The model server `ref` names, if it is ready; else the error answer. Its port is
    the one the job wrote: in its private network, where only its own processes listen;
    on the host's loopback (a model server from before), taken only if the job's own
    processes are what listens there (as for `gpuhop forward`): never another user's model
    server or the agent's."""
    try:
        job = jobs.find(rt, ref, caller)
        spec = _spec(rt, job)
    except ApiError as e:
        return error(e.status, e.code, e.message)
    port = _port(rt, job)
    if port is None:
        if job.state.finished:
            why = f"has {job.state.value}" + (f": {job.reason}" if job.reason else "")
        else:
            why = f"is {job.state.value}; its model is not loaded yet (try again shortly)"
        return error(
            503, ErrorCode.conflict, f"the model server {spec.get('name')} (job {job.id}) {why}"
        )
    name = str(spec.get("name", job.spec.name or job.id))
    if ports.private(job):
        return Target(job.id, name, port, job)
    if not upstream.verified(job.id, port):
        host, why = await asyncio.to_thread(listeners.job_loopback, job.pid or 0, port)
        if host != "127.0.0.1":
            return error(
                502,
                ErrorCode.not_listening,
                f"the model server of job {job.id} does not listen on 127.0.0.1:{port}"
                f" ({why or 'only on ::1'})",
            )
        upstream.verify(job.id, port)
    return Target(job.id, name, port)


async def _read_capped(request: Request) -> bytes:
    """The request's body, whole: the server parses it whole anyway (see MAX_BODY)."""
    chunks, seen = [], 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > MAX_BODY:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large_message() -> str:
    return f"the request body is larger than the agent passes to a model server ({MAX_BODY} bytes)"
