"""Runs on the user's machine: a local TCP port (or Unix socket) that leads to a port a job
listens on.

`Forward` listens locally; each connection it accepts gets its own WebSocket to the agent
(`/v1/jobs/{id}/ports/{port}`) through the client's endpoint, so forwarding works over
an SSH tunnel and TLS alike, with the same credentials. With the agent on this host, the
agent hands over the job's connected socket instead (`gpuhop.client.transport.handoff`) and the
bytes go straight between the local connection and the job. One asyncio
loop on a thread of its own moves the bytes of every connection (websockets' threaded
client holds one lock across a blocked send and its receives, which deadlocks an echo
under backpressure). A watcher thread closes everything when the job ends. See
`gpuhop.agent.proxy.bridge` for the wire protocol.

Whoever reaches the local end is served with this user's credentials, as with `ssh -L`:
on loopback that is every local user of this machine. A Unix socket (`unix=PATH`) is made
mode 0600 before it listens (bound in a private 0700 directory, then renamed into place),
so only this user's processes can connect: the choice for a machine shared with others.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat
import struct
import tempfile
import threading
from collections.abc import Callable
from typing import Protocol

from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from gpuhop.api import ErrorBody, JobInfo
from gpuhop.client.errors import GpuhopError
from gpuhop.client.session import Session
from gpuhop.client.transport.handoff import connect as handed_over
from gpuhop.client.transport.handoff import pump as pump_handed_over
from gpuhop.client.transport.handoff import write as write_local

EOF = "eof"
# One read from a local socket becomes one message of at most this size; the agent
# sends at most as much, and the limit below leaves room for an agent that sends more.
CHUNK = 256 * 1024
MAX_MESSAGE = 16 * 1024 * 1024
OPEN_TIMEOUT = 10.0
# How often the watcher asks whether the job still runs.
JOB_POLL_SECONDS = 1.0

ErrorHandler = Callable[[GpuhopError], None]


class ForwardedJob(Protocol):
    """What a forward needs of its job (a `gpuhop.Job`): its id, the session to reach the
    agent through, and its state now."""

    session: Session

    @property
    def id(self) -> str: ...

    def refresh(self) -> JobInfo: ...


class Forward:
    """A local port forwarded to `remote_port` of a running job, until `close()` or the
    job ends. Use as a context manager; `address` is where to connect."""

    def __init__(
        self,
        job: ForwardedJob,
        remote_port: int,
        local_port: int = 0,
        host: str = "127.0.0.1",
        on_error: ErrorHandler | None = None,
        unix: str | os.PathLike[str] | None = None,
    ):
        self.job = job
        self.remote_port = remote_port
        self.host = host
        self.unix_path: str | None = None if unix is None else os.path.abspath(unix)
        """The Unix socket listened on instead of a TCP port (mode 0600), if any."""
        self._path = f"/v1/jobs/{job.id}/ports/{remote_port}"
        self._on_error = on_error
        # The first check: a job that is not running, or a port nothing answers on, is
        # an error now rather than at the first connection.
        job.session.request("GET", self._path)
        if self.unix_path is not None:
            listener = _listen_unix(self.unix_path)
            self.local_port: int = 0
        else:
            listener = _listen(host, local_port)
            self.local_port = listener.getsockname()[1]
        self.ended: JobInfo | None = None
        """The job's final info, once it has ended (which closed this forward)."""
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._done = threading.Event()
        self._loop = _new_loop()
        self._tunnels: set[asyncio.Task[None]] = set()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._tunnel, sock=listener, limit=CHUNK)
        )
        self._threads = [
            threading.Thread(target=self._loop.run_forever, name="forward-loop", daemon=True),
            threading.Thread(target=self._watch, name="forward-watch", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def __repr__(self) -> str:
        return f"Forward({self.url} -> job {self.job.id} port {self.remote_port})"

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.local_port

    @property
    def url(self) -> str:
        if self.unix_path is not None:
            return f"unix:{self.unix_path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.local_port}"

    @property
    def closed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the forward has closed (the job ended, or `close()`); False on timeout."""
        return self._done.wait(timeout)

    def close(self) -> None:
        """Stop listening and close every forwarded connection; returns once all are closed."""
        with self._lock:
            first = not self._closing.is_set()
            self._closing.set()
        if not first:
            if threading.current_thread() not in self._threads:
                self._done.wait()  # another thread is closing it (the job ended)
            return
        if threading.current_thread() is self._threads[0]:
            # From an on_error handler, on the loop: the loop cannot wait for itself.
            threading.Thread(target=self._close, name="forward-close").start()
            return
        self._close()

    def _close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        self._loop.close()
        self._done.set()

    # -- the watcher thread -------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._closing.wait(JOB_POLL_SECONDS):
            try:
                info = self.job.refresh()
            except GpuhopError:
                continue  # the agent may be restarting; tunnels fail on their own
            if info.state.finished:
                self.ended = info
                self.close()
                return

    # -- on the loop ----------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        self._server.close()
        for task in list(self._tunnels):
            task.cancel()
        if self._tunnels:
            await asyncio.wait(list(self._tunnels))
        await self._server.wait_closed()
        if self.unix_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.unix_path)

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One forwarded connection, from its accept until both sides are done."""
        task = asyncio.current_task()
        assert task is not None
        self._tunnels.add(task)
        # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and one from
        # socket.create_server has proto 0. Without it, Nagle holds each small write (a gRPC
        # response) until the peer's delayed ACK: 40 ms per remote TensorFlow op.
        with contextlib.suppress(OSError, AttributeError):
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        clean = False
        try:
            sock = await self._handed_over()
            if sock is not None:
                clean = await pump_handed_over(reader, writer, sock)
            else:
                async with await self._open_websocket() as ws:
                    clean = await _pump(reader, writer, ws)
        except GpuhopError as e:
            if self._on_error is not None and not self._closing.is_set():
                self._on_error(e)
        except asyncio.CancelledError:
            # The forward is closing. A task that ends cancelled makes Python 3.11's
            # asyncio streams log the CancelledError that task.exception() raises.
            pass
        finally:
            self._tunnels.discard(task)
            _close_local(writer, reset=not clean)

    async def _handed_over(self) -> socket.socket | None:
        """The job's port itself, where the agent runs on this host (see
        `gpuhop.client.transport.handoff`); None where the bytes go over a WebSocket instead."""
        path = self.job.session.endpoint.handoff
        if path is None:
            return None
        return await asyncio.to_thread(handed_over, path, self.job.id, self.remote_port)

    async def _open_websocket(self) -> ClientConnection:
        endpoint = self.job.session.endpoint
        uri = endpoint.websocket_url(self._path)
        # No compression: it costs latency, and forwarded data is often compressed already.
        try:
            if endpoint.uds is not None:
                try:
                    return await self._unix_websocket(endpoint.uds, uri)
                except OSError:
                    # The SSH transport's tunnel may have dropped: reachable() opens it again.
                    if not await asyncio.to_thread(endpoint.reachable):
                        raise
                    return await self._unix_websocket(endpoint.uds, uri)
            return await connect(
                uri,
                ssl=endpoint.ssl_context if uri.startswith("wss:") else None,
                proxy=None,  # as the HTTP requests: straight to the agent
                additional_headers=endpoint.headers,
                compression=None,
                max_size=MAX_MESSAGE,
                open_timeout=OPEN_TIMEOUT,
            )
        except InvalidStatus as e:
            raise _refusal(e) from None
        except (OSError, WebSocketException, TimeoutError) as e:
            raise GpuhopError(
                f"cannot reach {endpoint.description}: {e}", code="unreachable"
            ) from None

    async def _unix_websocket(self, path: str, uri: str) -> ClientConnection:
        return await unix_connect(
            path,
            uri,
            additional_headers=self.job.session.endpoint.headers,
            compression=None,
            max_size=MAX_MESSAGE,
            open_timeout=OPEN_TIMEOUT,
        )


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ws: ClientConnection
) -> bool:
    """Move bytes both ways until the agent closes. True if it closed cleanly (1000)."""

    async def upstream() -> None:
        with contextlib.suppress(ConnectionClosed):
            while data := await reader.read(CHUNK):
                await ws.send(data)  # waits while the agent is behind (backpressure)
            await ws.send(EOF)

    up = asyncio.create_task(upstream())
    try:
        async for message in ws:
            if isinstance(message, str):
                if message == EOF and writer.can_write_eof():
                    writer.write_eof()
                continue
            write_local(writer, message)
            await writer.drain()  # the local reader is behind: stop reading the agent
    except OSError:
        await ws.close(1001, "the local connection failed")
        return False
    except ConnectionClosed:
        return False
    finally:
        up.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await up
    return ws.close_code == 1000


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (each message of a forwarded connection
    costs less there: remote TensorFlow ops are many small ones), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _close_local(writer: asyncio.StreamWriter, reset: bool) -> None:
    sock = writer.get_extra_info("socket")
    if reset and sock is not None:
        # The job's side failed or went away: the local peer sees a reset, not an EOF.
        # ValueError: uvloop's socket of a transport that the local peer's own reset has
        # closed already has no file descriptor left.
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
    else:
        writer.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as e:
        taken = e.errno == errno.EADDRINUSE
        raise GpuhopError(
            f"cannot listen on {host}:{port}: {e.strerror or e}"
            + (" (pick another local port, or 0 for any free one)" if taken else ""),
            code="local_port",
        ) from None


def _listen_unix(path: str) -> socket.socket:
    """A listening Unix socket at `path` that only this user can connect to. It is bound
    in a fresh 0700 directory beside `path`, made 0600, and only then renamed into place:
    at no moment can another user connect. An existing `path` is never replaced (it may be
    another forward's, or not a socket at all)."""
    if os.path.lexists(path):
        kind = "a socket" if stat.S_ISSOCK(os.lstat(path).st_mode) else "not a socket"
        raise GpuhopError(
            f"cannot listen on {path}: it exists ({kind}); pick another path, or remove it"
            " if no forward uses it",
            code="local_port",
        )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        private = tempfile.mkdtemp(prefix=".gpuhop-forward-", dir=os.path.dirname(path))
        try:
            staged = os.path.join(private, "s")
            sock.bind(staged)
            os.chmod(staged, 0o600)
            os.rename(staged, path)
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(private)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise GpuhopError(
            f"cannot listen on {path}: {e.strerror or e}", code="local_port"
        ) from None
    return sock


def _refusal(e: InvalidStatus) -> GpuhopError:
    """The agent's own words for a refused WebSocket (an `ErrorBody`, as for any request)."""
    response = e.response
    try:
        body = ErrorBody.model_validate_json(response.body or b"")
    except ValueError:
        return GpuhopError(
            f"the agent refused the connection: HTTP {response.status_code}",
            status=response.status_code,
        )
    return GpuhopError(body.message, body.code.value, response.status_code, body.detail)
