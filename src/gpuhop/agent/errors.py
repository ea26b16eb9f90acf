"""Runs in the agent: the exception that services raise to answer a request with a 4xx."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi.responses import JSONResponse

from gpuhop.api import ErrorBody, ErrorCode


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: ErrorCode,
        message: str,
        detail: dict[str, object] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail


def describe_errors(errors: Sequence[Any]) -> str:
    """pydantic's validation errors in one line a person can act on."""
    parts = []
    for err in errors[:5]:
        if err.get("type") == "json_invalid":
            reason = (err.get("ctx") or {}).get("error", "cannot be parsed")
            parts.append(f"the request body is not valid JSON ({reason})")
            continue
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    more = len(errors) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def not_found(what: str) -> ApiError:
    return ApiError(404, ErrorCode.not_found, what)


def error_response(
    status: int, code: ErrorCode, message: str, detail: dict[str, object] | None = None
) -> JSONResponse:
    """The answer every refused request gets: an `ErrorBody` as JSON."""
    body = ErrorBody(code=code, message=message, detail=detail)
    return JSONResponse(status_code=status, content=body.model_dump(mode="json"))
