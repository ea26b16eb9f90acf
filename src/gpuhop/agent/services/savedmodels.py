"""Runs in the agent: finding the SavedModel a finished job made, for `gpuhop serve JOB`.

A job exports into its artifacts (`model.export($GPUHOP_ARTIFACTS_DIR/model)`), or, run
unmodified as tutorials are, into its work dir (`tf.saved_model.save(m, "saved_model/x")`)
or a temp dir (TF Serving's `rest_simple`: `tempfile.gettempdir()`), which is the job's own
/tmp, kept after it ended (see `JobPaths.tmp`). All count: the artifacts first, then the
SavedModels the job wrote in its work dir (not one it was synced with), then those in its
/tmp, named `/tmp/...` as the job saw them.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.services import outputs, workdir
from gpuhop.api import ErrorCode

SAVED_MODEL_PB = "saved_model.pb"
# A path in the job's /tmp, as the job saw it.
TMP = "/tmp/"
SAVED_IN_TMP = "found a SavedModel the job saved in its /tmp"
HINT = (
    "export one into $GPUHOP_ARTIFACTS_DIR, e.g."
    " model.export(gpuhop.tf.artifacts_dir() / 'model'), or save it in the work dir"
)


def _inside(root: Path, path: str, job: JobRecord, where: str) -> Path:
    full = root / path
    if not full.resolve().is_relative_to(root) or any(
        p.is_symlink() for p in (full, *full.parents) if p.is_relative_to(root)
    ):
        raise ApiError(400, ErrorCode.bad_path, f"{path} leads out of job {job.id}'s {where}")
    return full


def _in_workdir(rt: AgentContext, job: JobRecord) -> list[str]:
    """The dirs of the SavedModels the job wrote in its work dir."""
    return sorted(
        {
            str(PurePosixPath(e.path).parent)
            for e in workdir.list_outputs(rt, job)
            if PurePosixPath(e.path).name == SAVED_MODEL_PB
        }
    )


def _in_tmp(tmp: Path) -> list[str]:
    """The dirs of the SavedModels the job left in its /tmp (links not followed)."""
    found = (
        Path(d).relative_to(tmp).as_posix()
        for d, _, names in os.walk(tmp)
        if SAVED_MODEL_PB in names
    )
    return sorted("" if d == "." else d for d in found)


def find_saved_model(rt: AgentContext, job: JobRecord, path: str | None) -> tuple[Path, str]:
    """The SavedModel dir of `job` at `path` (in its artifacts, else in its work dir, else,
    for /tmp/..., in its /tmp), or the only one it made; and how to name it."""
    if not job.state.finished:
        raise ApiError(
            409,
            ErrorCode.conflict,
            f"job {job.id} {job.state.said}; serve its SavedModel once it has ended",
            {"state": job.state.value},
        )
    outputs.check_not_pruned(rt, job)  # 410, rather than "no SavedModel" in what is left
    jp = rt.supervisor.job_paths(job.id)
    artifacts, work, tmp = jp.artifacts.resolve(), jp.work.resolve(), jp.tmp.resolve()
    if path is not None:
        full = _inside(artifacts, path, job, "artifacts")
        if (full / SAVED_MODEL_PB).is_file():
            return full, path
        if not rt.backend.remote:
            full = _inside(work, path, job, "work dir")
            if (full / SAVED_MODEL_PB).is_file():
                return full, f"{path} (work dir)"
        # JOB:/tmp/PATH (the request's path has lost its leading slash).
        if f"/{path}/".startswith(TMP):
            full = _inside(tmp, path[len(TMP) - 1 :], job, "/tmp")
            if (full / SAVED_MODEL_PB).is_file():
                return full, f"/{path} ({SAVED_IN_TMP})"
        raise not_found(
            f"job {job.id} has no SavedModel at {path} in its artifacts or work dir, nor at"
            f" /{path} in its /tmp (no {SAVED_MODEL_PB} there)"
            if f"/{path}/".startswith(TMP)
            else f"job {job.id} has no SavedModel at {path} in its artifacts or work dir (no"
            f" {SAVED_MODEL_PB} there)"
        )
    found = sorted(
        Path(d).relative_to(artifacts).as_posix() or "."
        for d, _dirs, names in os.walk(artifacts)
        if SAVED_MODEL_PB in names
    )
    labels = list(found)
    if not found and not rt.backend.remote:
        found = _in_workdir(rt, job)
        artifacts, labels = work, [f"{d} (work dir)" for d in found]
    if not found and tmp.is_dir():
        # Named as the job saw them: JOB:/tmp/PATH serves one.
        found = [f"{TMP}{d}" for d in _in_tmp(tmp)]
        artifacts, labels = tmp, [f"{d} (its /tmp)" for d in found]
    if not found:
        held = (
            "nor did its /tmp hold one"
            if tmp.is_dir()
            else "its /tmp, where it may have saved one, was not kept"
        )
        raise not_found(
            f"job {job.id} has no SavedModel ({SAVED_MODEL_PB}) in its artifacts or work dir,"
            f" {held}; {HINT}"
        )
    if len(found) > 1:
        raise ApiError(
            409,
            ErrorCode.ambiguous,
            f"job {job.id} has {len(found)} SavedModels ({', '.join(labels[:5])});"
            f" name one as {job.id}:PATH",
            {"paths": found},
        )
    if artifacts == tmp:
        return tmp / found[0][len(TMP) :], f"{found[0]} ({SAVED_IN_TMP})"
    return artifacts / found[0], labels[0]
