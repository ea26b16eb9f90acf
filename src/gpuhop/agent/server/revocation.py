"""Runs in the agent: a token's open requests end with it.

`TokenAuth` checks a token when a request arrives. A stream opened before a revocation
(`logs -f`, a forward's WebSocket, a long upload) would otherwise go on until its job
ends, so every request made with a token runs beside a watch: once the request has lasted
`RECHECK_SECONDS`, the token is looked up again at that interval, and when it is gone the
request is ended. A WebSocket is closed (1008, policy violation, saying why); an HTTP
response under way is cut off mid-body, so the client sees the connection drop, tries
again and reads the 401; one not yet begun is answered 401. Looking the token up by id
reads the token store itself, so this holds however the token was revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("gpuhop.agent")

RECHECK_SECONDS = 0.5
CLOSE_REASON = "the token of this connection was revoked"


class _CutOnPurpose(logging.Filter):
    """Drops uvicorn's error line for a response this module cut short on purpose, one line
    per cut (it logs it as the request returns), so the agent's log holds only our own
    words for it; the same line for any other response still gets through."""

    MESSAGE = "ASGI callable returned without completing response"

    def __init__(self) -> None:
        super().__init__()
        self.expected = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if self.expected and record.getMessage().startswith(self.MESSAGE):
            self.expected -= 1
            return False
        return True


_cuts = _CutOnPurpose()
logging.getLogger("uvicorn.error").addFilter(_cuts)


async def run_while_valid(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    still_valid: Callable[[], bool],
    refuse: Callable[[Scope, Receive, Send], Awaitable[None]],
) -> None:
    """Run `app` for one request; end the request soon after `still_valid()` turns False.
    `refuse` answers an HTTP request that had no response yet (the listener's 401)."""
    started = ended = False

    async def sending(message: Message) -> None:
        nonlocal started
        if ended:
            return  # the request was ended for the revocation: nothing more goes out
        if message["type"] in ("http.response.start", "websocket.accept"):
            started = True
        await send(message)

    task = asyncio.ensure_future(app(scope, receive, sending))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=RECHECK_SECONDS)
            if done:
                task.result()  # the app's own outcome, exceptions included
                return
            if not still_valid():
                ended = True
                break
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
            if not task.cancelled() and task.exception() is not None:
                log.debug("a request ended for a revoked token raised", exc_info=task.exception())
    client = scope.get("client")
    log.info(
        "ended a %s request to %s: its token was revoked (client %s)",
        scope["type"],
        scope.get("path"),
        client and client[0],
    )
    with contextlib.suppress(OSError, RuntimeError):
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": CLOSE_REASON})
        elif not started:
            await refuse(scope, receive, send)
        else:
            # An HTTP response under way: returning without finishing it makes the server
            # drop the connection, which a client reads as an incomplete body, never as
            # the end of it.
            _cuts.expected += 1
