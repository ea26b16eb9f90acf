"""Runs in the agent: who is calling, resolved once per request by the listener's middleware.

Each listener wraps the same app in its own ASGI middleware, which puts a `Caller` into the
scope of every HTTP request and WebSocket handshake before any route runs:

- the Unix socket (mode 0600: only the agent's OS user can connect) is the agent's owner,
  an admin, named by the OS login name (`OwnerAuth`);
- the TCP listener takes `Authorization: Bearer <token>` and nothing else (`TokenAuth`);
  without a valid token the answer is 401 and no route, not even /docs, is reached (a
  browser that comes straight to the dashboard's `/ui` gets a page saying how to log in).
  An address that sent too many wrong tokens lately is answered 429 instead, unless it
  sends a valid one, until its hold is over (`guesses.TokenGuesses`).

The dashboard (`/ui`) needs a session cookie on top of this, checked by `gpuhop.agent.ui.gate`.

Routes read the caller with `caller_of(request_or_websocket)` (gpuhop.agent.callers,
which the dashboard's gate shares) and hand it to the services, which show a user only
their own jobs (see `services.jobs.find`). A request made with a token ends soon after the
token is revoked, streams included (see `revocation`).
"""

from __future__ import annotations

import json
import logging
import math

from starlette.types import ASGIApp, Receive, Scope, Send

from gpuhop.agent.callers import SCOPE_KEY, Caller, owner_login
from gpuhop.agent.server.guesses import TokenGuesses
from gpuhop.agent.server.logs import Throttle
from gpuhop.agent.server.revocation import run_while_valid
from gpuhop.agent.tokens import TokenStore
from gpuhop.agent.ui.gate import NOT_LOGGED_IN, denied_page
from gpuhop.api import ErrorBody, ErrorCode

log = logging.getLogger("gpuhop.agent")
REFUSAL_LOG_WINDOW = 5.0


class OwnerAuth:
    """The Unix socket's middleware: every caller is the agent's owner, an admin."""

    def __init__(self, app: ASGIApp, user: str | None = None):
        self.app = app
        self.caller = Caller(user or owner_login(), admin=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, SCOPE_KEY: self.caller}
        await self.app(scope, receive, send)


class TokenAuth:
    """The TCP listener's middleware: a valid bearer token, or 401 and nothing else; 429 for
    an address held back for sending too many wrong tokens (`guesses`; None: never)."""

    def __init__(self, app: ASGIApp, tokens: TokenStore, guesses: TokenGuesses | None = None):
        self.app = app
        self.tokens = tokens
        self.guesses = guesses
        self.refusals = Throttle(window=REFUSAL_LOG_WINDOW)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        client = scope.get("client")
        address = str(client[0]) if client else "?"
        guesses = self.guesses
        record = None
        token = _bearer(scope)
        if token is not None:
            record = self.tokens.check(token)
        if record is None:
            # A held address's requests without a valid token are answered 429, unlogged; a
            # valid token still gets in: the address may be a NAT's or a proxy's, shared by
            # users whom one client's stale token must not lock out.
            left = guesses.held(address) if guesses is not None else None
            if left is not None:
                await _hold(scope, receive, send, left)
                return
            if token is not None and guesses is not None and guesses.wrong(address):
                log.warning(
                    "%d wrong tokens from %s within %gs: its requests without a valid token are"
                    " refused (429) for %gs (auth_fail_limit, auth_fail_window_seconds in"
                    " agent.toml)",
                    guesses.limit,
                    address,
                    guesses.window,
                    guesses.window,
                )
            # One line per address per few seconds: a client sending thousands of requests a
            # second must not fill the disk jobs need (the count of the others follows).
            held = self.refusals.allow(address)
            if held is not None:
                more = f" ({held} more since the last line)" if held else ""
                log.info("refused a request without a valid token from %s%s", address, more)
            await _refuse(scope, receive, send)
            return
        scope = {**scope, SCOPE_KEY: Caller(record.user, record.admin)}
        # Revoking the token ends this request too, however long it streams.
        token_id = record.id
        await run_while_valid(
            self.app, scope, receive, send, lambda: self.tokens.live(token_id), _refuse
        )


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


_REFUSAL = ErrorBody(
    code=ErrorCode.unauthorized,
    message="this listener needs a valid token (Authorization: Bearer ...)",
)


async def _refuse(scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"www-authenticate", b"Bearer")]
    await _answer(scope, receive, send, 401, _REFUSAL, NOT_LOGGED_IN, headers)


async def _hold(scope: Scope, receive: Receive, send: Send, left: float) -> None:
    seconds = math.ceil(left)
    body = ErrorBody(
        code=ErrorCode.too_many,
        message=(
            "too many requests with a wrong token came from this address: the agent refuses"
            f" its requests without a valid token for {seconds}s more"
        ),
    )
    headers = [(b"retry-after", str(seconds).encode())]
    await _answer(scope, receive, send, 429, body, body.message, headers)


async def _answer(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    error: ErrorBody,
    page: str,
    more: list[tuple[bytes, bytes]],
) -> None:
    """`error` (as JSON; a browser on /ui gets `page`), for a request or a WebSocket."""
    body = json.dumps(error.model_dump(mode="json")).encode()
    kind = b"application/json"
    if scope["type"] == "http" and (scope["path"] + "/").startswith("/ui/"):
        body, kind = denied_page(page, status), b"text/html; charset=utf-8"
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", kind),
        (b"content-length", str(len(body)).encode()),
        *more,
    ]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    message = await receive()  # websocket.connect
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})  # the server answers 403
