"""Runs on the user's machine: start, find and stop TensorFlow servers on the GPU host.

A TensorFlow server is an ordinary job (it holds its GPUs, shows in `gpuhop ps`, ends with
`gpuhop cancel`) whose work dir is one entry script that runs `gpuhop.tf.server` with the
host's own gpuhop, in a private network namespace. What marks a job as one is the
script's name as its command; the port it serves on is in its arguments.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuhop.api import JobInfo, JobState
from gpuhop.client.errors import GpuhopError
from gpuhop.client.job import Job, get
from gpuhop.client.jobs import check, list_jobs, spec_of, submit
from gpuhop.client.session import Connected, Session, session_of

if TYPE_CHECKING:
    from gpuhop.api.spec import JobSpec

# The port the server listens on inside its job's private network: always passed to it as
# `--port`, so the client never needs the job side's own default.
DEFAULT_PORT = 2222
SCRIPT = "gpuhop_tfserver.py"
SCRIPT_TEXT = "from gpuhop.tf.server import main\n\nraise SystemExit(main())\n"
DEFAULT_NAME = "tf-server"
ACTIVE = [JobState.queued, JobState.starting, JobState.running]


def is_tf_server(info: JobInfo) -> bool:
    return bool(info.command) and info.command[0] == SCRIPT


def port_of(info: JobInfo) -> int:
    """The port the server listens on inside its job's private network."""
    args = info.command[1:]
    for flag, value in itertools.pairwise(args):
        if flag == "--port" and value.isdigit():
            return int(value)
    return DEFAULT_PORT


def list_servers(client: Session | Connected) -> list[JobInfo]:
    """The TensorFlow servers that are queued, starting or running, newest first."""
    return [j for j in list_jobs(session_of(client), states=ACTIVE) if is_tf_server(j)]


def start(
    client: Session | Connected,
    spec: JobSpec | None = None,
    *,
    name: str = DEFAULT_NAME,
    port: int = DEFAULT_PORT,
    wait: bool = True,
    timeout: float = 300.0,
    **options: Any,
) -> Job:
    """Start a TensorFlow server job named `name` as `spec` and `options` ask (as for
    `Client.submit`: `gpus`, or a `gpu_memory` share of one, ...). It runs the host's own
    gpuhop, so it takes no requirements, in a private network. With `wait`, return once it
    answers (see `wait_ready`)."""
    spec = spec_of(".", spec, {**options, "requirements": False})
    spec = spec.replace(name=name, requirements=None, private_network=True)
    check(spec)
    taken = [j for j in list_servers(client) if j.name == name]
    if taken:
        raise GpuhopError(
            f"a TensorFlow server named {name!r} is already {taken[0].state.value}"
            f" (job {taken[0].id}); stop it (gpuhop tf-server stop {name}) or pick another"
            " --name",
            code="conflict",
        )
    with tempfile.TemporaryDirectory(prefix="gpuhop-tf-server-") as tmp:
        (Path(tmp) / SCRIPT).write_text(SCRIPT_TEXT)
        job = submit(session_of(client), [SCRIPT, "--port", str(port)], spec, workdir=tmp)
    if wait:
        wait_ready(job, timeout)
    return job


def find(client: Session | Connected, ref: str = DEFAULT_NAME) -> Job:
    """The TensorFlow server job `ref` names (id, prefix or name), whatever its state."""
    session = session_of(client)
    try:
        job = get(session, ref)
    except GpuhopError as e:
        if e.status != 404:
            raise
        raise GpuhopError(
            f"no TensorFlow server {ref!r} on {session.endpoint.description};"
            " start one with: gpuhop tf-server start"
            + (f" --name {ref}" if ref != DEFAULT_NAME else ""),
            code="not_found",
            status=404,
        ) from None
    if not is_tf_server(job.info):
        raise GpuhopError(
            f"job {job.id} ({ref!r}) is not a TensorFlow server (gpuhop tf-server ls lists them)",
            code="bad_request",
        )
    return job


def wait_ready(job: Job, timeout: float) -> None:
    """Wait until the server's job runs and its port answers; fail with the job's own
    words (and its log's last lines) if it ends first, or after `timeout` seconds."""
    port = port_of(job.info)
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        info = job.refresh()
        if info.state.finished:
            raise GpuhopError(ended_message(job), code="server_ended")
        if info.state == JobState.running:
            try:
                job.session.request("GET", f"/v1/jobs/{job.id}/ports/{port}")
                return
            except GpuhopError as e:
                if e.code != "not_listening":
                    raise
        if time.monotonic() > deadline:
            waiting = "for GPUs" if info.state == JobState.queued else "to answer"
            raise GpuhopError(
                f"the TensorFlow server (job {job.id}) is still {info.state.value}, waiting"
                f" {waiting}, after {timeout:.0f}s; see gpuhop logs {job.id}",
                code="timeout",
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def ended_message(job: Job) -> str:
    info = job.info
    tail = b"".join(job.logs()).decode(errors="replace").strip().splitlines()[-5:]
    said = ("; its log ends:\n  " + "\n  ".join(tail)) if tail else ""
    return (
        f"the TensorFlow server (job {job.id}) {info.state.said} ({info.reason})."
        f" Start a new one with: gpuhop tf-server start{said}"
    )
