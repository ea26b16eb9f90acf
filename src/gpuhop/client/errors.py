"""Runs on the user's machine: the exception types the SDK raises: `GpuhopError` for a failed
request, `UnknownOption` for a keyword that is no job option, `SyncError` for a work dir
that cannot be synced as it is."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


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


class UnknownOption(GpuhopError, TypeError):
    """A keyword that is no job option (a JobSpec field, or one of `Client.submit`'s names
    for one): a TypeError too, as an unknown keyword argument always was."""

    def __init__(self, name: str):
        super().__init__(f"{name!r} is not a job option", code="bad_request")


def invalid(what: str, error: ValidationError) -> GpuhopError:
    """A GpuhopError for input the wire models refused: each field and why, in words."""
    reasons = "; ".join(
        f"{'.'.join(map(str, err['loc']))}: " * bool(err["loc"])
        + str(err["msg"]).removeprefix("Value error, ")
        for err in error.errors()
    )
    return GpuhopError(f"{what}: {reasons}", code="bad_request")


class SyncError(Exception):
    """The work dir cannot be synced as it is; the message names the file and what to do."""
