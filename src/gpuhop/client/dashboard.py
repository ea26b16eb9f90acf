"""Runs on the user's machine: `gpuhop ui`'s proxy, the agent's dashboard on 127.0.0.1.

A tiny Starlette app on uvicorn, in a thread of its own, that forwards `/ui/...` and
nothing else to the agent through the client's own endpoint (the local Unix socket, the
SSH tunnel's socket, or TLS with the pinned certificate and the bearer token): the
dashboard needs no port on the GPU host. The proxy holds the user's credentials, so it
does not stand in for a login: the agent still wants its session cookie on every request
(see `gpuhop.agent.ui.gate`), which a browser gets only by opening `login_url()` once.

What it adds to that:
- it answers only to Host 127.0.0.1:PORT or localhost:PORT (a page on another name that
  resolves here, DNS rebinding, is refused), and refuses a change (POST) whose Origin is
  another one;
- it refuses a path with `.` or `..` segments, so nothing leads out of `/ui` to the API;
- it passes on only the headers the dashboard needs. Cookies are not kept apart by port,
  so it renames the agent's session cookie after its own port (`gpuhop_ui_PORT`) and
  sends the agent that cookie alone: two `gpuhop ui` for two agents never log each other
  out, and never hand one agent's session to the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
import socket
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request, cookie_parser
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

import gpuhop.api.routing  # noqa: F401 (registers {path:anypath}, which the proxy's route takes)
from gpuhop.client.errors import GpuhopError
from gpuhop.client.session import Session
from gpuhop.client.tokens import login_code
from gpuhop.client.transport.base import Endpoint
from gpuhop.client.transport.httpxmodule import httpx_module

if TYPE_CHECKING:
    import httpx
else:
    httpx = httpx_module()  # without its CLI

AGENT_COOKIE = "gpuhop_ui"
MAX_BODY = 64 * 1024
START_TIMEOUT = 10.0
REQUEST_HEADERS = frozenset(
    {"accept", "content-type", "range", "if-range", "x-gpuhop-ui", "sec-fetch-site"}
)
# Hop-by-hop, or set by this server itself.
DROPPED_RESPONSE_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "date", "server"}
)


class Dashboard:
    """The dashboard of `session`'s agent at http://127.0.0.1:`port`/ui/ (0: any free
    port), until `close()`. Open `login_url()` in a browser to log in."""

    def __init__(self, session: Session, port: int = 0):
        self.session = session
        self.endpoint: Endpoint = session.endpoint
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("127.0.0.1", port))
        except OSError as e:
            listener.close()
            raise GpuhopError(
                f"cannot listen on 127.0.0.1:{port} ({e.strerror}); pick another --port, or 0",
                code="bad_request",
            ) from None
        listener.listen(64)
        self.port: int = listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/ui/"
        self._origins = {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}
        self._cookie = f"{AGENT_COOKIE}_{self.port}"
        self._http: httpx.AsyncClient | None = None
        app = Starlette(
            routes=[Route("/{path:anypath}", self._forward, methods=["GET", "HEAD", "POST"])],
            lifespan=self._lifespan,
        )
        import uvicorn

        config = uvicorn.Config(
            app, log_level="warning", access_log=False, timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [listener]}, name="ui-proxy", daemon=True
        )
        self._listener = listener
        self._thread.start()
        self._wait_started()

    def _wait_started(self) -> None:
        self._thread.join(0.01)
        waited = 0.0
        while not self._server.started:
            if not self._thread.is_alive() or waited > START_TIMEOUT:
                self.close()
                raise GpuhopError("the dashboard's local proxy did not start", code="internal")
            self._thread.join(0.02)
            waited += 0.02

    def login_url(self) -> str:
        """A link that logs a browser in once, within a minute (a new code each call)."""
        code = login_code(self.session)
        return f"{self.url}login?code={code.code}"

    def wait(self, timeout: float | None = None) -> None:
        """Block until the proxy stops (`close()` from another thread)."""
        self._thread.join(timeout)

    def close(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(10)
        self._listener.close()

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- in the proxy's event loop ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._http = httpx.AsyncClient(
            transport=self.endpoint.async_transport(),
            base_url=self.endpoint.base_url,
            headers=self.endpoint.headers,
            # Keeps no cookie: one kept from a login would log in every later visitor.
            cookies=http.cookiejar.CookieJar(
                http.cookiejar.DefaultCookiePolicy(allowed_domains=[])
            ),
            timeout=httpx.Timeout(60.0, connect=5.0),
        )
        try:
            yield
        finally:
            await self._http.aclose()

    async def _forward(self, request: Request) -> Response:
        refusal = self._refusal(request)
        if refusal is not None:
            return PlainTextResponse(refusal[1], refusal[0])
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return PlainTextResponse("request body too large", 413)
        headers = [(k, v) for k, v in request.headers.items() if k in REQUEST_HEADERS]
        session = cookie_parser(request.headers.get("cookie", "")).get(self._cookie)
        if session:
            headers.append(("cookie", f"{AGENT_COOKIE}={session}"))
        raw_path = request.scope["raw_path"] or request.scope["path"].encode()
        query = request.scope.get("query_string", b"")
        assert self._http is not None
        url = self._http.base_url.copy_with(raw_path=raw_path + (b"?" + query if query else b""))
        try:
            upstream = await self._send(
                self._http.build_request(request.method, url, headers=headers, content=body)
            )
        except httpx.TransportError as e:
            # explain() may run ssh (is the host up, its agent?): not on the event loop.
            explained = await asyncio.to_thread(self.endpoint.explain, e)
            why = explained or f"cannot reach {self.endpoint.description}: {e}"
            return PlainTextResponse(f"gpuhop ui: {why}", 502)
        response = StreamingResponse(
            upstream.aiter_raw(),
            status_code=upstream.status_code,
            background=BackgroundTask(upstream.aclose),
        )
        response.raw_headers = self._response_headers(upstream.headers.raw)
        return response

    async def _send(self, out: httpx.Request) -> httpx.Response:
        assert self._http is not None
        try:
            return await self._http.send(out, stream=True)
        except httpx.ConnectError:
            # Nothing was sent. The SSH transport's tunnel may have dropped (a network
            # blip): reachable() opens it again, as for the SDK's requests (unixhttp).
            if not await asyncio.to_thread(self.endpoint.reachable):
                raise
            return await self._http.send(out, stream=True)

    def _refusal(self, request: Request) -> tuple[int, str] | None:
        """Why this request is not forwarded (status, message); None to forward it."""
        if request.headers.get("host", "") not in self._origins:
            return 403, f"gpuhop ui answers only at {self.url}"
        path = request.scope["path"]
        if not (path == "/ui" or path.startswith("/ui/")):
            return 404, f"gpuhop ui forwards only the dashboard: open {self.url}"
        if {".", ".."} & set(path.split("/")) or "\\" in path:
            return 400, "a dashboard path has no '.' or '..' parts"
        origin = request.headers.get("origin")
        if (
            request.method == "POST"
            and origin
            and origin.removeprefix("http://") not in self._origins
        ):
            return 403, "a change to the dashboard must come from its own page"
        return None

    def _response_headers(self, raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        out = []
        agent_cookie = AGENT_COOKIE.encode() + b"="
        for name, value in raw:
            key = name.lower()
            if key in {h.encode() for h in DROPPED_RESPONSE_HEADERS}:
                continue
            if key == b"set-cookie":
                if not value.startswith(agent_cookie):
                    continue
                value = self._cookie.encode() + b"=" + value[len(agent_cookie) :]
            out.append((key, value))
        return out
