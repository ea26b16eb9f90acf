"""Runs on the user's machine: the one exception type the SDK raises for a failed request."""

from __future__ import annotations


class GpuhopError(Exception):
    """A request the agent refused, or an agent that could not be reached.

    `code` is the API's error code (see `gpuhop.api.ErrorCode`) or "unreachable"; `status`
    the HTTP status, when there was one.
    """

    def __init__(
        self,
        message: str,
        code: str = "error",
        status: int | None = None,
        detail: dict | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.detail = detail or {}
