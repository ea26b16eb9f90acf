"""Runs on the user's machine: `gpuhop ui`, the agent's web dashboard opened in a browser."""

from __future__ import annotations

import signal
import sys
import threading
import webbrowser
from collections.abc import Callable

import typer

from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import fail, say
from gpuhop.client import GpuhopError


def ui(
    port: int = typer.Option(
        0,
        "--port",
        min=0,
        max=65535,
        help="The port to serve the dashboard on, on 127.0.0.1 (default: any free one).",
    ),
    no_browser: bool = typer.Option(
        False, "--no-browser", help="Print the login link only; open no browser."
    ),
    on: str | None = OnOption,
) -> None:
    """Open the agent's web dashboard: jobs, live logs and metric charts, GPUs.

    Serves it on 127.0.0.1 through the agent's own connection (the local socket, the SSH
    tunnel, or TLS and token: nothing is opened on the GPU host), and opens a one-time
    login link in the browser. The link works once, within a minute; in a terminal, press
    Enter for a new one. Runs until Ctrl-C.

    Example: gpuhop ui --on lab
    """
    with client_for(on) as client:
        try:
            dashboard = client.dashboard(port)
        except GpuhopError as e:
            fail(e.message)
        with dashboard:
            try:
                link = dashboard.login_url()
            except GpuhopError as e:
                fail(e.message)
            say(f"dashboard of {client.endpoint.description} at {dashboard.url} (Ctrl-C to stop)")
            say("log in with this link (it works once, within a minute):")
            print(link, flush=True)
            if not no_browser and not webbrowser.open(link):
                say("found no browser to open; open the link above in one")
            signal.signal(signal.SIGTERM, _interrupt)  # a `kill` closes cleanly too
            try:
                _serve(dashboard.login_url)
            except KeyboardInterrupt:
                pass
            except GpuhopError as e:
                fail(e.message)
        say("stopped the dashboard")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _serve(new_link: Callable[[], str]) -> None:
    """Wait for Ctrl-C; in a terminal, each Enter prints a fresh login link."""
    if not sys.stdin.isatty():
        threading.Event().wait()
    say("press Enter for a new login link")
    for _ in sys.stdin:
        print(new_link(), flush=True)
    threading.Event().wait()  # stdin closed: keep serving until Ctrl-C


def register(app: typer.Typer) -> None:
    app.command()(ui)
