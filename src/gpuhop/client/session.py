"""Runs on the user's machine: one session with an agent, which every part of the SDK talks
through: the endpoint and the HTTP client over its transport, the agent's error answers
read as `GpuhopError`, and the local cache dir.

`gpuhop.Client` builds one and hands it to the modules of each feature (jobs, data,
serving, TensorBoard, forwarding, the dashboard), as httpx's `Client` sits over its
transports; none of them imports the `Client` facade back.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote as _url_quote

from gpuhop.client.errors import GpuhopError
from gpuhop.client.transport.base import Endpoint, HttpClient, Response
from gpuhop.client.transport.unixhttp import Timeout, UnixClient

if TYPE_CHECKING:
    import httpx

    from gpuhop.client.submitted import SyncStats

DEFAULT_TIMEOUT = Timeout(60.0, connect=5.0)


class Session:
    """A connection to one agent through `endpoint` (or `transport`, in tests).

    An agent on a Unix socket (this machine's, or a remote's through its SSH tunnel) is
    spoken to with the standard library (unixhttp); a TLS remote, or a given transport,
    through httpx, imported only then.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        cache_dir: Path,
        transport: httpx.BaseTransport | None = None,
    ):
        self.endpoint = endpoint
        self.cache_dir = cache_dir
        self.http: HttpClient
        connected = endpoint.take_connected()
        if transport is None and endpoint.uds is not None and endpoint.ssl_context is None:
            self.http = UnixClient(
                endpoint.uds, endpoint.headers, DEFAULT_TIMEOUT, connected, endpoint.reachable
            )
        else:
            if connected is not None:
                connected.close()
            from gpuhop.client.transport.httpxtransport import HttpxClient

            self.http = HttpxClient(
                transport or endpoint.transport(),
                endpoint.base_url,
                endpoint.headers,
                DEFAULT_TIMEOUT,
            )
        self.transport_errors = self.http.errors
        """What a request that did not get through raises (a follower reconnects on it)."""
        self.last_sync: SyncStats | None = None
        """What the last submit's sync did."""

    def close(self) -> None:
        self.http.close()

    def send(self, method: str, url: str, **kwargs: Any) -> Response:
        """The raw answer, whatever its status; GpuhopError only when it did not get
        through. `timeout`: a unixhttp.Timeout."""
        try:
            return self.http.request(method, url, **kwargs)
        except self.transport_errors as e:
            raise self.unreachable(e) from None

    def request(self, method: str, url: str, **kwargs: Any) -> Response:
        """A request whose error answer is raised as GpuhopError, as is one that did not
        get through."""
        response = self.send(method, url, **kwargs)
        self.check(response)
        if 300 <= response.status_code < 400:
            # The API never redirects a request but one whose path ends in '/' (the router
            # sends it to the path without): a name left empty, `remove_secret("")`. Its
            # answer is no answer (empty), and nothing was done.
            raise GpuhopError(
                f"no such route: {method} {url.partition('?')[0]} (is a name in it empty?)",
                code="not_found",
                status=response.status_code,
            )
        return response

    @contextlib.contextmanager
    def stream(self, method: str, url: str, **kwargs: Any) -> Iterator[Response]:
        """A streamed answer; an error answer is raised as GpuhopError. Transport errors
        (`transport_errors`) pass through as they are: a follower reconnects on them."""
        with self.http.stream(method, url, **kwargs) as response:
            if response.status_code >= 400:
                response.read()
                self.check(response)
            yield response

    def unreachable(self, e: BaseException) -> GpuhopError:
        """The error for a request that did not get through, as precise as can be found."""
        explained = self.endpoint.explain(e)
        return GpuhopError(
            explained or f"cannot reach {self.endpoint.description}: {e}", code="unreachable"
        )

    def check(self, response: Response) -> None:
        """`check`, with a 401 (TCP listener: no valid token) said in words to act on."""
        try:
            check(response)
        except GpuhopError as e:
            if e.code == NOT_OURS and e.status is not None and e.status < 500:
                # A 4xx in no words of ours: whatever answered is no gpuhop agent.
                raise GpuhopError(
                    f"{self.endpoint.description} is not a gpuhop agent (HTTP {e.status})",
                    code="not_an_agent",
                    status=e.status,
                ) from None
            if e.status != 401:
                raise
            if os.environ.get("GPUHOP_TOKEN"):  # sent instead of the remote's (see tls)
                which = (
                    "; the token sent was $GPUHOP_TOKEN's, which overrides the one stored"
                    " with the remote: unset it, or set it to a valid token"
                )
            else:
                which = "; ask the agent's admin for a new token"
            raise GpuhopError(
                f"the agent refused the token for {self.endpoint.description} (missing,"
                f" wrong or revoked): {e.message}{which}",
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


def check(response: Response) -> None:
    """Raise GpuhopError with the agent's own words for a 4xx/5xx answer."""
    if response.status_code < 400:
        return
    # `ErrorBody`, read as JSON: an expected answer (`missing_tree` on a first `run`) loads
    # no pydantic.
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        code, message, detail = body.get("code"), body.get("message"), body.get("detail")
        if isinstance(code, str) and isinstance(message, str) and isinstance(detail, dict | None):
            raise GpuhopError(message, code, response.status_code, detail)
    raise GpuhopError(
        f"the agent answered {response.status_code}: {response.text[:500]}",
        code=NOT_OURS,
        status=response.status_code,
    )


# The code of an error answer that is not the agent's `ErrorBody`.
NOT_OURS = "unexpected_answer"


def quote(ref: str, safe: str = "") -> str:
    """A job ref, name or path as one URL path segment (`safe`: what stays as it is)."""
    return _url_quote(ref, safe=safe)
