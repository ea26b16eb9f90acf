"""Runs in the agent: the HTTP proxy to model server jobs (`gpuhop serve`): a caller's
request passed to the job's server, and its answer back.

The server has no authentication, so it runs in its job's private network namespace and
is reached through the job's relay (`jobports`); a model server from before that listens
on the host's loopback. The body is streamed up with a cap, the answer streamed back, and
only a few headers pass: the agent's token never reaches the job. Errors are TF Serving's
{"error": ...} plus gpuhop's `ErrorBody` fields, so a TF Serving client and the SDK both
read them. Which server a request is for, and whether the caller may reach it, is decided
before (`gpuhop.agent.services.serving`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from urllib.parse import quote

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.proxy import jobports
from gpuhop.agent.proxy.upstream import Pool, Streams, UpstreamError, UpstreamTimeout
from gpuhop.api import ErrorCode

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

# Whose request for which model server: (the caller's user, whether an admin, the job ref).
CallerRef = tuple[str, bool, str]


@dataclass(frozen=True)
class Target:
    """Where a caller's requests to one model server go."""

    job: str
    name: str
    port: int
    # The job, where its port is in its private network (reached through its relay); None
    # where it is on the host's loopback (a model server started before they had one).
    private: JobRecord | None = None


class ModelProxy:
    """The agent's connections to model servers (kept and reused, see `upstream`), and
    where each caller's model servers were found lately (by `services.serving`)."""

    def __init__(self) -> None:
        self.pool = Pool()
        self._targets: dict[CallerRef, tuple[float, Target]] = {}
        self._verified: dict[tuple[str, int], float] = {}

    def target(self, key: CallerRef) -> Target | None:
        """The model server `key` (caller, ref) found within the last TARGET_SECONDS."""
        found = self._targets.get(key)
        if found is None or time.monotonic() - found[0] > TARGET_SECONDS:
            return None
        return found[1]

    def remember(self, key: CallerRef, target: Target) -> None:
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

    def forget(self, key: CallerRef) -> None:
        self._targets.pop(key, None)

    async def aclose(self) -> None:
        self.pool.close()


class _TooLarge(Exception):
    pass


def error(status: int, code: ErrorCode, message: str) -> JSONResponse:
    """TF Serving's error body, with gpuhop's `ErrorBody` fields beside it."""
    body = {"error": message, "code": code.value, "message": message, "detail": None}
    return JSONResponse(body, status_code=status)


async def forward(
    rt: AgentContext,
    proxy: ModelProxy,
    target: Target,
    path: str,
    request: Request,
    forget: CallerRef,
) -> Response:
    """Pass `request` to the model server `target` at `path`, and its answer back: the body
    capped (MAX_BODY), only PASSED_HEADERS sent, an answer up to WHOLE read whole and a
    larger one streamed. Where the server cannot be reached, `forget` is the key of `target`
    in `proxy`'s cache, looked up again next time (the job may have ended)."""
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
        answer = await proxy.pool.send(
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
        proxy.forget(forget)  # the job may have ended: look again next time
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
        return await jobports.connect(rt, job, port)
    except ApiError as e:
        raise UpstreamError(e.message) from None


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
