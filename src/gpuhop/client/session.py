"""Runs on the user's machine: one session with an agent, which every part of the SDK talks
through: the endpoint and the HTTP client over its transport, the agent's error answers
read as `GpuhopError`, and the local cache dir.

`gpuhop.Client` builds one and hands it to the modules of each feature (jobs, data,
serving, TensorBoard, forwarding, the dashboard), as httpx's `Client` sits over its
transports; none of them imports the `Client` facade back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import quote as _url_quote

import httpx

from gpuhop.api import ErrorBody
from gpuhop.client.errors import GpuhopError
from gpuhop.client.spec import SyncStats
from gpuhop.client.transport import Endpoint


class Session:
    """A connection to one agent through `endpoint` (or `transport`, in tests)."""

    def __init__(
        self,
        endpoint: Endpoint,
        cache_dir: Path,
        transport: httpx.BaseTransport | None = None,
    ):
        self.endpoint = endpoint
        self.cache_dir = cache_dir
        self.http = httpx.Client(
            transport=transport or endpoint.transport(),
            base_url=endpoint.base_url,
            headers=endpoint.headers,
            timeout=httpx.Timeout(60.0, connect=5.0),
        )
        self.last_sync: SyncStats | None = None
        """What the last submit's sync did."""

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, url: str, **kwargs: object) -> httpx.Response:
        """A request whose error answer is raised as GpuhopError, as is one that did not
        get through."""
        try:
            response = self.http.request(method, url, **kwargs)  # type: ignore[arg-type]
        except httpx.TransportError as e:
            raise self.unreachable(e) from None
        self.check(response)
        return response

    @contextlib.contextmanager
    def stream(self, method: str, url: str, **kwargs: object) -> Iterator[httpx.Response]:
        """A streamed answer; an error answer is raised as GpuhopError. Transport errors
        pass through as they are: a follower reconnects on them."""
        with self.http.stream(method, url, **kwargs) as response:  # type: ignore[arg-type]
            if response.status_code >= 400:
                response.read()
                self.check(response)
            yield response

    def unreachable(self, e: httpx.TransportError) -> GpuhopError:
        """The error for a request that did not get through, as precise as can be found."""
        explained = self.endpoint.explain(e)
        return GpuhopError(
            explained or f"cannot reach {self.endpoint.description}: {e}", code="unreachable"
        )

    def check(self, response: httpx.Response) -> None:
        """`check`, with a 401 (TCP listener: no valid token) said in words to act on."""
        try:
            check(response)
        except GpuhopError as e:
            if e.status != 401:
                raise
            raise GpuhopError(
                f"the agent refused the token for {self.endpoint.description} (missing,"
                f" wrong or revoked): {e.message}",
                code="unauthorized",
                status=401,
            ) from None


class Connected(Protocol):
    """What holds a session: a `gpuhop.Client`."""

    @property
    def session(self) -> Session: ...


def session_of(via: Session | Connected) -> Session:
    """The session itself, or the one a client talks through: the functions that the CLI
    and `gpuhop.tf` call with a `Client` take either."""
    return via if isinstance(via, Session) else via.session


def check(response: httpx.Response) -> None:
    """Raise GpuhopError with the agent's own words for a 4xx/5xx answer."""
    if response.status_code < 400:
        return
    try:
        body = ErrorBody.model_validate(response.json())
        raise GpuhopError(body.message, body.code.value, response.status_code, body.detail)
    except ValueError:
        raise GpuhopError(
            f"the agent answered {response.status_code}: {response.text[:500]}",
            status=response.status_code,
        ) from None


def quote(ref: str, safe: str = "") -> str:
    """A job ref, name or path as one URL path segment (`safe`: what stays as it is)."""
    return _url_quote(ref, safe=safe)
