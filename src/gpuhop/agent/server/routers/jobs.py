"""Runs in the agent: /v1/jobs routes."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response, StreamingResponse

from gpuhop.agent.callers import caller_of
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.services import jobs as service
from gpuhop.agent.services import (
    outputs,
    profiling,
    provenance,
    queue,
    stacks,
    trees,
    workdir,
)
from gpuhop.agent.services.jobfileread import OpenedFileResponse
from gpuhop.agent.services.listing import (
    DEFAULT_LIMIT,
    MAX_FIELDS,
    MAX_LIMIT,
    MAX_SWEEP,
    Listing,
    parse_fields,
)
from gpuhop.agent.services.longcalls import long_call
from gpuhop.api import (
    ArtifactEntry,
    ErrorCode,
    JobDiff,
    JobInfo,
    JobProfile,
    JobStacks,
    JobState,
    RequeueRequest,
    SubmitRequest,
    WorkdirEntry,
)
from gpuhop.api.profile import MAX_PROFILE_SECONDS
from gpuhop.api.queue import MAX_GRACE

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def ctx(request: Request) -> AgentContext:
    return request.app.state.ctx


@router.post("", status_code=201)
def submit(req: SubmitRequest, request: Request) -> JobInfo:
    c, caller = ctx(request), caller_of(request)
    if req.tree_delta is not None:  # a re-sync: the job's tree as its changes from the last
        trees.store_delta(c, req.tree_delta, caller)
    spec = service.with_default_image(c, req.spec())
    return service.submit(c, req.command, spec, req.tree, caller)


@router.get("", response_model=list[JobInfo])
def list_jobs(
    request: Request,
    state: list[JobState] | None = Query(default=None),
    limit: int = Query(default=DEFAULT_LIMIT, ge=1, le=MAX_LIMIT),
    sweep: str | None = Query(default=None, max_length=MAX_SWEEP),
    fields: str | None = Query(
        default=None,
        max_length=MAX_FIELDS,
        description="Only these fields of each job, comma-separated (`id,state,command`),"
        " and of them only those with a value (a null one is left out); all of them, nulls"
        " too, by default. `gpuhop ps` asks for the columns it shows.",
    ),
) -> Response:
    # Already JSON (each job's kept until it changes: see `services.listing`). The same
    # call as its fast path's (routers.fastjobs), which answers most of these first.
    try:
        chosen = None if fields is None else parse_fields(fields)
    except ValueError as e:
        raise ApiError(422, ErrorCode.bad_request, str(e)) from None
    listing: Listing = request.app.state.listing
    body = listing.list_json(ctx(request), caller_of(request), state, limit, sweep, chosen)
    return Response(body, media_type="application/json")


@router.get("/{ref}")
def show(ref: str, request: Request) -> JobInfo:
    return service.show(ctx(request), ref, caller_of(request))


@router.post("/{ref}/cancel")
def cancel(
    ref: str, request: Request, grace: float = Query(default=10.0, ge=0, le=MAX_GRACE)
) -> JobInfo:
    return service.cancel(ctx(request), ref, grace, caller_of(request))


@router.post("/{ref}/requeue")
def requeue(ref: str, req: RequeueRequest, request: Request) -> JobInfo:
    c, caller = ctx(request), caller_of(request)
    job = queue.requeue(c, service.find(c, ref, caller), req.priority, caller)
    return service.to_info(c, job)


@router.get("/{ref}/log")
def log(
    ref: str,
    request: Request,
    offset: int = Query(default=0, ge=0, le=outputs.MAX_OFFSET),
    follow: bool = False,
    worker: int | None = Query(default=None, ge=0),
) -> StreamingResponse:
    job, path = outputs.log_of(ctx(request), ref, caller_of(request), worker)
    return StreamingResponse(
        outputs.follow_log(request.app.state.log_watch, job.id, path, offset, follow),
        media_type="application/octet-stream",
        headers={"X-Gpuhop-Job": job.id},
    )


@router.get("/{ref}/stacks")
def job_stacks(
    ref: str,
    request: Request,
    worker: int | None = Query(default=None, ge=0),
    native: bool = False,
) -> JobStacks:
    """Every Python thread's stack in the running job's processes now (py-spy dump)."""
    with long_call(request, "a stack dump"):
        return stacks.stacks_of(ctx(request), ref, caller_of(request), worker, native)


@router.post("/{ref}/profile")
def job_profile(
    ref: str,
    request: Request,
    seconds: float = Query(default=5.0, gt=0, le=MAX_PROFILE_SECONDS),
    worker: int | None = Query(default=None, ge=0),
) -> JobProfile:
    """Profile the running job for `seconds` (TensorFlow's or JAX's profiler in its
    processes, else py-spy's samples); answers once the files are written."""
    with long_call(request, "a profile"):
        return profiling.capture(ctx(request), ref, caller_of(request), seconds, worker)


@router.get("/{ref}/provenance")
def job_provenance(ref: str, request: Request) -> dict[str, object]:
    """What the job ran on: its interpreter, platform, distributions (and their digest),
    TensorFlow's build, the GPUs and driver, gpuhop's version and the tree."""
    return provenance.record_of(ctx(request), ref, caller_of(request))


@router.get("/{ref}/diff")
def job_diff(
    ref: str, request: Request, other: str = Query(..., min_length=1, max_length=200)
) -> JobDiff:
    """What changed from this job to `other`: files, packages, options, what they ran on."""
    return provenance.diff(ctx(request), ref, other, caller_of(request))


@router.get("/{ref}/metrics")
def metrics(
    ref: str, request: Request, offset: int = Query(default=0, ge=0, le=outputs.MAX_OFFSET)
) -> dict[str, object]:
    return outputs.metrics_of(ctx(request), ref, caller_of(request), offset)


@router.get("/{ref}/artifacts")
def artifacts(ref: str, request: Request) -> list[ArtifactEntry]:
    return outputs.artifacts_of(ctx(request), ref, caller_of(request))


@router.get("/{ref}/artifacts/{path:anypath}")
def artifact(ref: str, path: str, request: Request) -> FileResponse:
    # `path` routes the request; the name's bytes come from the URL itself.
    raw_path = request.scope["raw_path"]
    return OpenedFileResponse(outputs.artifact_of(ctx(request), ref, caller_of(request), raw_path))


@router.get("/{ref}/workdir")
def workdir_outputs(ref: str, request: Request) -> list[WorkdirEntry]:
    """The files the job created or changed in its work dir."""
    c = ctx(request)
    job = service.find(c, ref, caller_of(request))
    outputs.check_not_pruned(c, job)
    return workdir.list_outputs(c, job)


@router.get("/{ref}/workdir/{path:anypath}")
def workdir_file(ref: str, path: str, request: Request) -> FileResponse:
    c = ctx(request)
    job = service.find(c, ref, caller_of(request))
    outputs.check_not_pruned(c, job)
    return FileResponse(workdir.output_path(c, job, path))


@router.get("/{ref}/tmp")
def tmp_files(ref: str, request: Request) -> list[ArtifactEntry]:
    """The files the ended job left in its /tmp."""
    return outputs.tmp_files_of(ctx(request), ref, caller_of(request))


@router.get("/{ref}/tmp/{path:anypath}")
def tmp_file(ref: str, path: str, request: Request) -> FileResponse:
    raw_path = request.scope["raw_path"]
    return OpenedFileResponse(outputs.tmp_file_of(ctx(request), ref, caller_of(request), raw_path))
