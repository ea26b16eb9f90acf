"""Runs on the user's machine: `Job`, a handle on one job of an agent (state, logs, metrics,
artifacts, cancel, port forwarding), and `TensorBoard`, a handle on the TensorBoard server
job of one job.

The two refer to each other (a job's TensorBoard, the TensorBoard's own job), so they
live in one module; `gpuhop.client.tensorboard` is where the CLI finds TensorBoard.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuhop.api.states import JobState
from gpuhop.client.errors import GpuhopError
from gpuhop.client.pull import PullPlan, fetch_planned, plan_pull
from gpuhop.client.session import Connected, Session, quote, session_of
from gpuhop.client.transport.unixhttp import Timeout

if TYPE_CHECKING:
    from gpuhop.api import (
        ArtifactEntry,
        JobDiff,
        JobInfo,
        JobProfile,
        JobStacks,
        TensorBoardInfo,
        WorkdirEntry,
    )
    from gpuhop.client.forward import ErrorHandler, Forward

# How long a follower keeps trying to reconnect to an agent that went away.
RECONNECT_PATIENCE = 30.0
# How long past a profile's duration the agent may take to answer: the job stops its
# profiler and writes the trace (agent.services.profiling.WRITE_GRACE), and then some.
PROFILE_GRACE = 120.0


class Job:
    """A handle on one job. `info` is the state as last fetched; `refresh()` fetches again.

    The handle keeps the agent's JSON (`data`) and builds the `JobInfo` model from it on
    first use of `info`: the CLI's `ps`, `show`, `logs` and `cancel` read `data` and the
    `*_json` calls, and never load pydantic. Each `*_json` call is the request its model
    twin makes (which is built on it), returning the JSON as it came.
    """

    def __init__(self, client: Session | Connected, info: JobInfo | dict[str, Any]):
        self.session = session_of(client)  # a Client, or the session it talks through
        self._data: dict[str, Any] | None = info if isinstance(info, dict) else None
        self._info: JobInfo | None = None if isinstance(info, dict) else info

    def __repr__(self) -> str:
        return f"Job({self.id!r}, state={self.state.value!r})"

    @property
    def data(self) -> dict[str, Any]:
        """The job as the agent last sent it: its JSON (`JobInfo`'s fields), no model built."""
        if self._data is None:
            assert self._info is not None
            self._data = self._info.model_dump(mode="json")
        return self._data

    @property
    def info(self) -> JobInfo:
        """The job as last fetched, as a `JobInfo` (built from `data` on first use)."""
        if self._info is None:
            from gpuhop.api.models import JobInfo  # pydantic: only for those who ask

            self._info = JobInfo.model_validate(self._data)
        return self._info

    def _update(self, data: dict[str, Any]) -> dict[str, Any]:
        self._data, self._info = data, None
        return data

    @property
    def id(self) -> str:
        return str(self.data["id"]) if self._info is None else self._info.id

    @property
    def state(self) -> JobState:
        return JobState(self.data["state"]) if self._info is None else self._info.state

    def refresh(self) -> JobInfo:
        self.refresh_json()
        return self.info

    def refresh_json(self) -> dict[str, Any]:
        """`refresh`, returning the agent's JSON."""
        return self._update(fetch_json(self.session, self.id))

    def wait(self, timeout: float | None = None) -> JobInfo:
        """Block until the job has ended; return its final info. Raises TimeoutError."""
        self.wait_json(timeout)
        return self.info

    def wait_json(self, timeout: float | None = None) -> dict[str, Any]:
        """`wait`, returning the agent's JSON."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        # The answer that says the job ended is the one returned: `data` may have been
        # replaced meanwhile by another thread's refresh, sent before the end.
        while not JobState((data := self.refresh_json())["state"]).finished:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {self.state.value} after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        return data

    def cancel(self, grace: float = 10.0) -> JobInfo:
        """Stop the job: SIGTERM to its processes, SIGKILL after `grace` seconds."""
        self.cancel_json(grace)
        return self.info

    def cancel_json(self, grace: float = 10.0) -> dict[str, Any]:
        """`cancel`, returning the agent's JSON."""
        response = self.session.request(
            "POST", f"/v1/jobs/{self.id}/cancel", params={"grace": grace}
        )
        return self._update(response.json())

    def requeue(self, priority: int) -> JobInfo:
        """Give the queued job a new priority (higher starts first; above the default is
        an admin's call on a team agent)."""
        response = self.session.request(
            "POST", f"/v1/jobs/{self.id}/requeue", json={"priority": priority}
        )
        self._update(response.json())
        return self.info

    def forward(
        self,
        remote_port: int,
        local_port: int = 0,
        host: str = "127.0.0.1",
        *,
        on_error: Callable[[GpuhopError], None] | None = None,
        unix: str | os.PathLike[str] | None = None,
    ) -> Forward:
        """Make `remote_port`, where the job listens on the GPU host's loopback, reachable
        at `host`:`local_port` here (0: any free port; see `.local_port`), through the
        agent's API with this client's credentials. Raises GpuhopError at once if the job
        is not running or nothing answers on the port. Close the returned `Forward` (or use
        it as a context manager); it closes itself when the job ends. `on_error` hears of
        connections the agent refused later (say, the job stopped listening).

        Every local user who reaches a TCP port here is served with these credentials (as
        with `ssh -L`). On a machine shared with others, give `unix=PATH` instead: a Unix
        socket of mode 0600, which only this user's processes can connect to.
        """
        from gpuhop.client.forward import Forward  # websockets and asyncio: on demand

        return Forward(self, remote_port, local_port, host, on_error, unix)

    def tensorboard(self, wait: bool = True, timeout: float = 120.0) -> TensorBoard:
        """TensorBoard over this job's `$GPUHOP_TENSORBOARD_DIR`, run on the GPU host: the
        server already running for this job, or a new one (a job of its own, holding no
        GPU). With `wait`, returns once it answers; `.forward()` brings it here."""
        return TensorBoard.start(self.session, self.id, wait=wait, timeout=timeout)

    def logs(
        self, follow: bool = False, offset: int = 0, worker: int | None = None
    ) -> Iterator[bytes]:
        """The job's output as raw chunks, from byte `offset` (of one worker's own log,
        with `worker`; the job's log has every worker's lines, prefixed).

        With `follow`, keeps streaming until the job has ended; a dropped connection or an
        agent restart is resumed from the last byte received, so nothing is lost or repeated.
        """
        position = offset
        give_up_at: float | None = None
        while True:
            try:
                with self.session.stream(
                    "GET",
                    f"/v1/jobs/{self.id}/log",
                    params={
                        "offset": position,
                        "follow": follow,
                        **({"worker": worker} if worker is not None else {}),
                    },
                    timeout=Timeout(None, connect=5.0),
                ) as response:
                    for chunk in response.iter_raw():
                        position += len(chunk)
                        give_up_at = None
                        yield chunk
                return
            except self.session.transport_errors as e:
                if not follow:
                    raise GpuhopError(
                        f"lost the agent while reading logs: {e}", "unreachable"
                    ) from None
                now = time.monotonic()
                give_up_at = give_up_at or now + RECONNECT_PATIENCE
                if now > give_up_at:
                    raise GpuhopError(
                        f"lost the agent while following job {self.id} and could not reconnect"
                        f" for {RECONNECT_PATIENCE:.0f}s",
                        code="unreachable",
                    ) from None
                # Probe first: no reconnect attempts against an agent that is not there.
                while not self.session.endpoint.reachable() and time.monotonic() < give_up_at:
                    time.sleep(0.1)

    def metrics(self, offset: int = 0, progress: bool = False) -> tuple[list[dict], int]:
        """Metric records written since byte `offset`, and the offset to ask from next.
        With `progress`, also the records that only say where a Keras `fit` is within its
        epoch (`{"progress": 1, "epoch_step": ..., "eta": ...}`: what `gpuhop run` shows)."""
        data = self.session.request(
            "GET", f"/v1/jobs/{self.id}/metrics", params={"offset": offset}
        ).json()
        records = data["records"]
        if not progress:
            records = [r for r in records if "progress" not in r]
        return records, data["next_offset"]

    def artifacts(self) -> list[ArtifactEntry]:
        from gpuhop.api import ArtifactEntry

        response = self.session.request("GET", f"/v1/jobs/{self.id}/artifacts")
        return [ArtifactEntry.model_validate(a) for a in response.json()]

    def stacks(self, worker: int | None = None, native: bool = False) -> JobStacks:
        """Every Python thread's stack in the running job's processes now (py-spy dump on
        the agent's host); only worker `worker`'s with a worker; with `native`, the C/C++
        frames of native extensions too."""
        from gpuhop.api import JobStacks

        return JobStacks.model_validate(self.stacks_json(worker, native))

    def stacks_json(self, worker: int | None = None, native: bool = False) -> dict[str, Any]:
        params: dict[str, Any] = {"native": "true" if native else "false"}
        if worker is not None:
            params["worker"] = worker
        data: dict[str, Any] = self.session.request(
            "GET", f"/v1/jobs/{self.id}/stacks", params=params
        ).json()
        return data

    def profile(self, seconds: float = 5.0, worker: int | None = None) -> JobProfile:
        """Profile the running job for `seconds`: TensorFlow's (or JAX's) profiler inside
        its processes, into its TensorBoard dir (`gpuhop tensorboard` shows it under the
        Profile tab), or, for plain Python, py-spy's flame graphs among its artifacts. Only
        worker `worker`'s processes with a worker. Returns once the files are written."""
        from gpuhop.api import JobProfile

        return JobProfile.model_validate(self.profile_json(seconds, worker))

    def profile_json(self, seconds: float = 5.0, worker: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"seconds": seconds}
        if worker is not None:
            params["worker"] = worker
        # The agent answers after the capture and the trace's writing (within PROFILE_GRACE).
        data: dict[str, Any] = self.session.request(
            "POST",
            f"/v1/jobs/{self.id}/profile",
            params=params,
            timeout=Timeout(seconds + PROFILE_GRACE, connect=5.0),
        ).json()
        return data

    def provenance_json(self) -> dict[str, Any]:
        """What the job ran on, as the agent's JSON: its interpreter, platform, packages
        (`packages`, and their `packages_digest`), TensorFlow's build, GPUs and driver,
        gpuhop's version and the tree (`recorded`: whether the job wrote its half)."""
        data: dict[str, Any] = self.session.request("GET", f"/v1/jobs/{self.id}/provenance").json()
        return data

    def diff(self, other: str) -> JobDiff:
        """What changed from this job to job `other` (id, prefix or name): files,
        packages, options, and what they ran on."""
        from gpuhop.api import JobDiff

        return JobDiff.model_validate(self.diff_json(other))

    def diff_json(self, other: str) -> dict[str, Any]:
        data: dict[str, Any] = self.session.request(
            "GET", f"/v1/jobs/{self.id}/diff", params={"other": other}
        ).json()
        return data

    def workdir_outputs(self) -> list[WorkdirEntry]:
        """The files the job created or changed in its work dir (not the synced sources)."""
        from gpuhop.api import WorkdirEntry

        response = self.session.request("GET", f"/v1/jobs/{self.id}/workdir")
        return [WorkdirEntry.model_validate(e) for e in response.json()]

    def plan_pull(
        self,
        dest: str | os.PathLike[str] | None,
        workdir: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        tmp: str | os.PathLike[str] | None = None,
    ) -> PullPlan:
        """What `pull` would fetch, without fetching it (see `pull`)."""
        return plan_pull(self.session, self.id, dest, workdir, overwrite, tmp)

    def pull(
        self,
        dest: str | os.PathLike[str] | None,
        on_file: Callable[[ArtifactEntry], None] | None = None,
        on_bytes: Callable[[int, int], None] | None = None,
        *,
        workdir: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        plan: PullPlan | None = None,
        tmp: str | os.PathLike[str] | None = None,
    ) -> list[Path]:
        """Download the job's artifacts into `dest` (None: not them) and, with `workdir`,
        the files the job created or changed in its work dir into `workdir` (say "." for
        where they would be had the script run here). Unchanged files are not fetched
        again. A local work-dir file that differs from what was synced is kept, not
        overwritten (`plan_pull(...).kept` lists them), unless `overwrite`. A `dest` that
        was new or empty gets a `.gpuhopignore` that leaves it out of the next sync (see
        `gpuhop.client.pull`). With `tmp`, the files an ended job left in its /tmp (kept
        with its files) go into `tmp`.

        `on_file(entry)` is called after each file fetched, and `on_bytes(done, total)` as
        bytes arrive, `total` being what is fetched (unchanged files are not counted).
        Give `plan` (from `plan_pull`) to fetch what it lists.
        """
        if plan is None:
            plan = plan_pull(self.session, self.id, dest, workdir, overwrite, tmp)
        return fetch_planned(self.session, plan, on_file, on_bytes)


class TensorBoard:
    """A TensorBoard server job for one job's logs. `info` is as last fetched."""

    def __init__(self, client: Session | Connected, info: TensorBoardInfo):
        self.session = session_of(client)  # a Client, or the session it talks through
        self.info = info

    def __repr__(self) -> str:
        return f"TensorBoard(job={self.info.job!r}, for={self.info.source_job!r})"

    @classmethod
    def start(
        cls, session: Session, ref: str, wait: bool = True, timeout: float = 120.0
    ) -> TensorBoard:
        """The server for the job `ref` names: the one already running for it, or a new
        one. With `wait`, return once it answers (see `wait_ready`)."""
        from gpuhop.api import TensorBoardInfo

        response = session.request("POST", job_url(ref, "/tensorboard"))
        tb = cls(session, TensorBoardInfo.model_validate(response.json()))
        if wait:
            tb.wait_ready(timeout)
        return tb

    @classmethod
    def find(cls, session: Session, ref: str) -> TensorBoard:
        """The server that runs for the job `ref` names (GpuhopError 404 if none)."""
        from gpuhop.api import TensorBoardInfo

        response = session.request("GET", job_url(ref, "/tensorboard"))
        return cls(session, TensorBoardInfo.model_validate(response.json()))

    @property
    def job(self) -> Job:
        """The server's own job (ps, logs and cancel apply to it)."""
        return get(self.session, self.info.job)

    def refresh(self) -> TensorBoardInfo:
        self.info = self.find(self.session, self.info.source_job).info
        return self.info

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until TensorBoard answers. Raise GpuhopError (with the end of its log) if
        its job ends first, or after `timeout` seconds."""
        job = self.job
        check = f"/v1/jobs/{quote(job.id)}/ports/{self.info.port}"
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            info = job.refresh()
            if info.state.finished:
                raise GpuhopError(self._ended(job, info), code="server_ended")
            if info.state == JobState.running:
                try:
                    self.session.request("GET", check)
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
        return f"TensorBoard (job {job.id}) {info.state.said} ({info.reason}){said}"


def job_url(ref: str, tail: str = "") -> str:
    """The agent's URL of the job `ref` names (id, unique id prefix, or name), and `tail`.
    An empty ref names no job, said here: the agent would take `/v1/jobs/` for the list."""
    if not ref:
        raise GpuhopError(
            "no job matches '' (an empty job reference): give a job's id, a prefix of it, or"
            " its name (`gpuhop ps` lists them)",
            code="not_found",
            status=404,
        )
    if "/" in ref:  # in no id or name; the agent would read it as its path's separator
        raise GpuhopError(f"no job matches {ref!r}", code="not_found", status=404)
    return f"/v1/jobs/{quote(ref)}{tail}"


def fetch_json(session: Session, ref: str) -> dict[str, Any]:
    """The job `ref` names (id, unique id prefix, or name), as the agent's JSON."""
    data: dict[str, Any] = session.request("GET", job_url(ref)).json()
    return data


def get(session: Session, ref: str) -> Job:
    """A handle on the job `ref` names."""
    return Job(session, fetch_json(session, ref))
