"""Runs on the user's machine: a server job (TensorBoard, JupyterLab) forwarded here at its
usual port, or at any free one where that is taken; and SIGTERM/SIGHUP taken as Ctrl-C by
the commands that stay in the foreground forwarding."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gpuhop.client import GpuhopError

if TYPE_CHECKING:
    from gpuhop.client.forward import ErrorHandler, Forward


class Forwardable(Protocol):
    def forward(self, local_port: int = 0, *, on_error: ErrorHandler | None = None) -> Forward: ...


def forward_at(
    server: Forwardable, usual: int, local_port: int | None, on_error: ErrorHandler
) -> Forward:
    """`server` forwarded to `local_port`; by default to `usual`, or any port if it is taken."""
    if local_port is not None:
        return server.forward(local_port, on_error=on_error)
    try:
        return server.forward(usual, on_error=on_error)
    except GpuhopError as e:
        if e.code != "local_port":
            raise
        return server.forward(0, on_error=on_error)


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
