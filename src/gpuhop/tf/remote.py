"""Runs on the user's machine: TensorFlow ops on a remote GPU host's TensorFlow server.

`gpuhop.tf.connect()` finds a `gpuhop tf-server` job, starts a helper process
(`gpuhop.tf.tunnel`) that forwards a local port to the server's port inside the job's
private network (through the agent, with the client's credentials: the Unix socket, SSH,
or TLS and token) and checks that a gRPC server answers there, then connects TensorFlow's
remote eager execution to that port. Ops under `tf.device(gpuhop.tf.remote_device())` run
on the host; a `tf.function` placed there runs there whole.

No silent hangs: TensorFlow waits forever on a server that is frozen or gone, holding the
GIL, so the watchdog lives in the helper process (see `gpuhop.tf.tunnel`). When the job ends
or the server stops answering for `stall_timeout` seconds, the helper closes the tunnel:
the op in flight fails at once with TensorFlow's UnavailableError, and later remote ops
fail at once too (TensorFlow's streaming enqueue is turned off for that: with it on, the op
after a failure could block forever). Inside `with connect(...)`, that error comes out as a
`RemoteError` saying what happened and what to do.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

from gpuhop.client import Client, GpuhopError, tfservers

# The server's devices, as TensorFlow names them on the client.
TASK = "/job:worker/replica:0/task:0"

_current: Remote | None = None


class RemoteError(GpuhopError):
    """The remote TensorFlow server cannot be used: absent, ended, or not answering."""


class Remote:
    """This process's TensorFlow connected to a remote TensorFlow server job.

    Use it as a context manager (or call `close()`). `device()` names the server's devices;
    `error` says why the connection failed, once it has."""

    def __init__(
        self,
        job: str,
        server_name: str | None,
        tunnel: subprocess.Popen[bytes],
        verdict_seconds: float = 15.0,
    ):
        self.job = job
        self._verdict_seconds = verdict_seconds
        self.server_name = server_name
        self.local_port = 0
        self.devices: list[str] = []
        self._tunnel = tunnel
        self._error: str | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "failed" if self.error else "closed" if self._closed else "open"
        return f"Remote(job {self.job} via 127.0.0.1:{self.local_port}, {state})"

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        failed = self.error if isinstance(exc, Exception) else None
        if failed is None and type(exc).__name__ == "UnavailableError":
            # TensorFlow can hear of a dead server before the tunnel has said why: wait
            # for its verdict (it comes within one probe, or it has none).
            self._read_tunnel(timeout=self._verdict_seconds)
            failed = self._error
        self.close()
        if failed is not None and not isinstance(exc, RemoteError):
            raise RemoteError(failed, code="remote_failed") from exc

    @property
    def address(self) -> tuple[str, int]:
        """Where TensorFlow connects: the local end of the tunnel."""
        return "127.0.0.1", self.local_port

    @property
    def error(self) -> str | None:
        """Why the connection failed (the server ended, froze, or the link went down)."""
        if self._error is None and not self._closed:
            self._read_tunnel(timeout=0)
        return self._error

    def device(self, kind: str | None = None, index: int = 0) -> str:
        """The server's device `kind:index`, as `tf.device` takes it; `kind` None means GPU
        if the server has one, else CPU. `RemoteError` if the server has no such device."""
        if kind is None:
            kind = "GPU" if any("/device:GPU:" in d for d in self.devices) else "CPU"
        name = f"{TASK}/device:{kind.upper()}:{index}"
        if self.devices and name not in self.devices:
            # Else TensorFlow says only "unknown device", at the first op placed there.
            has = ", ".join(d.removeprefix(f"{TASK}/device:") for d in self.devices)
            raise RemoteError(
                f"the TensorFlow server (job {self.job}) has no {kind.upper()}:{index}; it"
                f" has {has}. For GPUs, start it with some: gpuhop tf-server start --gpus N",
                code="bad_request",
            )
        return name

    def check(self) -> None:
        """Raise `RemoteError` if the connection has failed."""
        if self.error is not None:
            raise RemoteError(self.error, code="remote_failed")

    def close(self, reset: bool = True) -> None:
        """Close the tunnel; with `reset`, reset TensorFlow's eager context so later ops run
        locally and a new `connect` starts clean. The reset invalidates tensors and
        variables made while connected (TensorFlow has no disconnect that keeps them):
        fetch what you need (`.numpy()`, `model.get_weights()`) first."""
        global _current
        if self._closed:
            return
        self.error  # noqa: B018  (a last look at what the tunnel said)
        self._closed = True
        if _current is self:
            _current = None
            if reset:
                # Before the tunnel closes: TensorFlow releases its remote state through it.
                from tensorflow.python.eager import context

                context._reset_context()
        if self._tunnel.stdin is not None:
            self._tunnel.stdin.close()
        try:
            self._tunnel.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._tunnel.kill()
            self._tunnel.wait()
        if self._tunnel.stdout is not None:
            self._tunnel.stdout.close()

    def _read_tunnel(self, timeout: float | None) -> tuple[str, str] | None:
        """The tunnel's next line as (kind, message), waiting up to `timeout` seconds."""
        out = self._tunnel.stdout
        assert out is not None
        if timeout is not None and not select.select([out], [], [], timeout)[0]:
            return None
        line = out.readline().decode(errors="replace").strip()
        kind, _, message = line.partition(" ")
        if not line:
            kind, message = "failed", f"the tunnel to job {self.job} ended unexpectedly"
        if kind in ("failed", "error") and self._error is None:
            self._error = message
        return kind, message


def _tunnel_command(
    remote: str | None, home: str | None, job: str, port: int, stall: float, interval: float
) -> list[str]:
    argv = [sys.executable, "-m", "gpuhop.tf.tunnel", "--job", job, "--port", str(port)]
    argv += ["--stall-timeout", str(stall), "--probe-interval", str(interval)]
    if remote is not None:
        argv += ["--remote", remote]
    if home is not None:
        argv += ["--home", str(Path(home).absolute())]
    return argv


def connect(
    remote: str | None = None,
    job: str = tfservers.DEFAULT_NAME,
    *,
    home: str | os.PathLike[str] | None = None,
    ready_timeout: float = 120.0,
    stall_timeout: float = 10.0,
    probe_interval: float = 2.0,
) -> Remote:
    """Connect this process's TensorFlow to the TensorFlow server job `job` (name, id or
    prefix; see `gpuhop tf-server start`) on `remote` (None: $GPUHOP_REMOTE or the default
    remote, else the local agent of `home`).

    Waits up to `ready_timeout` seconds for a server that is still starting. Raises
    `RemoteError` if there is none, it has ended, or it does not answer. One that stops
    answering for `stall_timeout` seconds later is declared frozen (see the module's
    docstring). Returns a `Remote`; use it as a context manager.
    """
    if _current is not None:
        raise RemoteError(
            f"already connected to job {_current.job}; close that connection first",
            code="conflict",
        )
    try:
        with Client(home, remote=remote, autostart=home is None) as client:
            server = tfservers.find(client, job)
            tfservers.wait_ready(server, ready_timeout)
    except GpuhopError as e:
        raise RemoteError(e.message, code=e.code, status=e.status, detail=e.detail) from None
    tunnel = subprocess.Popen(
        _tunnel_command(
            remote,
            None if home is None else str(home),
            server.id,
            tfservers.port_of(server.info),
            stall_timeout,
            probe_interval,
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    result = Remote(server.id, server.info.name, tunnel, stall_timeout + probe_interval + 3)
    said = result._read_tunnel(timeout=ready_timeout + stall_timeout + 30)
    if said is None or said[0] != "ready":
        result._error = result._error or f"the tunnel to job {server.id} did not start in time"
        result.close(reset=False)
        raise RemoteError(result._error, code="remote_failed")
    result.local_port = int(said[1])
    _connect_tensorflow(result)
    return result


def _connect_tensorflow(remote: Remote) -> None:
    global _current
    # With streaming enqueue (TensorFlow's default), the op after a failed one can block
    # forever; without it, every op on a dead connection fails at once.
    os.environ["TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE"] = "false"
    import tensorflow as tf

    _current = remote  # so that close() below resets what a failed connect left
    try:
        tf.config.experimental_connect_to_cluster(
            tf.train.ClusterSpec({"worker": [f"127.0.0.1:{remote.local_port}"]})
        )
        remote.devices = [
            d.name for d in tf.config.list_logical_devices() if d.name.startswith(TASK)
        ]
    except Exception as e:
        error = remote.error
        remote.close()
        if error is not None:
            raise RemoteError(error, code="remote_failed") from e
        raise


def current() -> Remote:
    if _current is None:
        raise RemoteError(
            "not connected to a TensorFlow server: call gpuhop.tf.connect() first",
            code="not_connected",
        )
    return _current


def remote_device(kind: str | None = None, index: int = 0) -> str:
    """The connected server's device, e.g. `/job:worker/replica:0/task:0/device:GPU:0`
    (`kind` None: its GPU if it has one, else its CPU)."""
    return current().device(kind, index)


def devices() -> list[str]:
    return list(current().devices)


__all__ = ["Remote", "RemoteError", "connect", "devices", "remote_device"]
