"""Runs in the agent: what a job ran on (GET /v1/jobs/{ref}/provenance, for `gpuhop show`)
and what changed between two jobs (GET /v1/jobs/{ref}/diff?other=REF, `gpuhop diff`): their
trees' files, their distributions, their options and what they ran on.

Both jobs must be the caller's (or any, for an admin): another user's answers as a job that
does not exist. The trees compared are each job's own copy (kept with the job: a collected
shared tree changes nothing), read an entry at a time.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.jobs import provenance
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.services import jobs
from gpuhop.agent.storage.treefile import read_entries
from gpuhop.api.provenance import Change, JobDiff
from gpuhop.home import JobPaths


def record_of(rt: AgentContext, ref: str, caller: Caller) -> dict[str, Any]:
    job = jobs.find(rt, ref, caller)
    return {"job": job.id, **provenance.read(rt.supervisor.job_paths(job.id))}


def diff(rt: AgentContext, ref: str, other: str, caller: Caller) -> JobDiff:
    a, b = jobs.find(rt, ref, caller), jobs.find(rt, other, caller)
    jpa, jpb = rt.supervisor.job_paths(a.id), rt.supervisor.job_paths(b.id)
    out = JobDiff(a=a.id, b=b.id)
    _files(out, jpa, jpb, a, b)
    ra, rb = provenance.read(jpa), provenance.read(jpb)
    unrun = False
    for job, record in ((a, ra), (b, rb)):
        if job.started_at is None and not record["host_recorded"]:
            unrun = True  # queued, or cancelled before it started: it ran on nothing yet
            out.unknown.append(
                f"job {job.id} has not started ({job.state.value}), so what it ran on is not known"
            )
        elif not record["recorded"]:
            out.unknown.append(
                f"job {job.id} has no record of its Python and packages (it ran no Python,"
                " turned gpuhop's start-up hook off, ended within a moment of its start,"
                " before the record was written, or ran before gpuhop kept one)"
            )
    if ra["recorded"] and rb["recorded"]:
        out.packages = _changes(ra["packages"], rb["packages"])
    out.options = _changes(_options(a), _options(b))
    if not unrun:  # else each line would be the other's value against "(none)"
        out.ran_on = _changes(_ran_on(ra), _ran_on(rb))
    return out


def _files(out: JobDiff, jpa: JobPaths, jpb: JobPaths, a: JobRecord, b: JobRecord) -> None:
    files_a, files_b = _tree(jpa), _tree(jpb)
    for job, files in ((a, files_a), (b, files_b)):
        if files is None and job.tree is not None:
            out.unknown.append(f"job {job.id}'s files: its copy of its tree is gone")
    if files_a is None or files_b is None:
        return
    out.files_added = sorted(files_b.keys() - files_a.keys())
    out.files_removed = sorted(files_a.keys() - files_b.keys())
    both = files_a.keys() & files_b.keys()
    out.files_changed = sorted(p for p in both if files_a[p] != files_b[p])


def _tree(jp: JobPaths) -> dict[str, tuple[str, bool]] | None:
    """Path -> (digest, executable) of the job's tree; {} for a job without one, None where
    its copy cannot be read."""
    if not jp.tree.exists():
        return {} if jp.root.is_dir() else None
    try:
        with open(jp.tree, "rb") as f:
            return {e["path"]: (e["digest"], bool(e.get("executable"))) for e in read_entries(f)}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _options(job: JobRecord) -> dict[str, str]:
    """The job's command and spec, one entry a field (an env variable, each of its own). The
    command as a shell would take it (as `ps` shows it); a field without a value (no name)
    has no entry, shown as "(none)"."""
    spec = job.spec.to_json()
    env = spec.pop("env")
    flat = {"command": shlex.join(job.command)}
    flat.update((name, _text(value)) for name, value in spec.items() if value is not None)
    flat.update((f"env {name}", value) for name, value in env.items())
    return flat


def _ran_on(record: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    python = record.get("python")
    if isinstance(python, dict):
        out["python"] = f"{python.get('implementation')} {python.get('version')}"
    platform = record.get("platform")
    if isinstance(platform, dict):
        out["platform"] = " ".join(str(platform.get(k)) for k in ("system", "release", "machine"))
    build = record.get("tensorflow_build")
    if isinstance(build, dict):
        out.update((f"tensorflow {key}", _text(value)) for key, value in build.items())
    gpus = record.get("gpus")
    if isinstance(gpus, list):
        out["gpus"] = ", ".join(f"{g['index']}: {g['name']}" for g in gpus) or "none (CPU)"
    for key in ("driver", "cuda", "gpuhop", "host", "backend"):
        if record.get(key) is not None:
            out[key] = str(record[key])
    for source in record.get("data") or []:  # a bucket's objects changed: another listing
        out[f"data {source.get('name')}"] = f"{source.get('url')} listing {source['listing'][:12]}"
    return out


def _changes(a: Mapping[str, str], b: Mapping[str, str]) -> list[Change]:
    return [
        Change(what=key, a=a.get(key), b=b.get(key))
        for key in sorted(a.keys() | b.keys())
        if a.get(key) != b.get(key)
    ]


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)
