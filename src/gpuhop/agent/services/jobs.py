"""Runs in the agent: submitting, finding, listing and cancelling jobs; their logs and files."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from gpuhop.agent.callers import Caller, owner_login
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.jobs.energy import job_energy
from gpuhop.agent.jobs.masking import mask_json, mask_records
from gpuhop.agent.jobs.metricstail import by_source, latest_of, memory_peak_of, tail_records
from gpuhop.agent.jobs.records import as_text, is_notebook_server
from gpuhop.agent.jobs.store import AmbiguousJob, JobNotFound, JobRecord
from gpuhop.agent.services import admission, deps, fairuse, gc, queue
from gpuhop.agent.services import secrets as job_secrets
from gpuhop.api import (
    AttemptInfo,
    EndClass,
    ErrorCode,
    JobInfo,
    JobState,
    RetryOn,
    format_mb,
    validate_relpath,
)
from gpuhop.api.queue import shown_webhook
from gpuhop.api.spec import JobSpec
from gpuhop.backends import jobdeps
from gpuhop.backends.base import Refused
from gpuhop.home import JobPaths

log = logging.getLogger("gpuhop.agent")


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


def _metrics(stored: str | None) -> dict[str, object] | None:
    """An earlier attempt's last metrics record, as stored (JSON text), or None."""
    try:
        value = json.loads(stored) if stored else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def to_info(rt: AgentContext, job: JobRecord) -> JobInfo:
    jp = rt.supervisor.job_paths(job.id)
    # One listing of the job's dir, then only the files it has: a queued job has none of
    # them, and `ps` under load lists dozens of those (a failed open each cost more than the
    # rest of the job's answer). The metrics file's tail is read once for both fields.
    try:
        present = set(os.listdir(jp.root))
    except OSError:
        present = set()
    log_size = 0
    if jp.log.name in present:
        with contextlib.suppress(OSError):
            log_size = jp.log.stat().st_size
    metrics = tail_records(jp.metrics) if jp.metrics.name in present else []
    # What the job wrote there, and an earlier attempt's last record, with its user's secrets
    # masked (see gpuhop.agent.jobs.masking); read only where there are records to mask.
    secrets = rt.secret_values(job) if metrics or job.attempt > 1 else []
    metrics = mask_records(metrics, secrets)
    marker = gc.pruned(jp) if gc.PRUNED in present else None
    return JobInfo(
        id=job.id,
        name=None if job.spec.name is None else as_text(job.spec.name),
        state=job.state,
        # A job stored by an older agent may hold text no answer can carry (a lone
        # surrogate): escaped here, so that it never breaks a listing.
        command=[as_text(a) for a in job.command],
        gpus=job.spec.gpus,
        gpu_ids=job.gpu_ids,
        env={as_text(k): as_text(v) for k, v in job.spec.env.items()},
        priority=job.spec.priority,
        attempt=job.attempt,
        retries=job.spec.retries,
        workers=job.spec.workers,
        attempts=[
            AttemptInfo(
                attempt=a["attempt"],
                state=JobState(a["state"]),
                started_at=_dt(a["started_at"]),
                ended_at=_dt(a["ended_at"]),
                exit_code=a["exit_code"],
                signal=a["signal"],
                reason=a["reason"],
                end_class=a["end_class"],
                metrics=mask_json(_metrics(a["metrics"]), secrets),  # type: ignore[arg-type]
            )
            for a in (rt.store.attempts(job.id) if job.attempt > 1 else [])
        ],
        created_at=_dt(job.created_at),  # type: ignore[arg-type]
        started_at=_dt(job.started_at),
        ended_at=_dt(job.ended_at),
        exit_code=job.exit_code,
        signal=job.signal,
        reason=None if job.reason is None else as_text(job.reason),
        log_size=log_size,
        latest_metrics=latest_of(metrics),
        metrics_by_source=by_source(metrics),
        memory_peak_mb=memory_peak_of(metrics),
        pruned_at=_dt(marker["pruned_at"]) if marker else None,
        gpu_memory_mb=job.spec.gpu_memory_mb,
        owner=job.owner,
        # A job on a Ray cluster has no private network, whatever its workers.
        private_network=(job.spec.private_network or job.spec.workers > 1)
        and not rt.backend.elsewhere(jp),
        end_class=None if job.end_class is None else EndClass(job.end_class),
        after=list(job.spec.after),
        after_any=job.spec.after_any,
        waiting_for=queue.waiting_for(rt, job),
        timeout=job.spec.time_limit,
        retry_on=RetryOn(job.spec.retry_on),
        waiting=rt.scheduler.waiting.get(job.id)
        if job.state == JobState.queued
        else rt.backend.waiting(jp)
        if job.state in (JobState.starting, JobState.running)
        else None,
        cluster_job=None if job.state == JobState.queued else rt.backend.cluster_job(jp),
        sweep=job.spec.sweep,
        max_parallel=job.spec.max_parallel,
        mixed_gpus=job.spec.mixed_gpus,
        image=job.spec.image,
        notify=[shown_webhook(url) for url in job.spec.notify],
        secrets=[s.name if s.env == s.name else f"{s.name}={s.env}" for s in job.spec.secrets],
        energy=job_energy(
            jp,
            used_gpus=job.spec.gpus > 0,
            ran=job.started_at is not None or job.attempt > 1,
        ),
        **(deps.info_fields(jp) if jobdeps.path(jp).name in present else {}),
    )


def show(rt: AgentContext, ref: str, caller: Caller) -> JobInfo:
    """The caller's job `ref`, as clients see it."""
    return to_info(rt, find(rt, ref, caller))


def check_running(job: JobRecord, so_no: str) -> None:
    """Refuse a job that does not run now with a 409 that says so: "job 3fa9 has ended:
    failed, so it has `so_no`" (or "is queued: it has not started yet, so ...")."""
    if job.state != JobState.running:
        when = "" if job.state.finished else ": it has not started yet"
        raise ApiError(
            409,
            ErrorCode.conflict,
            f"job {job.id} {job.state.said}{when}, so it has {so_no}",
            {"state": job.state.value},
        )


def find(rt: AgentContext, ref: str, caller: Caller) -> JobRecord:
    """The job `ref` names among those `caller` may see (all, for an admin).

    Another user's job answers exactly as a job that does not exist: the same 404, and it
    never makes a prefix ambiguous. Every route that takes a job ref resolves it here.
    """
    try:
        job = rt.store.resolve(ref, owner=caller.owner_filter)
        if caller.admin and job.spec.name == ref and job.id != ref:
            _one_owner_named(rt, ref)
        return job
    except JobNotFound:
        raise not_found(f"no job matches {ref!r}") from None
    except AmbiguousJob as e:
        raise ApiError(
            409,
            ErrorCode.ambiguous,
            f"{ref!r} matches {len(e.matches)} jobs ({', '.join(e.matches[:5])});"
            " give more of the id",
            {"matches": e.matches},
        ) from None


def _one_owner_named(rt: AgentContext, name: str) -> None:
    """An admin sees every user's jobs, and job names are each user's own: a name that
    several users' jobs have is refused, naming each one's newest, rather than the newest
    of all taken (a cancel by name could stop another user's job)."""
    namesakes = [(job_id, owner or owner_login()) for job_id, owner in rt.store.named(name)]
    if len({owner for _, owner in namesakes}) > 1:
        which = ", ".join(f"{owner}'s {job_id}" for job_id, owner in namesakes[:5])
        raise ApiError(
            409,
            ErrorCode.ambiguous,
            f"{name!r} names jobs of {len(namesakes)} users ({which}); give the job's id",
            {"matches": [job_id for job_id, _ in namesakes]},
        )


def list_jobs(
    rt: AgentContext,
    caller: Caller,
    states: list[JobState] | None,
    limit: int,
    sweep: str | None = None,
) -> list[JobInfo]:
    """The newest jobs `caller` may see; with `sweep` (a sweep's id, or its name for the
    newest sweep of that name), that sweep's runs."""
    owner = caller.owner_filter
    sweep = resolve_sweep(rt, sweep, owner)
    return [to_info(rt, j) for j in rt.store.list(states, limit, owner=owner, sweep=sweep)]


def resolve_sweep(rt: AgentContext, sweep: str | None, owner: str | None) -> str | None:
    """The id of the sweep `sweep` names (its id, or the newest of that name), or None."""
    if sweep is None:
        return None
    found = rt.store.newest_sweep(sweep, owner=owner)
    if found is None:
        raise not_found(f"no sweep matches {sweep!r}")
    return found


def _checked_command(
    rt: AgentContext,
    command: list[str],
    tree: str | None,
    env: Mapping[str, str],
    in_image: bool = False,
) -> list[str]:
    """The command, its script named as its tree lists it; or a 400 saying why it cannot run.
    In an image (`in_image`) a bare name or an absolute path is the image's to find, not the
    host's: it is not looked for here."""
    head = command[0]
    if head == "-m":  # a module run by the job's Python (gpuhop's notebook runner)
        if len(command) < 2 or not command[1]:
            raise ApiError(400, ErrorCode.bad_request, "-m needs a module name to run")
        return command
    if head.endswith(".py") or ("/" in head and not head.startswith("/")):
        try:
            rel = validate_relpath(head[2:] if head.startswith("./") else head)
        except ValueError as e:
            raise ApiError(400, ErrorCode.bad_path, f"script: {e}") from None
        if tree is None or not _in_tree(rt, tree, rel):
            raise ApiError(
                400,
                ErrorCode.bad_request,
                f"{head} is not among the synced files (is it ignored by .gitignore or"
                " .gpuhopignore?)",
            )
        # A program at the tree's top stays a path (./run.sh): a bare name is looked up
        # on PATH where the job starts.
        return [rel if rel.endswith(".py") or "/" in rel else f"./{rel}", *command[1:]]
    if in_image:
        return command
    if head.startswith("/"):
        if not os.access(head, os.X_OK):
            raise ApiError(400, ErrorCode.bad_request, f"{head} is not an executable on the host")
        return command
    path = env.get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(head, path=path) is None:
        # `run.sh` for the work dir's own program: a shell, too, runs only ./run.sh.
        ours = tree is not None and head not in (".", "..") and _in_tree(rt, tree, head)
        hint = f"; to run the work dir's {head}, name it ./{head}" if ours else ""
        raise ApiError(
            400, ErrorCode.bad_request, f"command {head!r} was not found on the GPU host{hint}"
        )
    return command


def _in_tree(rt: AgentContext, digest: str, rel: str) -> bool:
    """Whether the stored tree `digest` lists the file `rel`. Its checkout, where one was made
    (a tree run before), answers with one stat; otherwise (or if it says no: collection may
    have just removed it) the tree's entries are read."""
    if os.path.isfile(rt.checkouts.path(digest) / rel):
        return True
    return any(e["path"] == rel for e in rt.trees.entries(digest))


def _claim_job_dir(rt: AgentContext) -> tuple[str, JobPaths]:
    """A new job id, claimed by creating its directory (mkdir is atomic)."""
    while True:
        job_id = secrets.token_hex(4)
        jp = rt.supervisor.job_paths(job_id)
        try:
            jp.root.mkdir()
        except FileExistsError:
            continue
        return job_id, jp


def _check_share(rt: AgentContext, share_mb: int) -> None:
    largest = max((g.memory_mb for g in rt.gpus), default=0)
    if share_mb > largest:
        asked, size = format_mb(share_mb), format_mb(largest)
        if asked == size:  # 8193 MB and 8192 MB both read "8 GiB": say them exactly
            asked, size = f"{share_mb} MiB", f"{largest} MiB"
        has = f"the largest GPU here has {size}" if rt.gpus else "this host has no GPU"
        raise ApiError(
            400,
            ErrorCode.unsatisfiable,
            f"the job asks for {asked} of GPU memory; {has}",
        )


def _missing_tree(tree: str) -> ApiError:
    """The answer that has the client send the tree (again)."""
    return ApiError(
        409,
        ErrorCode.missing_tree,
        f"tree {tree} is not on the agent; upload it first",
        {"tree": tree},
    )


def _keep_copy(source: os.PathLike[str], dest: os.PathLike[str], tree: str) -> None:
    try:
        try:
            os.link(source, dest)
        except FileNotFoundError:
            raise
        except OSError:  # another filesystem, too many links: a copy
            shutil.copyfile(source, dest)
    except FileNotFoundError:
        # Collected (gc, past its grace) since it was looked up: as if it had never come,
        # so the client sends it again.
        raise _missing_tree(tree) from None


def with_default_image(rt: AgentContext, spec: JobSpec) -> JobSpec:
    """`spec` in the agent's default image (agent.toml `image`) where it asks for no
    environment of its own: no image, no interpreter (`--python`) and no requirements. A
    job that names those, or says `no_image`, asked for the host's Python, and keeps it."""
    own = spec.image or spec.no_image or spec.python or spec.requirements is not None
    if rt.policy.image is None or own:
        return spec
    return spec.replace(image=rt.policy.image)


def submit(
    rt: AgentContext,
    command: list[str],
    spec: JobSpec,
    tree: str | None,
    caller: Caller,
    prepare: Callable[[JobPaths], None] | None = None,
) -> JobInfo:
    """Queue a job that runs `command` in the files of `tree` as `spec` asks (settled: see
    `SubmitRequest.spec`). `prepare` puts more files in the new job's dir before it is
    queued (a model server's SavedModel); if it raises, the job is not created. It runs
    holding `rt.uses` shared: what it checks is still there when the job is queued."""
    admission.check_priority(spec, caller)
    job_secrets.check_submit(rt, spec, command, caller)
    deps.interpreter(rt, spec)  # before the backend's check may run it
    try:
        rt.backend.check_submit(spec)
    except Refused as e:
        raise ApiError(400, e.code, e.message) from None
    if rt.backend.remote and is_notebook_server(command):
        # Queued anyway, it would hold its node (and GPUs) until --idle, unreachable.
        raise ApiError(
            400,
            ErrorCode.bad_request,
            "JupyterLab (gpuhop notebook) is reached through gpuhop forward, which reaches"
            f" ports on the agent's own host only, and this agent runs jobs on"
            f" {rt.backend.where}: run a notebook top to bottom as a job instead (gpuhop run"
            f" NOTEBOOK.ipynb) (agent started with --backend {rt.backend.name})",
        )
    total = len(rt.gpus)
    if spec.gpu_memory_mb is not None:
        _check_share(rt, spec.gpu_memory_mb)
    elif spec.gpus > total:
        raise ApiError(
            400,
            ErrorCode.unsatisfiable,
            f"the job asks for {spec.gpus} GPU{'s' if spec.gpus != 1 else ''};"
            f" this host has {total}",
        )
    fairuse.check(rt, spec, caller)
    if tree is not None and (
        not rt.trees.has(tree)
        # Another user's tree is "not on the agent" to this one: knowing its digest is not
        # holding its files (see gpuhop.agent.storage.claims).
        or (not caller.admin and rt.claims.unclaimed(caller.user, "tree", [tree]))
    ):
        raise _missing_tree(tree)
    command = _checked_command(rt, command, tree, spec.env, in_image=spec.image is not None)
    # The store keeps the jobs it runs after by their full ids.
    spec = spec.replace(after=tuple(queue.resolve_after(rt, spec, caller)))
    mounts = spec.data or spec.data_sources
    tree_paths = {e["path"] for e in rt.trees.entries(tree)} if tree and mounts else set()
    deps.ask_version(rt, spec)  # may take a while: not under the lock below
    # From the first look at what the job uses (its datasets, its environment, a model
    # server's source job in `prepare`) until its row and deps name them: gc, `data rm` and
    # `env rm` decide from those (see gpuhop.agent.storage.uses).
    with rt.uses.shared():
        job_deps = deps.check(rt, spec, tree_paths, caller)
        if tree is not None and rt.policy.jobs_quota is not None:
            # A stat per file of the tree: only where a quota asks for it.
            rt.meter.check_jobs(admission.tree_bytes(rt, tree))
        # Everything the job needs is on disk before its row exists: the scheduler may pick
        # up a queued job at any moment.
        job_id, jp = _claim_job_dir(rt)
        try:
            deps.store(jp, job_deps, spec)
            if tree is not None:
                # The job keeps its own copy, so it never depends on the shared tree staying:
                # a hard link, as a stored tree is never written after its rename into place.
                _keep_copy(rt.trees.path(tree), jp.tree, tree)
            if prepare is not None:
                prepare(jp)
            job = rt.store.create(command, spec, tree=tree, owner=caller.user, job_id=job_id)
        except BaseException:
            # A full disk (files or the job store), a bad source: no half job.
            shutil.rmtree(jp.root, ignore_errors=True)
            raise
    # Its data and its image start coming while it waits for its GPUs (and the pass below
    # holds it until they are here).
    rt.fetches.start(job)
    rt.image_waits.start(job)
    # The pass runs here rather than on the event loop: one hop less before the start.
    rt.scheduler.start_now()
    return to_info(rt, job)


def cancel(rt: AgentContext, ref: str, grace: float, caller: Caller) -> JobInfo:
    job = find(rt, ref, caller)
    if job.state.finished:
        raise ApiError(
            409, ErrorCode.conflict, f"job {job.id} has already ended: {job.state.value}"
        )
    if job.state == JobState.queued and rt.store.transition(
        job.id,
        [JobState.queued],
        JobState.cancelled,
        reason="cancelled before it started",
        cancel_requested=1,
        ended_at=time.time(),
        end_class=EndClass.cancelled.value,
    ):
        rt.scheduler.wake()
        rt.notify(job.id, JobState.cancelled.value)  # it never started: this is its end
        return to_info(rt, rt.store.get(job.id))
    rt.supervisor.cancel(rt.store.get(job.id), grace)
    return to_info(rt, rt.store.get(job.id))


def cancel_sweep(rt: AgentContext, sweep: str, grace: float, caller: Caller) -> list[JobInfo]:
    """Cancel every run of the caller's sweep `sweep` (its id, or its name for the newest)
    that has not ended; the runs, as they are after it. A run that ends on its own meanwhile
    is left as it ended."""
    owner = caller.owner_filter
    found = resolve_sweep(rt, sweep, owner)
    for run in rt.store.list(None, 10_000, owner=owner, sweep=found):
        if not run.state.finished:
            with contextlib.suppress(ApiError):  # it ended between the list and the cancel
                cancel(rt, run.id, grace, caller)
    return [to_info(rt, j) for j in rt.store.list(None, 10_000, owner=owner, sweep=found)]
