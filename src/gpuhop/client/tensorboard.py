"""Runs on the user's machine: TensorBoard for a job, run next to the GPU, reached from here.

    tb = client.job("train").tensorboard()     # starts a server (or finds it) and waits
    with tb.forward() as fwd:                  # fwd.url: http://127.0.0.1:<port>
        fwd.wait()
    tb.stop()

The server is a job of its own on the agent (see `gpuhop.agent.services.tensorboard`),
listening only inside its private network; `forward` reaches it through the agent's
connection with this client's credentials, like `Job.forward`. The `TensorBoard` handle
lives beside `Job` (in `gpuhop.client.job`), as each leads to the other.
"""

from __future__ import annotations

from gpuhop.client.job import TensorBoard
from gpuhop.client.session import Connected, Session, session_of

__all__ = ["TensorBoard", "find", "start"]


def start(
    client: Session | Connected, ref: str, wait: bool = True, timeout: float = 120.0
) -> TensorBoard:
    """A TensorBoard server for the job `ref` names: the one already running for it, or a
    new one. With `wait`, return once it answers (see `TensorBoard.wait_ready`)."""
    return TensorBoard.start(session_of(client), ref, wait=wait, timeout=timeout)


def find(client: Session | Connected, ref: str) -> TensorBoard:
    """The TensorBoard server that runs for the job `ref` names (GpuhopError 404 if none)."""
    return TensorBoard.find(session_of(client), ref)
