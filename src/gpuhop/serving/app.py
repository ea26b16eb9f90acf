"""Runs in the serving job: TensorFlow Serving's REST API for one model, as an ASGI app.

    GET  /v1/models/NAME[/versions/1]            model status
    GET  /v1/models/NAME[/versions/1]/metadata   signature_def of every signature
    POST /v1/models/NAME[/versions/1]:predict    row or columnar predict
    GET  /gpuhop/stats                           what the batcher did (not TF Serving's)

The model is version 1 (one SavedModel, no version directories, no labels). Paths are
read as TF Serving's `http_rest_api_util.cc` reads them, and refused in its words and with
its status codes (`http_rest_api_handler_test.cc` names the cases): 400 "Malformed
request: METHOD PATH" for a path it does not take, 404 for another model or version
("Servable not found for request: Latest(NAME)"; a status request: "Could not find any
versions of model NAME"). A failure of the server's own is a 500 {"error"}, logged.
"""

from __future__ import annotations

import asyncio
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
from gpuhop.serving.codec import Signature, answer, parse_predict
from gpuhop.serving.errors import ServingError, internal

VERSION = 1
# TF Serving's two path patterns (case-insensitive, as its own).
PREDICT_RE = re.compile(
    r"/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r":(?P<verb>classify|regress|predict)",
    re.IGNORECASE,
)
STATUS_RE = re.compile(
    r"/v1/models(?:/(?P<name>[^/:]+))?(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r"(?:/(?P<metadata>metadata))?",
    re.IGNORECASE,
)
INT64_MAX = 2**63 - 1
# A predict body longer than INLINE_BYTES is parsed in a thread, and an answer of more than
# INLINE_VALUES values written in one, so that the event loop goes on answering the other
# requests meanwhile (a 500,000-row body takes seconds). Smaller ones are done on the loop,
# where they take 3 ms at most on a busy 2-core box (4 KiB of one-number rows; 1,024
# values: 0.5 ms), and where a one-row request is not handed to a thread and back (100 to
# 200 us there, more than its parse). json's parser holds the GIL: a big body's JSON text
# still stops the loop while it is read (0.7 s for 20,000 rows of 64 numbers, about a
# third of their parse); the rows it holds do not.
INLINE_BYTES = 4 * 1024
INLINE_VALUES = 1024
# Any method reaches the handler, which refuses all but GET and POST as TF Serving does.
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


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
        except Exception as e:
            error = internal(e, f"answering {request.method} {request.url.path}")
            return json_response({"error": error.message}, error.status)

    async def _dispatch(request: Request) -> Response:
        method, path = request.method, request.url.path
        malformed = ServingError(400, f"Malformed request: {method} {path}")
        pattern = PREDICT_RE if method == "POST" else STATUS_RE if method == "GET" else None
        m = pattern.fullmatch(path) if pattern is not None else None
        if m is None:
            raise malformed
        version = m["version"]
        if version is not None and int(version) > INT64_MAX:
            raise ServingError(400, f"Failed to convert version: {version} to numeric.")
        if method == "GET" and not m["name"]:
            raise ServingError(400, "Missing model name in request.")
        if method == "GET" and not m["metadata"]:
            return json_response(status_body(m["name"], version))
        servable = servable_error(m["name"], version, m["label"])
        if method == "GET":
            if servable is not None:
                raise servable
            return json_response(metadata_body())
        if m["verb"] != "predict":
            if servable is not None:
                raise servable
            raise ServingError(
                400, f":{m['verb']} is not supported by gpuhop's model server; use :predict"
            )
        body = await request.body()
        if len(body) <= INLINE_BYTES:
            predict = parse_predict(body, signatures, servable)
        else:
            predict = await asyncio.to_thread(parse_predict, body, signatures, servable)
        outputs = await batcher.predict(predict)
        if sum(o.size for o in outputs.values()) <= INLINE_VALUES:
            text = answer(predict, outputs)
        else:
            text = await asyncio.to_thread(answer, predict, outputs)
        return Response(text, media_type="application/json")

    def servable_error(model: str, version: str | None, label: str | None) -> ServingError | None:
        """What TF Serving answers when it looks up the model a request names."""
        if label is not None:  # no labels here (TF Serving: an unknown label)
            return ServingError(400, f"Unrecognized servable version label: {label}")
        if model == name and (version is None or int(version) == VERSION):
            return None
        wanted = f"Specific({model}, {int(version)})" if version else f"Latest({model})"
        return ServingError(404, f"Servable not found for request: {wanted}")

    def status_body(model: str, version: str | None) -> dict[str, Any]:
        # TF Serving's GetModelStatus: a label is not looked at, a version is.
        if version is not None and (model != name or int(version) != VERSION):
            raise ServingError(404, f"Could not find version {int(version)} of model {model}")
        if model != name:
            raise ServingError(404, f"Could not find any versions of model {model}")
        return {
            "model_version_status": [
                {
                    "version": str(VERSION),
                    "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }
            ]
        }

    cached: dict[str, Any] = {}

    def metadata_body() -> dict[str, Any]:
        if not cached:
            cached.update(
                model_spec={"name": name, "signature_name": "", "version": str(VERSION)},
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
        return json_response(
            {"error": f"Malformed request: {request.method} {request.url.path}"}, 400
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await batcher.close()

    return Starlette(
        routes=[
            Route("/v1/{rest:path}", models, methods=list(METHODS)),
            Route("/gpuhop/stats", stats, methods=["GET"]),
        ],
        exception_handlers={404: not_found},
        lifespan=lifespan,
    )
