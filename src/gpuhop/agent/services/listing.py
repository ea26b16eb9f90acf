"""Runs in the agent: `ps`'s answer (GET /v1/jobs), each job's JSON kept until what it
shows changes.

Under load `ps` lists dozens of jobs that have not changed since the last `ps`: most are
queued. Building each one's JobInfo (pydantic) and serialising it again cost more than the
rest of the request, so each job's JSON is kept with the inputs it was made from (its
record, and for a job that has run, the files of its dir that the answer reads) and made
again only when one of them differs. The list of jobs a query finds is kept too, until the
job store writes anything, and with it the answer's bytes: while the store writes nothing and
the scheduler's word on the listed queued jobs is the same, a queued job's JSON is the same
(nothing else it shows can change: see `_inputs`), so only the jobs that are not queued are
looked at again, and the kept bytes are the answer if none of theirs changed. The answer is
the same bytes `to_info` and FastAPI would give: the JSON of each JobInfo, joined into a list.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import TypeAdapter

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.services import gc, queue
from gpuhop.agent.services.jobs import resolve_sweep, to_info
from gpuhop.api import JobInfo, JobState
from gpuhop.api.states import MAX_JOBS_LISTED
from gpuhop.backends import jobdeps
from gpuhop.home import JobPaths

# Jobs whose answers are kept, the most recently listed: ten default `ps` (200 jobs each).
# A longer listing is answered all the same, making again what it evicted.
# GET /v1/jobs's bounds, for its route and its fast path alike (server.routers.jobs, fastjobs).
MAX_LIMIT = MAX_JOBS_LISTED
DEFAULT_LIMIT = 200
MAX_SWEEP = 80
MAX_FIELDS = 2_000
KEPT = 2_000
_INFO = TypeAdapter(JobInfo)
# Queries whose jobs are kept (owner, states, limit, sweep, fields): a few users' `ps` and
# `top`.
KEPT_LISTS = 64
# Field sets whose answers are kept per job (`ps`'s, `top`'s, a script's few).
KEPT_SUBSETS = 8
# The fields of JobInfo an answer is made of; None: all of them.
Fields = frozenset[str] | None
_LOG_SIZE = "log_size"


@dataclass
class _Answer:
    """A query's answer at one count of the store's changes (`JobStore.changes`)."""

    changes: int
    jobs: list[JobRecord]  # what the query found, newest first
    waiting: dict[str, str]  # the scheduler's `rt.scheduler.waiting` then
    said: list[str | None]  # its word on each queued job of `jobs` then
    parts: list[bytes]  # each job's JSON, as `Listing.json` gave it
    body: bytes  # the answer: `parts` as a JSON list


@dataclass
class _Kept:
    job: JobRecord  # the store's record of the job (the same object while its row is)
    inputs: tuple[object, ...]  # the rest the answer was made from but its log (`_inputs`)
    log_size: int | None  # its log's size then; None: not looked at (a queued job)
    info: JobInfo
    data: bytes  # `info` as JSON
    # `data` around its log size's digits, found the first time only the log grew (`_around`);
    # () where they cannot be told from the rest.
    around: tuple[bytes, ...] | None = None
    # The answers of chosen fields only (`Listing.json`'s `fields`), made as asked.
    subsets: dict[frozenset[str], bytes] = field(default_factory=dict)


class Listing:
    """Each job's JobInfo as JSON, with the inputs it was made from. Safe from any thread."""

    def __init__(self, kept: int = KEPT):
        self.kept = kept
        self._lock = threading.Lock()
        self._jobs: OrderedDict[str, _Kept] = OrderedDict()
        # Each recent query's answer, with the jobs it found and the store's count then.
        self._lists: OrderedDict[tuple[object, ...], _Answer] = OrderedDict()
        self._dirs = _Dirs(kept)

    def json(self, rt: AgentContext, job: JobRecord, fields: Fields = None) -> bytes:
        """The job's JobInfo as JSON, as FastAPI would serialise it; where `fields` are
        given (`ps` asks for its columns), only those of them that are not null, in
        JobInfo's order: a short answer, quick to send and to parse."""
        kept = self._entry(rt, job, log=fields is None or _LOG_SIZE in fields)
        if fields is None:
            return kept.data
        data = kept.subsets.get(fields)
        if data is None:
            info = kept.info
            if kept.log_size is not None and info.log_size != kept.log_size:
                info = info.model_copy(update={"log_size": kept.log_size})  # see `_entry`
            data = _INFO.dump_json(info, by_alias=True, include=set(fields), exclude_none=True)
            if len(kept.subsets) >= KEPT_SUBSETS:  # a caller asking for ever new sets
                kept.subsets = {}
            kept.subsets[fields] = data  # a dict's one store: safe from any thread
        return data

    def _entry(self, rt: AgentContext, job: JobRecord, log: bool = True) -> _Kept:
        """The job's kept answer, made again where what it was made from changed; without
        `log`, its log's size is not looked at (kept as it was), for fields without it."""
        inputs, log_size = _inputs(rt, job, self._dirs, log)
        with self._lock:
            kept = self._jobs.get(job.id)
        # The store gives the same record for a row that has not changed (`KeptRecords`).
        info = None
        if kept is not None and kept.job is job and kept.inputs == inputs:
            if kept.log_size == log_size or not log:
                return kept
            if log_size is not None and kept.log_size is not None:
                # Only its log grew (a running job, between two `ps`): the answer but that,
                # its digits put in place of the old ones; `kept.info` keeps the old size.
                # The answers of fields without the log size stay the same bytes.
                around = kept.around if kept.around is not None else _around(kept.info)
                if around:
                    data = around[0] + b"%d" % log_size + around[1]
                    same = {f: d for f, d in kept.subsets.items() if _LOG_SIZE not in f}
                    return self._keep(_Kept(job, inputs, log_size, kept.info, data, around, same))
                info = kept.info.model_copy(update={"log_size": log_size})
        if info is None:
            info = to_info(rt, job)
            if not log and job.state is not JobState.queued:
                log_size = info.log_size  # as `to_info` found it
        # FastAPI's own serialisation of a response model (by alias, nothing excluded).
        data = _INFO.dump_json(info, by_alias=True)
        return self._keep(_Kept(job, inputs, log_size, info, data))

    def _keep(self, kept: _Kept) -> _Kept:
        with self._lock:
            self._jobs[kept.job.id] = kept
            self._jobs.move_to_end(kept.job.id)
            while len(self._jobs) > self.kept:
                self._jobs.popitem(last=False)
        return kept

    def list_json(
        self,
        rt: AgentContext,
        caller: Caller,
        states: list[JobState] | None,
        limit: int,
        sweep: str | None = None,
        fields: Fields = None,
    ) -> bytes:
        """`jobs.list_jobs`'s answer as a JSON list: the newest jobs `caller` may see, each
        with only `fields` where they are given."""
        owner = caller.owner_filter
        key = (owner, None if states is None else tuple(states), limit, sweep, fields)
        # Read before the query: a row written meanwhile moves it, and the next call asks again.
        changes = rt.store.changes
        waiting = rt.scheduler.waiting  # the scheduler puts a new dict there on each pass
        with self._lock:
            kept = self._lists.get(key)
        if kept is not None and kept.changes == changes:
            jobs = kept.jobs
            if waiting is not kept.waiting:
                if _said(waiting, jobs) != kept.said:
                    kept = None  # a queued job's wait, as the scheduler sees it, changed
                else:
                    kept.waiting = waiting  # a new pass, the same word: compared once
        else:
            found = resolve_sweep(rt, sweep, owner)
            jobs = rt.store.list(states, limit, owner=owner, sweep=found)
            kept = None
        if kept is not None:
            # Only what is not queued can change under the same count: a running job's log,
            # metrics and marker files, a finished job's pruning.
            parts = kept.parts
            for i, job in enumerate(jobs):
                if (
                    job.state is not JobState.queued
                    and (data := self.json(rt, job, fields)) is not parts[i]
                ):
                    parts = parts.copy() if parts is kept.parts else parts
                    parts[i] = data
            if parts is kept.parts:
                return kept.body
        else:
            parts = [self.json(rt, job, fields) for job in jobs]
        body = b"[" + b",".join(parts) + b"]"
        answer = _Answer(changes, jobs, waiting, _said(waiting, jobs), parts, body)
        with self._lock:
            self._lists[key] = answer
            self._lists.move_to_end(key)
            while len(self._lists) > KEPT_LISTS:
                self._lists.popitem(last=False)
        return body


def parse_fields(text: str) -> frozenset[str]:
    """`fields` of GET /v1/jobs: JobInfo's field names, comma-separated (`id,state`).
    ValueError naming the first that is not one."""
    names = text.split(",")
    for name in names:
        if name not in JobInfo.model_fields:
            known = ", ".join(JobInfo.model_fields)
            raise ValueError(f"fields: {name!r} is not a field of a job (they are: {known})")
    return frozenset(names)


def _said(waiting: dict[str, str], jobs: list[JobRecord]) -> list[str | None]:
    """The scheduler's word on each queued job of `jobs` (why it waits), in order."""
    return [waiting.get(job.id) for job in jobs if job.state is JobState.queued]


# A log size no job has: where it stands in a job's JSON is where its log size goes.
_PROBE = 987_654_321_987_654_321
_PROBED = b'"log_size":%d' % _PROBE


def _around(info: JobInfo) -> tuple[bytes, ...]:
    """The job's JSON before and after its log size's digits, as two pieces; () where the
    probe's digits show up twice (a metric of that name and value), to be safe."""
    probe = _INFO.dump_json(info.model_copy(update={"log_size": _PROBE}), by_alias=True)
    if probe.count(_PROBED) != 1:
        return ()
    at = probe.index(_PROBED) + len(b'"log_size":')
    return probe[:at], probe[at + len(b"%d" % _PROBE) :]


_ANY = JobPaths(Path("job"))
# The files of a job's dir whose contents its JobInfo shows (see `jobs.to_info`); the other
# names there count too, by their presence (a backend's marker of where the job ran).
_LOG = _ANY.log.name
_READ = frozenset({_LOG, _ANY.metrics.name, gc.PRUNED, jobdeps.path(_ANY).name, _ANY.energy.name})


class _Dirs:
    """Running jobs' dirs as `_inputs` reads them: each one's path as text, and the names in
    it, listed again only when the dir's mtime moved (or is too recent to tell)."""

    # A name made within the same tick of the filesystem's clock as the last listing leaves
    # the dir's mtime as it was: a listing that recent is not relied on (as git does with
    # its index's "racy" entries).
    RACY_NS = 50_000_000

    def __init__(self, kept: int):
        self.kept = kept
        self._paths: dict[str, tuple[JobPaths, str]] = {}
        self._names: dict[str, tuple[int, frozenset[str]]] = {}

    def paths(self, rt: AgentContext, job_id: str) -> tuple[JobPaths, str]:
        """The job's paths, and its dir as text (pathlib's joins cost more than a stat)."""
        found = self._paths.get(job_id)
        if found is None:
            if len(self._paths) > self.kept:
                self._paths.clear()
            jp = rt.supervisor.job_paths(job_id)
            found = self._paths[job_id] = (jp, os.fspath(jp.root) + os.sep)
        return found

    def names(self, root: str) -> frozenset[str]:
        try:
            mtime = os.stat(root).st_mtime_ns
        except OSError:
            return frozenset()
        seen = self._names.get(root)
        if seen is not None and seen[0] == mtime and time.time_ns() - mtime > self.RACY_NS:
            return seen[1]
        try:
            names = frozenset(os.listdir(root))
        except OSError:
            return frozenset()
        if len(self._names) > self.kept:
            self._names.clear()
        self._names[root] = (mtime, names)
        return names


def _inputs(
    rt: AgentContext, job: JobRecord, dirs: _Dirs, log: bool = True
) -> tuple[tuple[object, ...], int | None]:
    """What the job's JobInfo is made of besides its record and the agent's fixed
    settings; and apart, its log's size (None where the log is not looked at: a queued
    job's, or any where not `log`)."""
    # For a queued job, what it waits for: the scheduler's word, its dependencies.
    record = (rt.scheduler.waiting.get(job.id), queue.waiting_for(rt, job))
    if job.state is JobState.queued:
        # A queued job's files are those it was submitted with, and, for one queued again
        # for a retry, its last attempt's: nothing writes them until it starts (its record
        # changes then), and retention prunes only finished jobs.
        return record, None
    jp, root = dirs.paths(rt, job.id)
    names = dirs.names(root)
    files = []
    log_size = None
    for name in sorted(names & _READ):
        if name == _LOG and not log:
            continue
        try:
            st = os.stat(root + name)
        except OSError:
            continue
        if name == _LOG:
            log_size = st.st_size  # all the answer shows of the log
        else:
            files.append((name, st.st_size, st.st_mtime_ns))
    waiting = rt.backend.waiting(jp) if job.state in (JobState.starting, JobState.running) else None
    return (*record, names, tuple(files), waiting), log_size
