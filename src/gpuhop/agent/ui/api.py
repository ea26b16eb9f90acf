"""Runs in the agent: /ui/api, the JSON the dashboard's pages fetch (thin; services do it).

The job routes answer as /v1/jobs does, by the same service functions
(`services.jobs.show`, `services.outputs.metrics_of`...), with the dashboard's own framing
(the agent's clock beside a job, a log read as a window rather than followed, an artifact
always a download). Every route acts as the session's caller (put in the scope by
`gpuhop.agent.ui.gate`): a user who is not an admin sees only their own jobs, and another
user's job answers 404 as one that does not exist.
"""

from __future__ import annotations

import os
import time
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response, StreamingResponse

from gpuhop.agent.callers import caller_of
from gpuhop.agent.context import AgentContext
from gpuhop.agent.services import archives, outputs, stacks
from gpuhop.agent.services import gpus as gpus_service
from gpuhop.agent.services import jobs as jobs_service
from gpuhop.agent.services import tensorboard as tb_service
from gpuhop.agent.services.jobfileread import OpenedFileResponse
from gpuhop.agent.services.longcalls import long_call
from gpuhop.api import ArtifactEntry, JobInfo, JobStacks, JobState
from gpuhop.api.metrics import HIGHER_IS_BETTER, LOWER_IS_BETTER
from gpuhop.version import __version__

router = APIRouter(prefix="/ui/api", include_in_schema=False)

# The first look at a log shows its end; later reads follow it from where the last stopped.
LOG_TAIL = 64 * 1024
LOG_READ_MAX = 256 * 1024


def ctx(request: Request) -> AgentContext:
    found: AgentContext = request.app.state.ctx
    return found


@router.get("/me")
def me(request: Request) -> dict[str, object]:
    caller = caller_of(request)
    c = ctx(request)
    return {
        "user": caller.user,
        "admin": caller.admin,
        "version": __version__,
        "gpus": len(c.gpus),
        "fake_gpus": c.fake_gpus,
    }


@router.get("/metric-rule")
def metric_rule() -> dict[str, str]:
    """Which way a metric gets better (gpuhop.api.metrics), as the patterns the sweep page
    ranks runs with: a name `lower` finds is a loss or an error; else one `higher` finds is
    a score; else a loss. Each is a regular expression, case-insensitive."""
    return {"lower": LOWER_IS_BETTER, "higher": HIGHER_IS_BETTER}


@router.get("/jobs")
def jobs(
    request: Request,
    state: list[JobState] | None = Query(default=None),
    limit: int = Query(default=200, ge=1, le=2000),
    sweep: str | None = Query(default=None, max_length=80),
) -> dict[str, object]:
    """The newest `limit` jobs; `more` says whether there are older ones beyond them (one
    more is asked for, so the page can say that it shows only the newest)."""
    # The agent's clock comes along: a running job's duration must not depend on the
    # browser's machine keeping the same time as the GPU host.
    found = jobs_service.list_jobs(ctx(request), caller_of(request), state, limit + 1, sweep)
    return {"now": time.time(), "jobs": found[:limit], "more": len(found) > limit}


@router.get("/jobs/{ref}")
def job(ref: str, request: Request) -> dict[str, object]:
    info: JobInfo = jobs_service.show(ctx(request), ref, caller_of(request))
    return {"now": time.time(), "job": info}


@router.get("/jobs/{ref}/log")
def log(
    ref: str,
    request: Request,
    offset: int | None = Query(default=None, ge=0),
    worker: int | None = Query(default=None, ge=0),
) -> Response:
    """Up to LOG_READ_MAX bytes of the log from byte `offset` (default: its last LOG_TAIL
    bytes). X-Log-Start and X-Log-Next say which bytes these are; ask again from Next."""
    _job, path = outputs.log_of(ctx(request), ref, caller_of(request), worker)
    data = b""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - LOG_TAIL) if offset is None else min(offset, size)
            f.seek(start)
            data = f.read(LOG_READ_MAX)
    except FileNotFoundError:
        start = 0
    headers = {"X-Log-Start": str(start), "X-Log-Next": str(start + len(data))}
    return Response(data, media_type="application/octet-stream", headers=headers)


@router.get("/jobs/{ref}/metrics")
def metrics(ref: str, request: Request, offset: int = Query(default=0, ge=0)) -> dict[str, object]:
    return outputs.metrics_of(ctx(request), ref, caller_of(request), offset)


@router.get("/jobs/{ref}/artifacts")
def artifacts(ref: str, request: Request) -> list[ArtifactEntry]:
    return outputs.artifacts_of(ctx(request), ref, caller_of(request))


@router.get("/jobs/{ref}/artifacts/{path:anypath}")
def artifact(ref: str, path: str, request: Request) -> FileResponse:
    """A download, never a page: a job's HTML file shown inline under the dashboard's
    origin could script the dashboard. Sandboxed by CSP as well, should a browser render it."""
    opened = outputs.artifact_of(ctx(request), ref, caller_of(request), request.scope["raw_path"])
    return OpenedFileResponse(
        opened,
        media_type="application/octet-stream",
        filename=opened.name.rsplit(b"/", 1)[-1].decode("utf-8", "replace"),
        content_disposition_type="attachment",
        headers={"Content-Security-Policy": "sandbox; default-src 'none'"},
    )


@router.get("/jobs/{ref}/archive")
@router.get("/jobs/{ref}/archive/{path:anypath}")
def archive(ref: str, request: Request, path: str = "") -> StreamingResponse:
    """A directory of the job's artifacts (a SavedModel; all of them without `path`) as one
    zip file, streamed while it is made: a download, as every artifact is."""
    found = archives.artifact_dir_of(ctx(request), ref, caller_of(request), path)
    return StreamingResponse(
        found.chunks(),
        media_type="application/zip",
        headers={
            # The name is the job's: quoted, so no character of it can end the header.
            "Content-Disposition": f"attachment; filename*=utf-8''{quote(found.name)}",
            "Content-Security-Policy": "sandbox; default-src 'none'",
        },
    )


@router.get("/jobs/{ref}/tensorboard")
def tensorboard(ref: str, request: Request) -> dict[str, object]:
    """The runs (dirs of event files) the job has written so far, where TensorBoard would
    find them; the page offers `gpuhop tensorboard` where there are some."""
    return {"runs": tb_service.event_dirs(ctx(request), ref, caller_of(request))}


@router.get("/jobs/{ref}/stacks")
def job_stacks(ref: str, request: Request) -> JobStacks:
    """The job page's "Stacks" button: `gpuhop stacks`, all workers, Python frames."""
    with long_call(request, "a stack dump"):
        return stacks.stacks_of(ctx(request), ref, caller_of(request), None, False)


@router.post("/jobs/{ref}/cancel")
def cancel(ref: str, request: Request) -> dict[str, object]:
    info = jobs_service.cancel(ctx(request), ref, 10.0, caller_of(request))
    return {"now": time.time(), "job": info}


@router.post("/sweeps/{ref}/cancel")
def cancel_sweep(ref: str, request: Request) -> dict[str, object]:
    runs = jobs_service.cancel_sweep(ctx(request), ref, 10.0, caller_of(request))
    return {"now": time.time(), "jobs": runs}


@router.get("/gpus")
def gpus(request: Request) -> dict[str, object]:
    """Each GPU as `gpuhop gpus` shows it, the names of the jobs holding them that the
    caller may see (the page names a holder as the job list does), and the last hour."""
    c = ctx(request)
    found = gpus_service.describe(c, caller_of(request))
    return {
        "now": time.time(),
        "gpus": found,
        "names": gpus_service.holder_names(c, found),
        "every": c.gpu_history.every,
        "history": c.gpu_history.series(),
    }
