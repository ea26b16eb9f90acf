"""Runs on the user's machine: notebook jobs. `start` queues a JupyterLab server as a job
(`python -m gpuhop.runtime.notebook serve` in the job's Python, its work dir synced from
here), `find` finds the user's running one again, and a `Notebook` waits for its server and
forwards it here. `batch_command` turns `NOTEBOOK.ipynb -p NAME=VALUE...` into the command
of a job that runs the notebook top to bottom.

The server's token is made here, sent to the job in its environment (`JUPYTER_TOKEN`, the
job's spec, which only its owner and admins see), and read back from there when a later
`gpuhop notebook` re-attaches, on this machine or another. The job never prints it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhop.api.states import JobState
from gpuhop.client.errors import GpuhopError
from gpuhop.client.job import Job, get
from gpuhop.client.jobs import list_jobs, submit
from gpuhop.client.session import Session, quote

if TYPE_CHECKING:
    from gpuhop.api import JobInfo
    from gpuhop.api.spec import JobSpec
    from gpuhop.client.forward import ErrorHandler, Forward

# What the job runs; keep in step with gpuhop.runtime.notebook (the client never imports it).
RUNNER = ["-m", "gpuhop.runtime.notebook"]
SERVE = [*RUNNER, "serve"]
TOKEN_ENV = "JUPYTER_TOKEN"
PORT_METRIC = "notebook_port"
IDLE_METRIC = "idle_s"
DEFAULT_IDLE = 2 * 3600
ACTIVE = (JobState.queued, JobState.starting, JobState.running)


def is_notebook(info: JobInfo) -> bool:
    """Whether the job is a notebook server from `gpuhop notebook`."""
    return info.command[: len(SERVE)] == SERVE


class Notebook:
    """A notebook server job: its token, its port once it listens, and a forward here."""

    def __init__(self, job: Job):
        if not is_notebook(job.info):
            raise GpuhopError(
                f"job {job.id} is not a notebook server (its command is"
                f" {' '.join(job.info.command)!r}); start one with gpuhop notebook",
                code="bad_request",
            )
        self.job = job

    def __repr__(self) -> str:
        return f"Notebook(job={self.job.id!r}, state={self.job.state.value!r})"

    @property
    def token(self) -> str:
        token = self.job.info.env.get(TOKEN_ENV)
        if not token:
            raise GpuhopError(
                f"notebook job {self.job.id} has no token in its spec", code="bad_request"
            )
        return token

    def port(self) -> int | None:
        """The server's port on the GPU host's loopback, once it has said (else None)."""
        found = _port_in(self.job.info.latest_metrics)
        offset = 0
        while found is None:
            records, offset_after = self.job.metrics(offset)
            found = next((p for r in records if (p := _port_in(r)) is not None), None)
            if offset_after == offset:
                break
            offset = offset_after
        return found

    @property
    def idle_seconds(self) -> int | None:
        """How long the server had been idle when it last said (about once a minute)."""
        value = (self.job.info.latest_metrics or {}).get(IDLE_METRIC)
        return value if isinstance(value, int) else None

    def wait_ready(
        self, timeout: float | None = None, on_queued: Callable[[JobInfo], None] | None = None
    ) -> int:
        """Block until the server answers; its port. While the job waits for GPUs this waits
        too (`on_queued` hears of it once). GpuhopError, with the end of its log, if the job
        ends first, or once running for `timeout` seconds without answering."""
        delay, told, deadline = 0.05, False, None
        while True:
            info = self.job.refresh()
            if info.state.finished:
                raise GpuhopError(self._ended(info), code="server_ended")
            if info.state == JobState.queued and not told and on_queued is not None:
                on_queued(info)
                told = True
            if info.state == JobState.running:
                if timeout is not None and deadline is None:
                    deadline = time.monotonic() + timeout
                port = self.port()
                if port is not None:
                    try:
                        self.job.session.request(
                            "GET", f"/v1/jobs/{quote(self.job.id)}/ports/{port}"
                        )
                        return port
                    except GpuhopError as e:
                        # Not listening yet, or it just ended (next round says how); any
                        # other refusal (a job on a Ray cluster cannot be forwarded) stands.
                        ended = e.code == "conflict" and "state" in e.detail
                        if e.code != "not_listening" and not ended:
                            raise
            if deadline is not None and time.monotonic() > deadline:
                raise GpuhopError(
                    f"the notebook server (job {self.job.id}) does not answer after"
                    f" {timeout:.0f}s; see gpuhop logs {self.job.id}",
                    code="timeout",
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def forward(
        self,
        local_port: int = 0,
        host: str = "127.0.0.1",
        on_error: ErrorHandler | None = None,
        unix: str | os.PathLike[str] | None = None,
    ) -> Forward:
        """The server at `host`:`local_port` here (0: any free port); see `Job.forward`.
        Call `wait_ready` first."""
        port = self.port()
        if port is None:
            raise GpuhopError(
                f"the notebook server (job {self.job.id}) has not started listening yet",
                code="not_listening",
            )
        return self.job.forward(port, local_port, host, on_error=on_error, unix=unix)

    def url(self, base: str, path: str = "lab") -> str:
        """The URL, with the token, of `path` on the server forwarded to `base`."""
        return f"{base.rstrip('/')}/{path}?token={self.token}"

    def _ended(self, info: JobInfo) -> str:
        tail = b"".join(self.job.logs()).decode(errors="replace").strip().splitlines()[-8:]
        said = ("; its log ends:\n  " + "\n  ".join(tail)) if tail else ""
        return f"the notebook server (job {self.job.id}) {info.state.said} ({info.reason}){said}"


def _port_in(record: dict[str, object] | None) -> int | None:
    value = (record or {}).get(PORT_METRIC)
    return value if isinstance(value, int) and 0 < value < 65536 else None


def start(
    session: Session,
    spec: JobSpec,
    *,
    workdir: str | os.PathLike[str] = ".",
    idle: int = DEFAULT_IDLE,
    on_upload: Callable[[int, int], None] | None = None,
) -> Notebook:
    """Queue a JupyterLab server job in `workdir` (synced) as `spec` asks (see
    `Client.submit`); returns at once. `idle`: seconds after which idle kernels stop, and
    then the server (0: never)."""
    from secrets import token_urlsafe

    if idle < 0:
        raise GpuhopError(f"idle must be 0 (never) or more seconds, not {idle}", "bad_request")
    job = submit(
        session,
        [*SERVE, "--idle", str(idle)],
        spec.replace(env={**spec.env, TOKEN_ENV: token_urlsafe(32)}),
        workdir=workdir,
        on_upload=on_upload,
    )
    return Notebook(job)


def find(session: Session, ref: str | None = None) -> Notebook | None:
    """The notebook job `ref` names (id, prefix or name; GpuhopError if it is no notebook),
    or without `ref` the newest of the caller's notebook jobs that is queued or running."""
    if ref is not None:
        return Notebook(get(session, ref))
    for info in list_jobs(session, ACTIVE):
        if is_notebook(info):
            return Notebook(Job(session, info))
    return None


def batch_command(argv: Sequence[str], workdir: str | os.PathLike[str]) -> list[str]:
    """The job command that runs `NOTEBOOK.ipynb [-p NAME=VALUE]...` top to bottom."""
    head, rest = argv[0], list(argv[1:])
    root = Path(workdir).absolute()
    full = Path(head) if Path(head).is_absolute() else root / head
    if not full.is_file():
        raise GpuhopError(f"no such notebook: {head}", code="bad_request")
    try:
        rel = full.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise GpuhopError(
            f"{head} is outside the work dir {root}; run gpuhop from a directory that contains it",
            code="bad_request",
        ) from None
    for i in range(0, len(rest), 2):
        flag, pair = rest[i], rest[i + 1] if i + 1 < len(rest) else ""
        name, sep, _ = pair.partition("=")
        if flag not in ("-p", "--parameter") or not sep or not name.isidentifier():
            raise GpuhopError(
                "after the notebook, gpuhop run takes its own options and parameters: -p"
                f" NAME=VALUE (NAME a Python identifier); got {' '.join(rest[i : i + 2])!r}",
                code="bad_request",
            )
    return [*RUNNER, "run", rel, *rest]
