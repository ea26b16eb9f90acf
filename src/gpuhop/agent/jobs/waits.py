"""Runs in the agent: why each queued GPU job waits, in the words its owner reads in `run`'s
status line, `show`, `ps` and the dashboard: "2nd in line; waits for 1 GPU; held by live2,
hog". Its place in line comes first, so that a narrow `ps` column cut at its end keeps it.

Pure, as `placement` is: the scheduler passes one pass's queue, what the started jobs hold
and what the pass placed, and serves the words with each job (`JobInfo.waiting`); no view
makes them again. A holder is named (by its name, else its id) only where it is the waiting
job's owner's own; another user's is "another user's job", as a user sees no other user's
jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuhop.agent.jobs.placement import (
    Holding,
    Pending,
    Placement,
    could_ever_fit,
    queue_order,
)
from gpuhop.api.sizes import format_mb

# Holders named in full; more are counted ("+2 more").
NAMED = 3


def said(
    pending: Iterable[Pending],
    placed: Sequence[Placement],
    holdings: Iterable[Holding],
    gpus: Mapping[int, int],
    limited: Mapping[str, str],
    in_line: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Why each queued GPU job that this pass did not place waits, by job id. `gpus` maps
    each GPU to its memory in MB; `limited`: the jobs that wait on a limit, with `plan`'s
    reason (theirs stands, and they take no place in line: they hold up nobody); `in_line`:
    `plan`'s reason for a job that waits in line on more than busy GPUs (GPUs of one model),
    said in place of what it needs."""
    in_line = in_line or {}
    queue = sorted(pending, key=queue_order)
    by_id = {job.job_id: job for job in queue}
    started = {p.job_id for p in placed}
    # What this pass placed holds its GPUs from now on, as a started job does.
    held = [h for h in holdings if h.gpu_ids] + [
        Holding(
            p.job_id,
            p.gpu_ids,
            by_id[p.job_id].spec.gpu_memory_mb,
            by_id[p.job_id].owner,
            name=by_id[p.job_id].spec.name,
        )
        for p in placed
        if p.gpu_ids
    ]
    out: dict[str, str] = {}
    place = 0
    for job in queue:
        gpu_job = job.spec.gpus > 0 or job.spec.gpu_memory_mb is not None
        if not gpu_job or job.job_id in started or job.job_id in limited:
            continue
        if not could_ever_fit(job, gpus):
            continue  # the scheduler fails it
        place += 1
        text = f"{ordinal(place)} in line; {in_line.get(job.job_id) or 'waits for ' + needs(job)}"
        usable = {g for g, mb in gpus.items() if mb >= (job.spec.gpu_memory_mb or 0)}
        holders = [h for h in held if usable.intersection(h.gpu_ids)]
        if holders:
            text += f"; held by {named(holders, job.owner)}"
        out[job.job_id] = text
    return out


def needs(job: Pending) -> str:
    """What a GPU job asks for: "1 GPU", "2 GPUs", "a 4 GiB share of a GPU"."""
    if job.spec.gpu_memory_mb is not None:
        return f"a {format_mb(job.spec.gpu_memory_mb)} share of a GPU"
    return "1 GPU" if job.spec.gpus == 1 else f"{job.spec.gpus} GPUs"


def named(holders: Sequence[Holding], viewer: str | None) -> str:
    """The holders as `viewer` (the waiting job's owner) may know them, oldest first: their
    own by name (or id), up to NAMED of them; other users' counted, never named."""
    own = list(dict.fromkeys(h.name or h.job_id for h in holders if h.owner == viewer))
    others = len({h.job_id for h in holders if h.owner != viewer})
    parts = own[:NAMED]
    if len(own) > NAMED:
        parts.append(f"+{len(own) - NAMED} more")
    if others:
        parts.append("another user's job" if others == 1 else f"{others} jobs of other users")
    return ", ".join(parts)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
