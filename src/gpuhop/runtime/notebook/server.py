"""Runs inside the job: the JupyterLab server of `gpuhop notebook`, in the job's own Python.

jupyter_server runs in this process (JupyterLab as its extension), on the host's loopback,
in the job's work dir; its kernels are ipykernel in this same Python, under the job's
sandbox and GPUs. The token comes from the user's machine in $JUPYTER_TOKEN: it is taken
out of the environment before any kernel starts and never printed (Jupyter shows a
token it did not generate as `?token=...`).

Idle GPUs come back through Jupyter's own culling: a kernel idle for `idle` seconds is
shut down (connected or not), and a server with no kernels and no activity for `idle`
seconds stops, so the job ends and frees its GPUs. Jupyter checks the latter once a
minute; this module asks it more often for short timeouts.

The port goes into the job's metrics file (`notebook_port`), where the client finds it;
the same record, written again now and then, says how long the server has been idle.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from gpuhop.runtime import log_metrics
from gpuhop.runtime.iri import skip_iri_grammar
from gpuhop.runtime.notebook import (
    IDLE_METRIC,
    MISSING,
    PORT_METRIC,
    TOKEN_ENV,
)

NEWS_PLUGIN = "@jupyterlab/apputils-extension:announcements"
# The shortest token the server takes: the client makes 32 random bytes' worth.
MIN_TOKEN = 16


def _say(message: str) -> None:
    print(f"gpuhop: {message}", file=sys.stderr, flush=True)


def _free_port() -> int:
    """A port free on loopback now; Jupyter tries the next ones if it is taken by then."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config(token: str, idle: int, root: str) -> Any:
    """The server's Jupyter configuration (a traitlets Config)."""
    from traitlets.config import Config

    c = Config()
    c.ServerApp.ip = "127.0.0.1"
    c.ServerApp.port = _free_port()
    c.ServerApp.port_retries = 50
    c.ServerApp.open_browser = False
    c.ServerApp.root_dir = root
    c.ServerApp.default_url = "/lab"
    c.IdentityProvider.token = token
    # Kernels over Unix sockets in the private runtime dir, not loopback TCP ports that
    # anyone on the host may connect to.
    c.KernelManager.transport = "ipc"
    # The job may be root in its own user namespace; its sandbox is the boundary here.
    c.ServerApp.allow_root = True
    # Nothing reaches out from the GPU host on its own: no extension index, no news.
    c.LabApp.extension_manager = "readonly"
    c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
    c.LabApp.news_url = None
    if idle > 0:
        c.ServerApp.shutdown_no_activity_timeout = idle
        c.MappingKernelManager.cull_idle_timeout = idle
        c.MappingKernelManager.cull_interval = max(1, min(300, idle // 2))
        # A browser tab left open keeps its kernel connected; idle is idle all the same.
        c.MappingKernelManager.cull_connected = True
        c.MappingKernelManager.cull_busy = False
    return c


def _without_news(handler: object, page_config: dict[str, Any]) -> dict[str, Any]:
    """JupyterLab's page config without its news plugin, whose first question ("get
    notified about official Jupyter news?") would reach for the internet from the host."""
    disabled = page_config.setdefault("disabledExtensions", [])
    if isinstance(disabled, list) and NEWS_PLUGIN not in disabled:
        disabled.append(NEWS_PLUGIN)
    return page_config


def serve(idle: int) -> int:
    """Run the server until it stops (idle, SIGTERM from `gpuhop cancel`); its exit code."""
    token = os.environ.get(TOKEN_ENV, "")
    if len(token) < MIN_TOKEN:
        _say(f"the notebook server needs a token of {MIN_TOKEN}+ characters in ${TOKEN_ENV}")
        return 2
    skip_iri_grammar()
    try:
        import ipykernel  # noqa: F401  (the kernel the server starts)
        import jupyterlab  # noqa: F401
        from jupyter_server.serverapp import ServerApp
        from tornado.ioloop import PeriodicCallback
    except ImportError as e:
        _say(f"gpuhop notebook {MISSING.format(what=e.name, python=sys.executable)}")
        return 2
    runtime = tempfile.mkdtemp(prefix="gpuhop-jupyter-")
    os.environ["JUPYTER_RUNTIME_DIR"] = runtime  # connection files: private, and gone after
    try:
        app = ServerApp.instance(config=config(token, idle, os.getcwd()))
        app.initialize(argv=[])
        del os.environ[TOKEN_ENV]  # kernels and terminals do not inherit it
        app.web_app.settings.setdefault("page_config_hook", _without_news)
        port = app.port
        log_metrics(**{PORT_METRIC: port, IDLE_METRIC: 0})
        after = f"; kernels idle for {idle}s stop, then the server" if idle > 0 else ""
        _say(f"JupyterLab on 127.0.0.1:{port} of the GPU host, in {os.getcwd()}{after}")
        last_record = time.monotonic()

        def tick() -> None:
            nonlocal last_record
            if idle > 0:
                app.shutdown_no_activity()
            if time.monotonic() - last_record >= min(60, max(idle, 1)):
                last_record = time.monotonic()
                quiet = (datetime.now(UTC) - app.web_app.last_activity()).total_seconds()
                log_metrics(**{PORT_METRIC: port, IDLE_METRIC: int(quiet)})

        every = max(1, min(60, idle // 4)) if idle > 0 else 60
        PeriodicCallback(tick, every * 1000).start()
        app.start()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    _say("the notebook server has stopped")
    return 0
