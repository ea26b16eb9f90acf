"""Runs in the agent: the gate in front of every `/ui` path (the dashboard's only door).

An ASGI middleware inside the listener's auth middleware, so the transport has already
said who is calling (the Unix socket's owner, or a token's user). For a `/ui` path it:

- lets through only `/ui/login` (which trades a one-time code for a session) and the
  package's own static files (the same for everyone, and holding no data);
- for anything else wants the session cookie, and wants the session to belong to the
  very caller the transport names. The cookie alone is not enough (it must arrive with
  that user's credentials, which the `gpuhop ui` proxy adds), and the credentials alone
  are not enough (anyone on the laptop can reach the proxy, which holds them). Without
  both the answer is 401: an HTML page saying how to log in, or an error body for
  `/ui/api`, and no data;
- refuses a request that changes something (any method but GET and HEAD) unless it
  carries the `X-Gpuhop-UI` header the pages' own scripts send. Another page cannot add
  that header to a cross-origin request without a CORS preflight, which nothing here
  ever approves; and the browser's `Sec-Fetch-Site`, when sent, must say same-origin.
  This holds although every port of 127.0.0.1 is "same-site" to the session cookie;
- puts the session's caller in the scope for the routes (`caller_of`), and adds the
  security headers (CSP without inline script, no framing, no referrer, nosniff, no store)
  to every `/ui` answer.
"""

from __future__ import annotations

import html
import json

from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuhop.agent.callers import SCOPE_KEY
from gpuhop.agent.ui.sessions import UiSessions
from gpuhop.api import ErrorBody, ErrorCode

PREFIX = "/ui"
COOKIE = "gpuhop_ui"
CSRF_HEADER = "x-gpuhop-ui"
COOKIE_SCOPE_KEY = "gpuhop.agent.ui.cookie"
PUBLIC = ("/ui/login",)
STATIC = "/ui/static/"

SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        b" connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self';"
        b" frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
NOT_LOGGED_IN = (
    "This gpuhop dashboard needs a login. Run gpuhop ui on your machine (with --on REMOTE"
    " for a remote GPU host) and open the link it prints; each link works once, for a minute."
)


def is_ui(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class UiGate:
    def __init__(self, app: ASGIApp, sessions: UiSessions):
        self.app = app
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and is_ui(scope["path"]):
            await send({"type": "websocket.close", "code": 1008})  # the dashboard has none
            return
        if scope["type"] != "http" or not is_ui(scope["path"]):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        send = _with_headers(send, static=path.startswith(STATIC))
        if path in PUBLIC or path.startswith(STATIC):
            await self.app(scope, receive, send)
            return
        cookie = cookie_parser(_header(scope, b"cookie") or "").get(COOKIE)
        caller = self.sessions.check(cookie) if cookie else None
        if caller is None or caller != scope.get(SCOPE_KEY):
            await refuse(scope, send, 401, NOT_LOGGED_IN)
            return
        if scope["method"] not in ("GET", "HEAD") and not _same_origin_script(scope):
            await refuse(
                scope,
                send,
                403,
                f"a change needs the dashboard's own {CSRF_HEADER} header (cross-site request?)",
            )
            return
        await self.app({**scope, SCOPE_KEY: caller, COOKIE_SCOPE_KEY: cookie}, receive, send)


def _same_origin_script(scope: Scope) -> bool:
    site = _header(scope, b"sec-fetch-site")
    return _header(scope, CSRF_HEADER.encode()) == "1" and site in (None, "same-origin")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _with_headers(send: Send, static: bool) -> Send:
    extra = [*SECURITY_HEADERS, (b"cache-control", b"no-cache" if static else b"no-store")]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            names = {k.lower() for k, _ in message.get("headers", ())}
            added = [(k, v) for k, v in extra if k not in names]
            message = {**message, "headers": [*message.get("headers", ()), *added]}
        await send(message)

    return sending


def denied_page(message: str, status: int = 401) -> bytes:
    """The page a browser gets instead of the dashboard; `message` is escaped."""
    title = "Log in to the gpuhop dashboard" if status == 401 else "Refused"
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title>"
        '<link rel=stylesheet href="/ui/static/style.css"></head>'
        '<body><main class="denied"><h1>'
        f"{html.escape(title)}</h1><p>{html.escape(message)}</p>"
        "<pre>gpuhop ui            # the local agent\n"
        "gpuhop ui --on lab   # a remote one</pre></main></body></html>"
    ).encode()


async def refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    """401 or 403: an error body for the JSON API, a page for a browser."""
    if scope["path"].startswith(PREFIX + "/api/"):
        code = ErrorCode.unauthorized if status == 401 else ErrorCode.forbidden
        body = json.dumps(ErrorBody(code=code, message=message).model_dump(mode="json")).encode()
        kind = b"application/json"
    else:
        body, kind = denied_page(message, status), b"text/html; charset=utf-8"
    headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
