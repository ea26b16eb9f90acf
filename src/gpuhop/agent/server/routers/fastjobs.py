"""Runs in the agent: `ps` (GET /v1/jobs) and `logs` (GET /v1/jobs/{ref}/log) answered before
FastAPI's routing.

Under load (hundreds of queued jobs, dozens of `logs -f` streams) FastAPI's own path cost the
agent more than the listing itself: its middleware stack and routing, the query's
validation, the hop of a sync route to a worker thread, and for a stream a task group and
three wrappers around every chunk's `send` (bench: load, with py-spy on the agent). `FastJobs`
answers these two routes as soon as a request reaches the app, as `routers.serving.Proxy`
does for model servers, and gives the same answer the routes in `routers.jobs` give:

- the caller is the one the listener's auth middleware put in the scope (`caller_of`: none
  there is a bug and fails closed, as in the routes);
- only a query in the exact form the client sends is taken here; anything else (a bad or
  unknown parameter, a repeated one) goes on to the FastAPI route, which validates it and
  answers its 422 as before;
- a request the service refuses (no such job or sweep, a pruned log) or that fails goes on to
  the route too, which does the same read again and answers with the app's error handlers;
- the answer's status, headers and bytes are the route's (tests/integration/test_fastjobs.py
  compares them).

The routes in `routers.jobs` stay for the API's schema and for everything handed on. Both
call the same service functions (`Listing.list_json`, `outputs.log_of`, `outputs.follow_log`)
with the same bounds (`services.listing`'s MAX_LIMIT...): only the query's parsing and the
ASGI framing are this module's own. Exit plan: this fast path goes once FastAPI's route
answers `bench/` load's `ps` and `logs -f` mixes within a few per cent of it (measure with
the middleware taken out of `server.app`); tests/integration/test_fastjobs.py pins the two
byte for byte until then.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from urllib.parse import parse_qsl

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuhop.agent.callers import caller_of
from gpuhop.agent.services import outputs
from gpuhop.agent.services.listing import (
    DEFAULT_LIMIT,
    MAX_FIELDS,
    MAX_LIMIT,
    MAX_SWEEP,
    Fields,
    Listing,
    parse_fields,
)
from gpuhop.api import JobState

LIST = "/v1/jobs"
LOG = re.compile(r"/v1/jobs/(?P<ref>[^/]+)/log")
_FIELDS: dict[str, frozenset[str]] = {}
# Listings up to this long are made on the event loop: a `ps` (50 jobs) of kept answers
# costs less than a hop to a worker thread and back.
INLINE_LIMIT = DEFAULT_LIMIT
_STATES = {s.value: s for s in JobState}
# A non-negative integer as the client writes one (no sign, no spaces, no leading zeros).
_NUMBER = re.compile(r"0|[1-9][0-9]{0,17}")
_BOOLS = {"true": True, "True": True, "1": True, "false": False, "False": False, "0": False}
_JSON = b"application/json"
_STREAM = b"application/octet-stream"


class Refer(Exception):
    """The request is the FastAPI route's to answer (a query not in the client's form)."""


class FastJobs:
    """ASGI middleware: GET /v1/jobs and GET /v1/jobs/{ref}/log, answered here."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            path = scope["path"]
            if path == LIST:
                answered = await self._list(scope, send)
            elif path.endswith("/log") and (match := LOG.fullmatch(path)) is not None:
                answered = await self._log(match["ref"], scope, receive, send)
            else:
                answered = False
            if answered:
                return
        await self.app(scope, receive, send)

    async def _list(self, scope: Scope, send: Send) -> bool:
        """Answer `ps`; False where the route is to answer instead."""
        caller = caller_of(HTTPConnection(scope))
        app = scope["app"]
        try:
            states, limit, sweep, fields = list_query(scope["query_string"])
            listing: Listing = app.state.listing
            args = (app.state.ctx, caller, states, limit, sweep, fields)
            if limit <= INLINE_LIMIT:
                body = listing.list_json(*args)
            else:  # a long listing reads many jobs' dirs: not on the event loop
                body = await asyncio.to_thread(listing.list_json, *args)
        except Exception:
            return False
        headers = [(b"content-length", str(len(body)).encode()), (b"content-type", _JSON)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return True

    async def _log(self, ref: str, scope: Scope, receive: Receive, send: Send) -> bool:
        """Send a job's log, following it with `follow`; False where the route is to."""
        caller = caller_of(HTTPConnection(scope))
        app = scope["app"]
        try:
            offset, follow, worker = log_query(scope["query_string"])
            job, path = outputs.log_of(app.state.ctx, ref, caller, worker)
        except Exception:
            return False
        chunks = outputs.follow_log(app.state.log_watch, job.id, path, offset, follow)
        headers = [(b"x-gpuhop-job", job.id.encode("latin-1")), (b"content-type", _STREAM)]
        await stream(chunks, headers, receive, send)
        return True


def list_query(query: bytes) -> tuple[list[JobState] | None, int, str | None, Fields]:
    """`state` (repeated), `limit`, `sweep` and `fields` of GET /v1/jobs, in the client's
    form."""
    states: list[JobState] = []
    limit = sweep = fields = None
    for key, value in _pairs(query):
        if key == "state" and value in _STATES:
            states.append(_STATES[value])
        elif key == "limit" and limit is None and _NUMBER.fullmatch(value):
            limit = int(value)
            if not 1 <= limit <= MAX_LIMIT:
                raise Refer(key)
        elif key == "sweep" and sweep is None and len(value) <= MAX_SWEEP:
            sweep = value
        elif key == "fields" and fields is None and len(value) <= MAX_FIELDS:
            fields = _fields(value)
        else:
            raise Refer(key)
    return states or None, DEFAULT_LIMIT if limit is None else limit, sweep, fields


def _fields(text: str) -> frozenset[str]:
    # The same few sets each time (`ps`'s columns): parsed once each.
    found = _FIELDS.get(text)
    if found is None:
        try:
            found = parse_fields(text)
        except ValueError:
            raise Refer(text) from None  # the route answers it, naming the field
        if len(_FIELDS) < 64:
            _FIELDS[text] = found
    return found


def log_query(query: bytes) -> tuple[int, bool, int | None]:
    """`offset`, `follow` and `worker` of GET /v1/jobs/{ref}/log, in the client's form."""
    got: dict[str, str] = {}
    for key, value in _pairs(query):
        if key in got or key not in ("offset", "follow", "worker"):
            raise Refer(key)
        got[key] = value
    offset, follow, worker = got.get("offset", "0"), got.get("follow", "false"), got.get("worker")
    if not _NUMBER.fullmatch(offset) or follow not in _BOOLS or int(offset) > outputs.MAX_OFFSET:
        raise Refer(offset, follow)
    if worker is not None and not _NUMBER.fullmatch(worker):
        raise Refer(worker)
    return int(offset), _BOOLS[follow], None if worker is None else int(worker)


def _pairs(query: bytes) -> list[tuple[str, str]]:
    # As Starlette reads a query (its QueryParams), so the values are the route's.
    return parse_qsl(query.decode("latin-1"), keep_blank_values=True)


async def stream(
    chunks: AsyncIterator[bytes], headers: list[tuple[bytes, bytes]], receive: Receive, send: Send
) -> None:
    """What Starlette's StreamingResponse does for an ASGI server of spec 2.3 (uvicorn's):
    send the chunks, and stop once the client has gone."""

    async def body() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def gone() -> None:
        message: Message = await receive()
        while message["type"] != "http.disconnect":
            message = await receive()

    sending, listening = asyncio.ensure_future(body()), asyncio.ensure_future(gone())
    try:
        await asyncio.wait((sending, listening), return_when=asyncio.FIRST_COMPLETED)
    finally:
        sending.cancel()
        listening.cancel()
        await asyncio.gather(sending, listening, return_exceptions=True)
        # The generator's own `finally` (its watch, its file) runs now, not when collected.
        await chunks.aclose()  # type: ignore[attr-defined]
    if not sending.cancelled() and sending.exception() is not None:
        raise sending.exception()  # type: ignore[misc]
