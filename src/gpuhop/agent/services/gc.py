"""Runs in the agent: garbage collection and retention (`gpuhop gc`, and on a timer).

What goes, in this order:

1. **Finished jobs' files past retention.** A finished job's dir is emptied when it ended
   more than `keep_days` ago *and* at least `keep_jobs` newer finished jobs exist. Its row
   in jobs.db stays (`gpuhop ps`/`show` still list it) and a `pruned.json` marker stays in
   its dir, written first, so asking for its log or artifacts answers 410 with when and
   why; so does its GPU energy record (`energy.json`, a few hundred bytes). Finished
   states are terminal (a retried attempt goes from running to queued and never through a
   finished state), so a job that is queued, starting or running is never pruned; nor is
   one whose SavedModel such a job serves (mounted in its work dir, see
   `gpuhop.agent.services.serving`). Job dirs that no row owns (a submission that crashed
   half way) go once older than the grace period.
2. **Trees** in trees/ that no remaining job dir holds a copy of, and their checkouts.
3. **Blobs** that no remaining job's tree, no kept tree and no dataset version names.
   Blobs are what a queued job (or the next attempt of a running one) is materialised
   from; its dir keeps a copy of its tree, so they stay while the job is not pruned.
4. **Temp files** of uploads that a crash interrupted, dataset chunks staged for a push
   that never came (see `chunkstore`), partial bucket objects no fetch went on with, and
   **environments** that no queued or running job uses and none used for `env_keep_days`.
5. **Cached bucket prefixes** (`--data s3://...`, see `objectcache`) that no queued or
   running job needs and none used for `object_keep_days`, and the objects only they held.
   The blobs the object cache holds are kept by step 3.
6. **Container images** gpuhop pulled that no queued or running job needs and
   none used for `image_keep_days`, then the least recently used while gpuhop's images pass
   `image_quota` (see `gpuhop.agent.services.images`); never an image put there by hand.

Why an upload in progress loses nothing: blobs and trees that were asked about (`missing`,
a job's tree check), uploaded again or stored within the grace period (default an hour)
are never removed, and the check and the removal take the same lock (see
`BlobStore.remove`). A tree kept that way keeps its blobs. Past the grace period, a
client whose blob or tree did vanish gets 409 missing_blobs/missing_tree and sends it
again (`Client.submit` does this once).

Why a job submitted meanwhile loses nothing: what steps 1, 4 (environments) and 6 decide
from, the queued and running jobs and what they use, is asked and acted on holding
`AgentContext.uses` exclusive; a submission holds it shared from its first look at what its
job will use (a model server's source job, its environment) until its row exists (see
`gpuhop.agent.storage.uses`). So either gc sees the new job, or the submission looks only
once gc is done: a model server of a job pruned meanwhile is refused (410), an environment
removed meanwhile is built again. The rest (trees, blobs, temp files, the object cache) is
collected without it: blobs and trees have the grace period above, and the object cache
keeps what `Fetches.keep` names.

Claims (`claims.db`) of removed blobs, trees and dataset chunks are removed with them: a
claim is kept only for what is stored, so `claims.db` does not grow without bound.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

from gpuhop.agent.config import Policy
from gpuhop.agent.context import AgentContext
from gpuhop.agent.jobs.store import JobNotFound
from gpuhop.agent.services import images
from gpuhop.agent.services.deps import in_use
from gpuhop.agent.storage.references import dataset_chunks, job_references
from gpuhop.agent.storage.usage import tree_bytes
from gpuhop.api import JobState
from gpuhop.api.upkeep import Freed, GcReport
from gpuhop.home import JobPaths

log = logging.getLogger("gpuhop.agent.services.gc")

PRUNED = "pruned.json"
FINISHED = [s for s in JobState if s.finished]


def pruned(jp: JobPaths) -> dict | None:
    """The marker of a job whose files retention removed, or None."""
    try:
        data = json.loads((jp.root / PRUNED).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def collect(
    rt: AgentContext, policy: Policy, *, dry_run: bool = False, now: float | None = None
) -> GcReport:
    """One collection. With `dry_run`, nothing is removed: the report says what would be."""
    now = time.time() if now is None else now
    cutoff = now - policy.grace_seconds
    with rt.gc_lock:
        kinds = ("jobs", "trees", "blobs", "temp", "envs", "objects", "images")
        freed = {kind: Freed() for kind in kinds}
        with rt.uses.exclusive("garbage collection"):  # what queued jobs use: see the docstring
            gone = _prune_jobs(rt, policy, now, cutoff, dry_run, freed["jobs"])
        job_trees, live_blobs = job_references(rt.paths.jobs, gone)
        removed_trees = []
        for digest in rt.trees.digests():
            if digest in job_trees:
                continue
            size = rt.trees.remove(digest, cutoff, dry_run)
            if size is None:  # kept: recently asked about or stored, so its blobs stay too
                with contextlib.suppress(OSError, ValueError, KeyError):
                    live_blobs.update(e["digest"] for e in rt.trees.entries(digest))
                continue
            removed_trees.append(digest)
            _add(freed["trees"], size)
        if not dry_run:
            # A checkout is the materialised copy of its tree, which no job needs any more.
            kept = set(rt.trees.digests())
            for digest in rt.checkouts.digests():
                if digest not in kept:
                    rt.checkouts.remove(digest)
        live_blobs |= dataset_chunks(rt.datasets) | rt.objects.shas()
        # Listed before anything is looked at: a claim comes after what it is about is
        # stored, so one made from here on is about something kept, and is left alone.
        claimed = [] if dry_run else rt.claims.digests("blob")
        kept_blobs = set()
        for digest in rt.blobs.digests():
            size = None if digest in live_blobs else rt.blobs.remove(digest, cutoff, dry_run)
            if size is None:
                kept_blobs.add(digest)
            else:
                _add(freed["blobs"], size)
        _sweep_temp(rt.paths.tmp, cutoff, dry_run, freed["temp"])
        for size in rt.datasets.sweep_leftovers(cutoff, dry_run):
            _add(freed["temp"], size)
        for size in rt.datasets.chunks.sweep(cutoff, dry_run):  # of pushes never finished
            _add(freed["temp"], size)
        with rt.uses.exclusive("garbage collection"):
            _remove_envs(rt, policy, now, dry_run, freed["envs"])
        for size in rt.objects.downloads.sweep(cutoff, dry_run):
            _add(freed["temp"], size)
        prefixes, size = rt.objects.collect(
            rt.fetches.keep(),
            now - policy.object_keep_days * 86400,
            lambda: job_references(rt.paths.jobs, gone)[1] | dataset_chunks(rt.datasets),
            dry_run,
        )
        freed["objects"].count += prefixes
        freed["objects"].bytes += size
        with rt.uses.exclusive("garbage collection"):
            images.collect(rt, policy, now, dry_run, freed["images"])
        if not dry_run:
            # Claims of what is no longer kept: removed blobs, and the chunks of removed
            # dataset versions (kept in their files, not as blobs: see chunkstore).
            held = kept_blobs | rt.datasets.chunks.held()
            rt.claims.forget("blob", [d for d in claimed if d not in held])
            rt.claims.forget("tree", removed_trees)
            rt.meter.invalidate()
    report = GcReport(dry_run=dry_run, freed=freed, pruned_jobs=gone, usage=rt.meter.usage())
    if not dry_run and report.total_bytes:
        log.info(
            "collected %s",
            ", ".join(f"{f.count} {k} ({f.bytes} bytes)" for k, f in freed.items() if f.count),
        )
    return report


def _add(tally: Freed, size: int) -> None:
    tally.count += 1
    tally.bytes += size


def _prune_jobs(
    rt: AgentContext, policy: Policy, now: float, cutoff: float, dry_run: bool, tally: Freed
) -> list[str]:
    """Empty the dirs of finished jobs past retention; remove dirs no job owns."""
    finished = rt.store.list(FINISHED, limit=10**9)  # newest first
    known = {j.id for j in rt.store.list(limit=10**9)}
    oldest_kept = now - policy.keep_days * 86400
    # What model servers that are queued or running see of other jobs' files.
    mounted = [Path(m["source"]) for _job, deps in in_use(rt) for m in deps.get("mounts", [])]
    gone = []
    for rank, job in enumerate(finished):
        if rank < policy.keep_jobs or (job.ended_at or job.created_at) > oldest_kept:
            continue
        jp = rt.supervisor.job_paths(job.id)
        if not jp.root.is_dir() or any(m.is_relative_to(jp.root.resolve()) for m in mounted):
            continue
        if pruned(jp) is not None:
            # Pruned: the marker is written first (readers see it at once), then the rest
            # goes. What a collection stopped half-way left goes now.
            if not dry_run:
                _empty_but_marker(jp.root)
            continue
        if rt.store.get(job.id).state not in FINISHED:
            continue  # cannot happen (finished is terminal); checked anyway
        size = tree_bytes(jp.root)
        if not dry_run:
            marker = {
                "pruned_at": now,
                "bytes": size,
                "why": f"it ended over {policy.keep_days:g} days ago and {policy.keep_jobs}"
                " newer finished jobs exist",
            }
            (jp.root / PRUNED).write_text(json.dumps(marker))
            _empty_but_marker(jp.root)
        gone.append(job.id)
        _add(tally, size)
    for folder in rt.paths.jobs.iterdir() if rt.paths.jobs.is_dir() else ():
        if folder.name in known:
            continue
        try:
            young = folder.lstat().st_mtime >= cutoff
        except OSError:
            continue
        # No row yet: a submission writing it right now (young), or one that crashed.
        if not young and not _has_row(rt, folder.name):
            size = tree_bytes(folder)
            if not dry_run:
                _remove(folder)
            _add(tally, size)
    return gone


def _empty_but_marker(root: Path) -> None:
    # The job's GPU energy stays with its record: a few hundred bytes, for its accounts.
    kept = {PRUNED, JobPaths(root).energy.name}
    for child in root.iterdir():
        if child.name not in kept:
            _remove(child)


def _has_row(rt: AgentContext, job_id: str) -> bool:
    try:
        rt.store.get(job_id)
    except JobNotFound:
        return False
    return True


def _sweep_temp(tmp: Path, cutoff: float, dry_run: bool, tally: Freed) -> None:
    for path in tmp.iterdir() if tmp.is_dir() else ():
        try:
            st = path.lstat()
        except OSError:
            continue
        if st.st_mtime < cutoff:
            if not dry_run:
                _remove(path)
            _add(tally, st.st_size)


def _remove_envs(rt: AgentContext, policy: Policy, now: float, dry_run: bool, tally: Freed) -> None:
    used = {deps["env"]["id"] for _job, deps in in_use(rt) if deps.get("env")}
    for env_id in rt.envs.ids():
        if env_id in used or now - rt.envs.last_used(env_id) <= policy.env_keep_days * 86400:
            continue
        size = rt.envs.info(env_id, []).size
        if dry_run or rt.envs.remove(env_id):
            _add(tally, size)


def _remove(path: Path) -> None:
    """Remove a file or a tree, including read-only dirs that a job left behind."""
    if path.is_dir() and not path.is_symlink():
        for dirpath, _dirs, _files in os.walk(path):
            with contextlib.suppress(OSError):
                os.chmod(dirpath, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
