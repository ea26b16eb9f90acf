"""Runs in the agent: a cap on request bodies that routes read into memory.

JSON bodies (a job spec, a list of digests to check) are parsed whole, so each is capped
before it is read: a declared Content-Length over the cap is refused at once with 413, and
a body sent without one is counted as it arrives and refused when it passes the cap. The
routes that stream their bodies set their own bounds and are exempt: blob and chunk uploads
go to disk frame by frame, a tree or a dataset manifest has its own, larger cap
(`routers.trees.MAX_TREE_BYTES`), and requests proxied to a model server have theirs
(`proxy.modelserver.MAX_BODY`). The dashboard's routes (`/ui`) take no body worth the name
(a cancel has none), so theirs is capped at `UI_BODY`.
"""

from __future__ import annotations

import json

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuhop.api import ErrorBody, ErrorCode

# A BlobCheck of the largest tree (200,000 digests at 67 bytes each) fits with room to spare.
MAX_JSON_BODY = 16 * 1024 * 1024
STREAMING_ROUTES = frozenset({"/v1/blobs/upload", "/v1/chunks/upload", "/v1/trees"})
# POST /v1/datasets/NAME: a manifest; /v1/serve/...: requests to model servers, which stream
# through with their own cap (`proxy.modelserver.MAX_BODY`).
STREAMING_PREFIXES = ("/v1/datasets/", "/v1/serve/")
UI_BODY = 64 * 1024


class BodyLimit:
    def __init__(self, app: ASGIApp, limit: int = MAX_JSON_BODY):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if not path or path in STREAMING_ROUTES or path.startswith(STREAMING_PREFIXES):
            await self.app(scope, receive, send)
            return
        limit = UI_BODY if path == "/ui" or path.startswith("/ui/") else self.limit
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _too_large(send, limit)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # FastAPI passes an HTTPException raised while reading the body on to the
                    # app's handler, which answers with an ErrorBody.
                    raise HTTPException(413, _message(limit))
            return message

        await self.app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _message(limit: int) -> str:
    return f"the request body is larger than this route takes ({limit} bytes)"


async def _too_large(send: Send, limit: int) -> None:
    body = json.dumps(
        ErrorBody(code=ErrorCode.too_large, message=_message(limit)).model_dump(mode="json")
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
