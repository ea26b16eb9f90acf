"""Runs in the agent: the exception that services raise to answer a request with a 4xx."""

from __future__ import annotations

from gpuhop.api import ErrorCode


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


def not_found(what: str) -> ApiError:
    return ApiError(404, ErrorCode.not_found, what)
