"""Runs in the serving job: TensorFlow Serving's REST API for one model, as an ASGI app.

    GET  /v1/models/NAME[/versions/1]            model status
    GET  /v1/models/NAME[/versions/1]/metadata   signature_def of every signature
    POST /v1/models/NAME[/versions/1]:predict    row or columnar predict
    GET  /gpuhop/stats                           what the batcher did (not TF Serving's)

The model is version 1 (one SavedModel, no version directories). Errors are TF Serving's
{"error": "..."} with its status codes: 404 for another model name or version, 400 for a
malformed path or request.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuhop.serving.batching import Batcher
from gpuhop.serving.codec import ServingError, Signature, answer, parse_predict

VERSION = "1"
# TF Serving's REST paths (its http_rest_api_handler's regex, without labels).
PATH_RE = re.compile(
    r"/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?"
    r"(?:(?P<metadata>/metadata)|:(?P<verb>\w+))?\Z"
)


def json_response(data: Any, status: int = 200) -> Response:
    # NaN and infinity pass as TF Serving writes them (not strict JSON, like TF Serving).
    return Response(json.dumps(data), status_code=status, media_type="application/json")


def create_app(
    name: str,
    signatures: dict[str, Signature],
    metadata: Callable[[], dict[str, Any]],
    batcher: Batcher,
) -> Starlette:
    async def models(request: Request) -> Response:
        try:
            return await _dispatch(request)
        except ServingError as e:
            return json_response({"error": e.message}, e.status)

    async def _dispatch(request: Request) -> Response:
        m = PATH_RE.match(request.url.path)
        if m is None:
            raise ServingError(400, f"Malformed request: {request.method} {request.url.path}")
        if m["name"] != name or (m["version"] is not None and m["version"] != VERSION):
            wanted = (
                f"Specific({m['name']}, {m['version']})" if m["version"] else f"Latest({m['name']})"
            )
            raise ServingError(404, f"Servable not found for request: {wanted}")
        verb = m["verb"]
        if request.method == "GET" and verb is None:
            return json_response(metadata_body() if m["metadata"] else status_body())
        if request.method == "POST" and verb == "predict":
            predict = parse_predict(await request.body(), signatures)
            outputs = await batcher.predict(predict)
            return json_response(answer(predict, outputs))
        if request.method == "POST" and verb in ("classify", "regress"):
            raise ServingError(
                400, f":{verb} is not supported by gpuhop's model server; use :predict"
            )
        raise ServingError(400, f"Malformed request: {request.method} {request.url.path}")

    def status_body() -> dict[str, Any]:
        return {
            "model_version_status": [
                {
                    "version": VERSION,
                    "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }
            ]
        }

    cached: dict[str, Any] = {}

    def metadata_body() -> dict[str, Any]:
        if not cached:
            cached.update(
                model_spec={"name": name, "signature_name": "", "version": VERSION},
                metadata=metadata(),
            )
        return cached

    async def stats(request: Request) -> Response:
        return JSONResponse(
            {
                "model": name,
                "max_batch_size": batcher.max_batch_size,
                "batch_timeout_ms": batcher.timeout * 1000,
                **batcher.stats.to_json(),
            }
        )

    async def not_found(request: Request, exc: Exception) -> Response:
        return json_response({"error": f"Malformed request: {request.url.path}"}, 400)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await batcher.close()

    return Starlette(
        routes=[
            Route("/v1/models/{rest:path}", models, methods=["GET", "POST"]),
            Route("/gpuhop/stats", stats, methods=["GET"]),
        ],
        exception_handlers={404: not_found},
        lifespan=lifespan,
    )
