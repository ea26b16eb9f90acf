"""Runs on the user's machine: TensorBoard for a job, run next to the GPU, reached from here.

    tb = client.job("train").tensorboard()     # starts a server (or finds it) and waits
    with tb.forward() as fwd:                  # fwd.url: http://127.0.0.1:<port>
        fwd.wait()
    tb.stop()

The server is a job of its own on the agent (see `gpuhop.agent.services.tensorboard`),
listening only inside its private network; `forward` reaches it through the agent's
connection with this client's credentials, like `Job.forward`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING
from urllib.parse import quote

from gpuhop.api import JobInfo, JobState, TensorBoardInfo
from gpuhop.client.errors import GpuhopError

if TYPE_CHECKING:
    from gpuhop.client.client import Client
    from gpuhop.client.forward import ErrorHandler, Forward
    from gpuhop.client.job import Job


class TensorBoard:
    """A TensorBoard server job for one job's logs. `info` is as last fetched."""

    def __init__(self, client: Client, info: TensorBoardInfo):
        self.client = client
        self.info = info

    def __repr__(self) -> str:
        return f"TensorBoard(job={self.info.job!r}, for={self.info.source_job!r})"

    @property
    def job(self) -> Job:
        """The server's own job (ps, logs and cancel apply to it)."""
        return self.client.job(self.info.job)

    def refresh(self) -> TensorBoardInfo:
        self.info = find(self.client, self.info.source_job).info
        return self.info

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until TensorBoard answers. Raise GpuhopError (with the end of its log) if
        its job ends first, or after `timeout` seconds."""
        job = self.job
        check = f"/v1/jobs/{quote(job.id, safe='')}/ports/{self.info.port}"
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            info = job.refresh()
            if info.state.finished:
                raise GpuhopError(self._ended(job, info), code="server_ended")
            if info.state == JobState.running:
                try:
                    self.client._request("GET", check)
                    return
                except GpuhopError as e:
                    if e.code != "not_listening":
                        raise
            if time.monotonic() > deadline:
                raise GpuhopError(
                    f"TensorBoard (job {job.id}) is still {info.state.value} and does not"
                    f" answer after {timeout:.0f}s; see gpuhop logs {job.id}",
                    code="timeout",
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def forward(
        self, local_port: int = 0, host: str = "127.0.0.1", on_error: ErrorHandler | None = None
    ) -> Forward:
        """TensorBoard at `host`:`local_port` here (0: any free port); see `Job.forward`."""
        return self.job.forward(self.info.port, local_port, host, on_error=on_error)

    def stop(self, grace: float = 5.0) -> JobInfo:
        """Cancel the server's job (if it still runs) and wait for it to end."""
        job = self.job
        if not job.state.finished:
            job.cancel(grace=grace)
        return job.wait(timeout=grace + 30)

    @staticmethod
    def _ended(job: Job, info: JobInfo) -> str:
        tail = b"".join(job.logs()).decode(errors="replace").strip().splitlines()[-5:]
        said = ("; its log ends:\n  " + "\n  ".join(tail)) if tail else ""
        return f"TensorBoard (job {job.id}) has {info.state.value}: {info.reason}{said}"


def start(client: Client, ref: str, wait: bool = True, timeout: float = 120.0) -> TensorBoard:
    """A TensorBoard server for the job `ref` names: the one already running for it, or a
    new one. With `wait`, return once it answers (see `TensorBoard.wait_ready`)."""
    response = client._request("POST", f"/v1/jobs/{quote(ref, safe='')}/tensorboard")
    tb = TensorBoard(client, TensorBoardInfo.model_validate(response.json()))
    if wait:
        tb.wait_ready(timeout)
    return tb


def find(client: Client, ref: str) -> TensorBoard:
    """The TensorBoard server that runs for the job `ref` names (GpuhopError 404 if none)."""
    response = client._request("GET", f"/v1/jobs/{quote(ref, safe='')}/tensorboard")
    return TensorBoard(client, TensorBoardInfo.model_validate(response.json()))
