"""Runs on the GPU host: serves the agent in this process until SIGTERM.

One agent per state dir, guarded by an flock on `agent.lock`, listening on `agent.sock`
(mode 0600 in a 0700 dir; no TCP port unless `--listen` asks for one, see
`gpuhop.agent.server.listen`). Jobs run in their own sessions and survive the agent: stopping it
never stops a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uvicorn import server as uvicorn_server

import gpuhop.agent.config as agent_config
from gpuhop.agent.server import listen as listen_mod
from gpuhop.agent.server import logs as logs_mod
from gpuhop.agent.server.accept import BoundedListener, ConnectionBounds, total_for
from gpuhop.agent.server.listen import ListenSpec
from gpuhop.agent.server.protocol import KEEP_ALIVE_TIMEOUT
from gpuhop.backends import BackendSettings
from gpuhop.backends.procs import alive
from gpuhop.home import AgentError, AgentPaths, read_pid

if TYPE_CHECKING:
    from gpuhop.agent.context import AgentContext
    from gpuhop.api import ListenerInfo
    from gpuhop.backends.base import Backend, GpuHost


def serve(
    paths: AgentPaths,
    fake_gpus: int | None = None,
    fake_gpu_memory_mb: int | None = None,
    listen: ListenSpec | None = None,
    policy: dict[str, Any] | None = None,
    backend: BackendSettings | None = None,
    fake_gpu_models: str | None = None,
) -> None:
    """Run the agent in this process until SIGTERM or SIGINT.

    `fake_gpus=N` pretends the host has N GPUs of `fake_gpu_memory_mb` (default 8192) each,
    of the models `fake_gpu_models` names ("MODEL[@GROUP],...", one per GPU).
    `listen` opens a TCP listener beside the Unix socket: TLS (unless `--no-tls` on
    loopback) and bearer tokens, serving the same app in the same event loop.
    `policy` overrides settings of agent.toml (retention, quotas: see gpuhop.agent.config).
    `backend` says where jobs run (see gpuhop.backends); None: as the last time, else here.
    """
    paths.ensure()
    try:
        settings = agent_config.load(paths.home, policy)
    except agent_config.PolicyError as e:
        raise AgentError(str(e)) from None
    lock_fd = os.open(paths.lockfile, os.O_RDWR | os.O_CREAT, 0o600)
    if not _take_lock(lock_fd, paths):
        raise AgentError(f"an agent already runs for {paths.home} (pid {read_pid(paths)})")
    logs_mod.configure(paths.logfile)
    try:
        paths.pidfile.write_text(f"{os.getpid()}\n")
        with contextlib.suppress(FileNotFoundError):
            paths.listen_file.unlink()  # left by an agent that died
        fake = (fake_gpus, fake_gpu_memory_mb, fake_gpu_models)
        _serve_locked(paths, fake, listen, settings, backend)
    finally:
        for leftover in (paths.socket, paths.handoff, paths.listen_file, paths.pidfile):
            with contextlib.suppress(OSError):
                leftover.unlink()
        os.close(lock_fd)


def _serve_locked(
    paths: AgentPaths,
    fake: tuple[int | None, int | None, str | None],
    listen: ListenSpec | None,
    policy: agent_config.Policy,
    backend: BackendSettings | None,
) -> None:
    from gpuhop.agent.context import AgentContext
    from gpuhop.agent.host import gpus
    from gpuhop.backends import remember, resolve

    fake_gpus, fake_gpu_memory_mb, fake_gpu_models = fake
    fd_limit = raise_file_limit()
    where = resolve(paths.home, backend)
    if where.name != "local" and fake_gpus is not None:
        raise AgentError("--fake-gpus is for the local backend; a Ray cluster has its own GPUs")
    local = where.name == "local"
    try:
        gpu_host = (
            gpus.discover(
                fake_gpus,
                fake_gpu_memory_mb or gpus.FAKE_GPU_MEMORY_MB,
                fake_gpu_models,
                fake_seam=paths.fake_gpus_seam,
            )
            if local
            else None
        )
    except ValueError as e:
        raise AgentError(str(e)) from None
    # Before the backend opens: a certificate that cannot be served stops the agent with
    # nothing started (nor the backend remembered).
    served = listen_mod.certificate(paths, listen) if listen is not None and listen.tls else None
    # Before any listener exists: a cluster that cannot be used stops the agent here.
    job_backend = open_backend(where, paths, sys.executable, gpu_host, policy)
    remember(paths.home, where)
    tcp: socket.socket | None = None
    listener = None
    cert_files: dict[str, Any] = {}
    if served is not None:
        cert_files = {"ssl_certfile": str(served.cert), "ssl_keyfile": str(served.key)}
    if listen is not None:
        tcp = listen_mod.bind(listen)
        listener = listen_mod.listener_info(tcp, listen, served)
        # Written before the Unix socket exists: whoever waits for the socket to answer
        # (`gpuhop agent start`) finds the actual address and fingerprint here.
        listen_mod.write_listen_file(paths, listener)
    ctx = AgentContext(paths, job_backend, policy)
    try:
        ctx.listener = listener
        ctx.own_certificate = served.cert if served is not None and served.own else None
        _serve_context(ctx, paths, tcp, listener, cert_files, fd_limit)
    finally:
        ctx.close()


def _serve_context(
    ctx: AgentContext,
    paths: AgentPaths,
    tcp: socket.socket | None,
    listener: ListenerInfo | None,
    cert_files: dict[str, Any],
    fd_limit: int,
) -> None:
    import uvicorn

    from gpuhop.agent.server.app import create_app
    from gpuhop.agent.server.auth import OwnerAuth, TokenAuth
    from gpuhop.agent.server.guesses import TokenGuesses
    from gpuhop.agent.server.protocol import BodyHttpProtocol, DenialWebSockets

    log = logging.getLogger("gpuhop.agent")
    app = create_app(ctx)
    # Bound only now that the agent can answer: a client that connects is answered, and one
    # that waits for it to start (`start_background`) hears of a failure above from its log,
    # not from a connection closed on it.
    sock = _bind_unix_socket(paths.socket)
    common: dict[str, Any] = {
        # uvicorn's lines go through the agent's own handler (see `logs`), not its own.
        "log_config": None,
        "log_level": "warning",
        "access_log": False,
        "timeout_graceful_shutdown": 2,
        "ws": DenialWebSockets,
    }
    # One lifespan (the scheduler) for the agent: the Unix socket's server runs it.
    servers = [(_Server(uvicorn.Config(OwnerAuth(app), http=BodyHttpProtocol, **common)), sock)]
    if tcp is not None:
        policy = ctx.policy
        guesses = None
        if policy.auth_fail_limit is not None:
            guesses = TokenGuesses(policy.auth_fail_limit, policy.auth_fail_window_seconds)
        config = uvicorn.Config(
            TokenAuth(app, ctx.tokens, guesses),
            lifespan="off",
            proxy_headers=False,
            timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
            **cert_files,
            **common,
        )
        bounds = ConnectionBounds(total=total_for(fd_limit))
        servers.append((_BoundedServer(config, bounds), tcp))
        log.info(
            "open-file limit %d: at most %d TCP connections, %d from one address",
            fd_limit,
            bounds.total,
            bounds.per_address,
        )
    log.info(
        "agent %d serving %s with %d GPU(s) (%s)",
        os.getpid(),
        paths.socket,
        len(ctx.gpus),
        ctx.gpu_host.source,
    )
    if ctx.backend.remote:
        log.info("%s", ctx.backend.describe())
    if listener is not None:
        log.info(
            "listening on %s; certificate fingerprint %s",
            listener.url,
            listener.fingerprint or "(none: plain HTTP on loopback)",
        )
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve_all(servers))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (its TLS and sockets are faster), else
    asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


class _Server(uvicorn_server.Server):
    """A uvicorn server that leaves signals alone: `_serve_all` handles them once for all."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class _BoundedServer(_Server):
    """The TCP listener's server: connections come through a `BoundedListener`, which
    bounds them per client address and in all and times out TLS handshakes."""

    def __init__(self, config: Any, bounds: ConnectionBounds):
        super().__init__(config)
        self.bounds = bounds

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])
        for sock in sockets or []:
            listener = BoundedListener(sock, self, self.bounds)
            listener.start()
            self.servers.append(listener)  # type: ignore[arg-type]  # closed as a server is


def raise_file_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit (many hosts start at
    1,024, which a few hundred idle connections and jobs' logs would use up). Returns the
    soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard
    if hard == resource.RLIM_INFINITY:
        try:
            want = int(Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            want = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError) as e:
            logging.getLogger("gpuhop.agent").warning(
                "could not raise the open-file limit from %d to %d: %s", soft, want, e
            )
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


async def _serve_all(servers: list[tuple[_Server, socket.socket]]) -> None:
    """Serve every listener until SIGTERM or SIGINT; when one server stops, all stop."""
    loop = asyncio.get_running_loop()

    def stop_all() -> None:
        for server, _ in servers:
            server.should_exit = True

    async def run(server: _Server, sock: socket.socket) -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            stop_all()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_all)
    try:
        await asyncio.gather(*(run(server, sock) for server, sock in servers))
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _take_lock(fd: int, paths: AgentPaths, patience: float = 1.0) -> bool:
    """The agent's lock. A client checking for a running agent holds it for an instant, so
    a held lock is tried again for a moment; but not while a live agent holds it. An agent
    started by a client that lost a race to start one would otherwise wait here, take the
    lock from a running agent stopped in that moment (`gpuhop agent stop` right after the
    commands), and run on after the stop."""
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline or _pid_alive(paths):
                return False
            time.sleep(0.01)


def _pid_alive(paths: AgentPaths) -> bool:
    """Whether the pid file names a live process (the agent that holds the lock writes it
    first thing; one that died may have left it)."""
    try:
        return alive(int(paths.pidfile.read_text().strip()), None)
    except (OSError, ValueError):
        return False  # none yet, or unreadable


def _bind_unix_socket(path: Path) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from an agent that died; we hold the lock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


def open_backend(
    settings: BackendSettings,
    paths: AgentPaths,
    python: str,
    gpu_host: GpuHost | None,
    policy: agent_config.Policy,
) -> Backend:
    """The backend of these settings, connected. `gpu_host` is this host's GPUs, for the
    local backend (a cluster has its own); `policy` has the site's settings for a cluster
    (agent.toml's [slurm]). Raises AgentError saying why it cannot be used."""
    if settings.name == "ray":
        from gpuhop.backends.ray.backend import RayBackend

        return RayBackend.connect(settings, python)
    if settings.name == "slurm":
        from gpuhop.backends.slurm.backend import Site, SlurmBackend

        site = Site(policy.slurm_ports or Site().ports, policy.slurm_scratch)
        return SlurmBackend.connect(settings, paths.home, python, site)
    from gpuhop.backends.local.backend import LocalBackend

    assert gpu_host is not None
    from gpuhop.backends.podman import PodmanSettings

    # The Podman the agent's image store uses too (AgentContext.podman): one store.
    return LocalBackend(
        paths,
        gpu_host,
        python,
        PodmanSettings(policy.podman, policy.container_runtime),
        policy.ready_containers,
    )
