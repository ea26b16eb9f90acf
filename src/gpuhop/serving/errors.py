"""Runs in the serving job: TF Serving's error answers, and the log of what went wrong.

A refused request is a `ServingError`: its status and TF Serving's {"error": message}.
TensorFlow's own errors keep their words and get the HTTP status TF Serving gives their
code (its `http_server.cc`, ToHTTPStatusCode). Anything else that fails is the server's
fault: a 500 with the error, and its traceback in the job's log (this process's stderr).
"""

from __future__ import annotations

import sys
import traceback

# TensorFlow / absl status codes -> HTTP, as TF Serving maps them.
HTTP_OF_CODE = {
    1: 499,  # CANCELLED
    2: 500,  # UNKNOWN
    3: 400,  # INVALID_ARGUMENT
    4: 504,  # DEADLINE_EXCEEDED
    5: 404,  # NOT_FOUND
    6: 409,  # ALREADY_EXISTS
    7: 403,  # PERMISSION_DENIED
    8: 429,  # RESOURCE_EXHAUSTED
    9: 400,  # FAILED_PRECONDITION
    10: 409,  # ABORTED
    11: 400,  # OUT_OF_RANGE
    12: 501,  # UNIMPLEMENTED
    13: 500,  # INTERNAL
    14: 503,  # UNAVAILABLE
    15: 500,  # DATA_LOSS
    16: 401,  # UNAUTHENTICATED
}
LOG_PREFIX = "gpuhop-serving:"


class ServingError(Exception):
    """A request the server refuses: `status` and TF Serving's {"error": message}."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def internal(e: BaseException, during: str) -> ServingError:
    """An unexpected failure as the 500 its requests get; its traceback goes to the log."""
    log_failure(e, during)
    return ServingError(500, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def log_failure(e: BaseException, during: str) -> None:
    print(f"{LOG_PREFIX} error while {during}:", file=sys.stderr)
    traceback.print_exception(e, file=sys.stderr)
    sys.stderr.flush()
