"""Runs in the agent: a job as the store keeps it (`JobRecord`, one row of the jobs table),
and the errors of looking one up. The store (`store.JobStore`) reads and writes them."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field

from gpuhop.api import JobState

ACTIVE_STATES = (JobState.starting, JobState.running)
FINISHED_STATES = tuple(s for s in JobState if s.finished)


def as_text(s: str) -> str:
    """`s` with anything UTF-8 cannot hold (a lone surrogate, in a record an older agent
    stored) escaped, for the store and for answers."""
    try:
        s.encode()
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode()
    return s


@dataclass
class JobRecord:
    id: str
    name: str | None
    state: JobState
    command: list[str]
    env: dict[str, str]
    gpus: int
    priority: int
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
    retries: int = 0
    workers: int = 1
    worker_timeout: int = 300
    gpu_memory_mb: int | None = None
    owner: str | None = None
    private_network: bool = False
    end_class: str | None = None
    after: list[str] = field(default_factory=list)
    after_any: bool = False
    timeout: float | None = None
    retry_on: str = "infra"
    sweep: str | None = None
    max_parallel: int | None = None
    mixed_gpus: bool = False
    notify: list[str] = field(default_factory=list)
    tree: str | None = None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> JobRecord:
        return cls(
            id=row["id"],
            name=row["name"],
            state=JobState(row["state"]),
            command=json.loads(row["command"]),
            env=json.loads(row["env"]),
            gpus=row["gpus"],
            priority=row["priority"],
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
            retries=row["retries"],
            workers=row["workers"],
            worker_timeout=row["worker_timeout"],
            gpu_memory_mb=row["gpu_memory_mb"],
            owner=row["owner"],
            private_network=bool(row["private_network"]),
            end_class=row["end_class"],
            after=json.loads(row["after_ids"]),
            after_any=bool(row["after_any"]),
            timeout=row["timeout"],
            retry_on=row["retry_on"],
            sweep=row["sweep"],
            max_parallel=row["max_parallel"],
            mixed_gpus=bool(row["mixed_gpus"]),
            notify=json.loads(row["notify"]),
            tree=row["tree"],
        )


class JobNotFound(LookupError):
    pass


class AmbiguousJob(LookupError):
    def __init__(self, ref: str, matches: list[str]):
        super().__init__(ref)
        self.ref = ref
        self.matches = matches
