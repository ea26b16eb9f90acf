"""Runs on the user's machine: `gpuhop tensorboard JOB`, a job's TensorBoard logs, served by
TensorBoard next to the GPU and opened here."""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

import typer

from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import escape, fail, say, state_text
from gpuhop.cli.usualport import forward_at, interrupt
from gpuhop.client import GpuhopError

if TYPE_CHECKING:
    pass

DEFAULT_LOCAL_PORT = 6006
HOW_TO_LOG = (
    "tf.keras.callbacks.TensorBoard(log_dir='logs/fit') writes them in the work dir,"
    " callbacks=gpuhop.tf.callbacks(tensorboard=True) into $GPUHOP_TENSORBOARD_DIR"
)


def tensorboard(
    job_ref: str = typer.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    local_port: int | None = typer.Option(
        None,
        "--local-port",
        min=0,
        max=65535,
        help=f"The port to listen on here (default: {DEFAULT_LOCAL_PORT} if free, else any;"
        " 0 for any free one).",
    ),
    no_browser: bool = typer.Option(
        False, "--no-browser", help="Print the URL only; do not open a browser."
    ),
    keep: bool = typer.Option(
        False, "--keep", help="Leave the TensorBoard job running after Ctrl-C (for next time)."
    ),
    timeout: float = typer.Option(
        120,
        "--start-timeout",
        min=1,
        help="Seconds to wait for TensorBoard to answer (--timeout is a job's time limit).",
    ),
    on: str | None = OnOption,
) -> None:
    """Show a job's TensorBoard logs in your browser, live while it trains.

    The job writes TensorBoard event files anywhere in its work dir, as tutorials do
    (tf.keras.callbacks.TensorBoard(log_dir="logs/fit/...")), or into $GPUHOP_TENSORBOARD_DIR
    (the tensorboard/ dir of its artifacts; gpuhop.tf.callbacks(tensorboard=True) does):
    TensorBoard reads both, each run named by its path there. TensorBoard runs
    on the GPU host as a job of its own, holding no GPU, in a private network that nothing
    else reaches; this command forwards it here through the agent's connection and opens
    it. A TensorBoard already running for the job is reused. Ctrl-C stops forwarding and
    the TensorBoard job this command started (unless --keep).

    Example: gpuhop tensorboard train
    """
    from gpuhop.client import tensorboard as tb_client

    # A closed terminal (SIGHUP) or a kill (SIGTERM) cleans up as Ctrl-C does.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    with client_for(on) as client:
        try:
            tb = tb_client.start(client, job_ref, wait=False)
        except GpuhopError as e:
            fail(e.message)
        info = tb.info
        started = not info.reused
        where = "its work dir and $GPUHOP_TENSORBOARD_DIR" if len(info.logdirs) > 1 else info.logdir
        say(
            f"TensorBoard job {info.job} {'started' if started else 'already runs'} for job"
            f" {info.source_job} ({info.source_state.value}), reading {escape(where)}"
        )
        if not info.has_events:
            later = (
                "" if info.source_state.finished else " yet; it shows them once the job writes some"
            )
            say(f"[yellow]no TensorBoard event files there{later}[/yellow] ({HOW_TO_LOG})")

        def stop_server() -> None:
            if not started or keep:
                say(f"TensorBoard job {info.job} keeps running; gpuhop cancel {info.job} stops it")
                return
            try:
                ended = tb.stop()
            except (GpuhopError, TimeoutError) as e:
                say(f"[yellow]could not stop TensorBoard job {info.job}: {e}[/yellow]")
                return
            say(f"TensorBoard job {info.job} {state_text(ended.state)}")

        def refused(e: GpuhopError) -> None:
            say(f"[yellow]a connection was refused: {e.message}[/yellow]")

        try:
            tb.wait_ready(timeout)
            fwd = forward_at(tb, DEFAULT_LOCAL_PORT, local_port, refused)
        except GpuhopError as e:
            stop_server()
            fail(e.message)
        except KeyboardInterrupt:
            stop_server()
            raise typer.Exit(130) from None
        interrupted = False
        with fwd:
            say(f"TensorBoard for job {info.source_job} at {fwd.url} (Ctrl-C to stop)")
            sys.stdout.write(fwd.url + "\n")
            sys.stdout.flush()
            if not no_browser:
                open_browser(fwd.url)
            try:
                fwd.wait()
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            say("stopped forwarding")
            stop_server()
            return
        ended = fwd.ended
        reason = f": {ended.reason}" if ended is not None and ended.reason else ""
        fail(f"TensorBoard job {info.job} ended{reason}; see gpuhop logs {info.job}", code=1)


def open_browser(url: str) -> None:
    # Without a display, Python's webbrowser would start a text browser in this terminal.
    graphical = sys.platform in ("darwin", "win32") or any(
        os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY")
    )
    import webbrowser

    if not graphical or not webbrowser.open(url):
        say(f"open {url} in your browser")


def register(app: typer.Typer) -> None:
    app.command()(tensorboard)
