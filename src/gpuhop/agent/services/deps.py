"""Runs in the agent: checks a submitted job's datasets, requirements and interpreter, and
records what it resolved them to (see `gpuhop.backends.jobdeps`)."""

from __future__ import annotations

from typing import Any

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.jobs.store import ACTIVE_STATES
from gpuhop.agent.storage.datasets import DatasetNotFound
from gpuhop.agent.storage.envs import EnvError, check_plain, check_python, python_version
from gpuhop.api import ErrorCode, JobState
from gpuhop.api.spec import JobSpec
from gpuhop.backends import jobdeps
from gpuhop.home import JobPaths


def check(rt: AgentContext, spec: JobSpec, tree_paths: set[str], caller: Caller) -> dict[str, Any]:
    """Resolve the job's datasets (to exact versions) and environment, or raise a 4xx.
    Runs before anything of the job is written, so a bad request leaves nothing behind.
    A dataset `caller` may not read (another user's, not shared) is one that is not there."""
    deps: dict[str, Any] = {}
    if spec.pack:
        deps["pack"] = True  # read by a scale-out backend; one host has nothing to pack
    points = [m.mount for m in spec.data]
    points += [f"{jobdeps.DATA_DIR}/{d.name}" for d in spec.data_sources]
    _check_mount_points(points, tree_paths)
    if spec.data:
        deps["data"] = _mounts(rt, spec, caller)
    if spec.data_sources:
        why = rt.bucket_credentials(caller.user).missing()
        if why is not None:
            raise ApiError(400, ErrorCode.bad_request, why)
        # Fetched from now on (gpuhop.agent.jobs.fetches), added to "data" when whole.
        deps["sources"] = [str(d) for d in spec.data_sources]
    python = interpreter(rt, spec)
    if python is not None:
        deps["python"] = python
    if spec.requirements is not None:
        if "\x00" in spec.requirements:
            raise ApiError(400, ErrorCode.bad_request, "the requirements contain a NUL byte")
        # On a team agent each user's jobs have environments of their own: another user's
        # build, from their own index or wheels, is never what this one imports.
        owner = caller.user if rt.team() else None
        try:
            if owner is not None:
                check_plain(spec.requirements)
            if spec.image is not None:  # in a dir of the image's (the leader builds it)
                deps["env"] = rt.envs.spec_on_image(spec.image, spec.requirements, spec.env, owner)
            else:
                python = python or rt.supervisor.python
                deps["env"] = rt.envs.spec(python, spec.requirements, spec.env, owner)
        except EnvError as e:
            raise ApiError(400, ErrorCode.bad_request, str(e)) from None
    return deps


def ask_version(rt: AgentContext, spec: JobSpec) -> None:
    """Have the interpreter that builds the job's environment say its version now (the
    answer is kept while the file is unchanged), before the submission takes `rt.uses`: a
    `--python` may take up to envs.VERSION_SECONDS to answer, and a removal waiting for the
    lock meanwhile would hold every other user's submission behind it. Refused as `check`
    would refuse it."""
    if spec.requirements is None or spec.image is not None:
        return
    python = interpreter(rt, spec) or rt.supervisor.python
    try:
        python_version(python)
    except EnvError as e:
        raise ApiError(400, ErrorCode.bad_request, str(e)) from None


def interpreter(rt: AgentContext, spec: JobSpec) -> str | None:
    """The job's own interpreter (`--python`), checked before anything runs it; or None."""
    if spec.python is None:
        return None
    try:
        return check_python(spec.python, rt.paths.home)
    except EnvError as e:
        raise ApiError(400, ErrorCode.bad_request, str(e)) from None


def _check_mount_points(points: list[str], tree_paths: set[str]) -> None:
    """Refuse mount points that overlap each other or the job's synced files."""
    for i, a in enumerate(points):
        for b in points[:i]:
            if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                raise ApiError(
                    400, ErrorCode.bad_path, f"mount points {b} and {a} overlap; use separate ones"
                )
        for path in tree_paths:
            if path == a or a.startswith(path + "/"):
                raise ApiError(
                    400,
                    ErrorCode.bad_path,
                    f"mount point {a} collides with the synced file {path}",
                )
            if path.startswith(a + "/"):
                raise ApiError(
                    400,
                    ErrorCode.bad_path,
                    f"mount point {a} would hide synced files ({path}); mount the data"
                    " elsewhere, or ignore those files (.gpuhopignore)",
                )


def _mounts(rt: AgentContext, spec: JobSpec, caller: Caller) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = []
    for m in spec.data:
        try:
            info = rt.datasets.info(m.name, m.version)
            if not caller.admin and not rt.datasets.readable_by(m.name, caller.user):
                raise DatasetNotFound(f"no dataset named {m.name!r} (gpuhop data ls lists them)")
        except DatasetNotFound as e:
            raise not_found(str(e)) from None
        source = rt.datasets.tree_path(info.name, info.version)
        mounts.append(
            {"name": info.name, "version": info.version, "mount": m.mount, "source": str(source)}
        )
    return mounts


def store(jp: JobPaths, deps: dict[str, Any], spec: JobSpec) -> None:
    if not deps:
        return
    if spec.requirements is not None:
        (jp.root / "requirements.txt").write_text(spec.requirements, encoding="utf-8")
    jobdeps.write(jp, deps)


def info_fields(jp: JobPaths) -> dict[str, Any]:
    """The job's datasets and environment, for its JobInfo."""
    deps = jobdeps.read(jp)
    if not deps:
        return {}
    datasets = [d for d in deps.get("data", []) if "url" not in d]  # not a bucket's view
    return {
        "data": [f"{d['name']}:v{d['version']}={d['mount']}" for d in datasets]
        + deps.get("sources", []),
        "python_env": deps["env"]["id"] if deps.get("env") else None,
        "python": deps["env"]["python"] if deps.get("env") else deps.get("python"),
    }


def in_use(rt: AgentContext) -> list[tuple[str, dict[str, Any]]]:
    """The deps of every job that is queued, starting or running: (job id, deps)."""
    out = []
    for job in rt.store.list([JobState.queued, *ACTIVE_STATES], limit=100_000):
        deps = jobdeps.read(rt.supervisor.job_paths(job.id))
        if deps:
            out.append((job.id, deps))
    return out
