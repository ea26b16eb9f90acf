"""Runs in the agent: a job as the store keeps it (`JobRecord`, one row of the jobs table),
and the errors of looking one up. The store (`store.JobStore`) reads and writes them."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from gpuhop.api import JobState
from gpuhop.api.spec import JobSpec

ACTIVE_STATES = (JobState.starting, JobState.running)
FINISHED_STATES = tuple(s for s in JobState if s.finished)
# How a notebook server is started (gpuhop.runtime.notebook; the agent does not import it).
NOTEBOOK_SERVER = ["-m", "gpuhop.runtime.notebook", "serve"]


def is_notebook_server(command: list[str]) -> bool:
    """Whether a job's command starts JupyterLab (`gpuhop notebook`)."""
    return command[: len(NOTEBOOK_SERVER)] == NOTEBOOK_SERVER


def as_text(s: str) -> str:
    """`s` with anything UTF-8 cannot hold (a lone surrogate, in a record an older agent
    stored) escaped, for the store and for answers."""
    try:
        s.encode()
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode()
    return s


# The settings kept in columns of their own (see `schema`), not in the stored spec.
COLUMN_SETTINGS = ("name", "priority", "sweep")


def stored_spec(spec: JobSpec) -> str:
    """The spec as the `spec` column holds it: without the settings that are columns, and
    without those at their defaults (`JobSpec.from_json` gives them back). The scheduler
    reads every queued job's row each pass: a short one reads (and compares) faster."""
    asked = spec.non_default()
    return json.dumps({name: value for name, value in asked.items() if name not in COLUMN_SETTINGS})


# Never changed once made: the store hands the same record to every reader of a row that
# has not changed (`KeptRecords`). A new state is a new row, read again.
@dataclass
class JobRecord:
    """One job as the store keeps it: what it asked for (`spec`), what it runs in which files
    (`command`, `tree`), and where its current attempt stands."""

    id: str
    state: JobState
    command: list[str]
    spec: JobSpec
    gpu_ids: list[int]
    attempt: int
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    pid: int | None = None
    pid_start: str | None = None
    cancel_requested: bool = False
    owner: str | None = None
    end_class: str | None = None
    tree: str | None = None

    @classmethod
    def from_row(cls, stored: sqlite3.Row) -> JobRecord:
        # A Row finds a column by name by comparing it with each column's name in turn: one
        # dict first makes the scheduler's pass over hundreds of queued jobs twice as fast.
        row = dict(zip(stored.keys(), stored, strict=True))
        settings = json.loads(row["spec"])
        for name in COLUMN_SETTINGS:
            settings[name] = row[name]
        return cls(
            id=row["id"],
            state=JobState(row["state"]),
            command=json.loads(row["command"]),
            spec=JobSpec.from_json(settings),
            gpu_ids=json.loads(row["gpu_ids"]),
            attempt=row["attempt"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            exit_code=row["exit_code"],
            signal=row["signal"],
            reason=row["reason"],
            pid=row["pid"],
            pid_start=row["pid_start"],
            cancel_requested=bool(row["cancel_requested"]),
            owner=row["owner"],
            end_class=row["end_class"],
            tree=row["tree"],
        )


class KeptRecords:
    """The record made of each job's row, kept while the row stays the same: the scheduler's
    pass over every queued job, each second, and `ps` make a record only of a row that
    changed. The `kept` rows read most recently are kept. Safe from any thread."""

    def __init__(self, kept: int = 5_000):
        self.kept = kept
        self._lock = threading.Lock()
        self._records: OrderedDict[str, tuple[tuple[object, ...], JobRecord]] = OrderedDict()

    def records(self, rows: Iterable[sqlite3.Row]) -> list[JobRecord]:
        out = []
        for row in rows:
            values = tuple(row)
            with self._lock:
                kept = self._records.get(row["id"])
            if kept is not None and kept[0] == values:
                out.append(kept[1])
                continue
            record = JobRecord.from_row(row)
            with self._lock:
                self._records[record.id] = (values, record)
                self._records.move_to_end(record.id)
                while len(self._records) > self.kept:
                    self._records.popitem(last=False)
            out.append(record)
        return out


class JobNotFound(LookupError):
    pass


class AmbiguousJob(LookupError):
    def __init__(self, ref: str, matches: list[str]):
        super().__init__(ref)
        self.ref = ref
        self.matches = matches
