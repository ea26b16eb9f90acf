"""Runs in the agent: the job store, SQLite in WAL mode, the source of truth for job state.

Every state change is one UPDATE guarded by the states it may leave, so two threads (or a
crash between two steps) can never move a job twice. GPUs in use are derived from the jobs
that hold them, never kept in a second place, so they cannot drift after a restart.

A job's settings are one JSON column (its `JobSpec`); columns added since are added to an
existing jobs.db when the store opens (see `schema.ADDED_COLUMNS`), and a jobs.db from
before the spec column is rebuilt, so an agent upgrade keeps every job it knew.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpuhop.agent.jobs.placement import Holding
from gpuhop.agent.jobs.records import (
    ACTIVE_STATES,
    FINISHED_STATES,
    AmbiguousJob,
    JobNotFound,
    JobRecord,
    KeptRecords,
    stored_spec,
)
from gpuhop.agent.jobs.schema import (
    ADDED_ATTEMPT_COLUMNS,
    ADDED_COLUMNS,
    JOBS_COLUMNS,
    LEGACY_BOOLS,
    LEGACY_JSON,
    LEGACY_SETTINGS,
    SCHEMA,
)
from gpuhop.api import EndClass, JobState
from gpuhop.api.spec import JobSpec

# What the rest of the agent imports from here (the records live in `records`).
__all__ = [
    "ACTIVE_STATES",
    "FINISHED_STATES",
    "AmbiguousJob",
    "JobNotFound",
    "JobRecord",
    "JobStore",
]


class JobStore:
    """Thread-safe access to the jobs table. One instance per agent process."""

    def __init__(self, path: Path):
        self._lock = threading.RLock()
        self._kept = KeptRecords()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._rebuild_legacy_table()
        self._db.executescript(SCHEMA)
        self._add_missing_columns()

    def _rebuild_legacy_table(self) -> None:
        """A jobs table from before `spec` (its settings in columns of their own) becomes
        today's, every job kept, its spec made of those columns; in one transaction, so a
        crash leaves the old table whole. Settings that were never columns (datasets,
        requirements, interpreter, pack) are left at their defaults: what the job resolved
        them to is in its dir's deps.json, which is what its start reads."""
        with self._lock:
            have = [row["name"] for row in self._db.execute("PRAGMA table_info(jobs)")]
            if not have or "spec" in have:
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                # SQLite's way to change a table: a new one, filled, renamed into place once
                # the old one is dropped (its indexes with it; SCHEMA makes them again).
                # Renaming the old one instead would point attempts' reference at its name.
                self._db.execute(f"CREATE TABLE new_jobs ({JOBS_COLUMNS})")
                for row in self._db.execute("SELECT * FROM jobs").fetchall():
                    old = dict(row)  # a column its table predates: None (see `.get`)
                    self._db.execute(
                        f"INSERT INTO new_jobs ({', '.join(_LEGACY_KEPT)}, spec)"
                        f" VALUES ({', '.join('?' * (len(_LEGACY_KEPT) + 1))})",
                        (*(old.get(c) for c in _LEGACY_KEPT), _legacy_spec(old)),
                    )
                self._db.execute("DROP TABLE jobs")
                self._db.execute("ALTER TABLE new_jobs RENAME TO jobs")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _add_missing_columns(self) -> None:
        with self._lock:
            have = {row["name"] for row in self._db.execute("PRAGMA table_info(jobs)")}
            for name, decl in ADDED_COLUMNS.items():
                if name not in have:
                    # Names and types come from ADDED_COLUMNS above, never from input.
                    self._db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {decl}")
            have = {row["name"] for row in self._db.execute("PRAGMA table_info(attempts)")}
            for name, decl in ADDED_ATTEMPT_COLUMNS.items():
                if name not in have:
                    self._db.execute(f"ALTER TABLE attempts ADD COLUMN {name} {decl}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @property
    def changes(self) -> int:
        """How many rows this store has written since it opened. The agent's store is the
        only writer of its file, so a query's answer at one count is its answer until the
        count moves (`services.listing` keeps `ps`'s list of jobs so)."""
        return self._db.total_changes

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, tuple(params)).fetchall()

    def _execute(self, sql: str, params: Iterable[Any] = ()) -> int:
        with self._lock:
            return self._db.execute(sql, tuple(params)).rowcount

    def create(
        self,
        command: list[str],
        spec: JobSpec,
        *,
        tree: str | None = None,
        owner: str | None = None,
        job_id: str | None = None,
        now: float | None = None,
    ) -> JobRecord:
        """Insert a queued job. With `job_id`, that id is used (and must be new)."""
        now = time.time() if now is None else now
        chosen = job_id
        with self._lock:
            while True:
                job_id = chosen or secrets.token_hex(4)
                try:
                    self._db.execute(
                        "INSERT INTO jobs (id, name, state, command, spec, priority, created_at,"
                        " owner, sweep, tree) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            job_id,
                            spec.name,
                            JobState.queued.value,
                            json.dumps(command),
                            stored_spec(spec),
                            spec.priority,
                            now,
                            owner,
                            spec.sweep,
                            tree,
                        ),
                    )
                    break
                except sqlite3.IntegrityError:
                    if chosen:
                        raise
                    continue  # id collision: draw again
        return self.get(job_id)

    def get(self, job_id: str) -> JobRecord:
        rows = self._query("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            raise JobNotFound(job_id)
        return JobRecord.from_row(rows[0])

    def resolve(self, ref: str, owner: str | None = None) -> JobRecord:
        """Find a job by full id, name (the newest job of that name), or unique id prefix,
        in that order: a job's exact name is never taken for another job's id prefix (a job
        named `A` or `bad` is that job, whatever ids start with `a` or `bad`).

        With `owner`, only that user's jobs are considered, so another user's jobs neither
        match nor make a prefix ambiguous: for that user they do not exist.
        """
        if not ref:
            raise JobNotFound(ref)
        mine, mine_params = _owned(owner)
        rows = self._query(f"SELECT * FROM jobs WHERE id = ?{mine}", (ref, *mine_params))
        if rows:
            return JobRecord.from_row(rows[0])
        rows = self._query(
            f"SELECT * FROM jobs WHERE name = ?{mine} ORDER BY created_at DESC LIMIT 1",
            (ref, *mine_params),
        )
        if rows:
            return JobRecord.from_row(rows[0])
        rows = self._query(
            f"SELECT * FROM jobs WHERE substr(id, 1, ?) = ?{mine} ORDER BY created_at",
            (len(ref), ref.lower(), *mine_params),
        )
        if len(rows) == 1:
            return JobRecord.from_row(rows[0])
        if len(rows) > 1:
            raise AmbiguousJob(ref, [r["id"] for r in rows])
        raise JobNotFound(ref)

    def named(self, name: str) -> list[tuple[str, str | None]]:
        """(id, owner) of the newest job of each owner named `name` (every user's), newest
        first."""
        rows = self._query(
            "SELECT id, owner FROM jobs WHERE name = ? ORDER BY created_at DESC", (name,)
        )
        newest: dict[str | None, str] = {}
        for row in rows:
            newest.setdefault(row["owner"], row["id"])
        return [(job_id, owner) for owner, job_id in newest.items()]

    def list(
        self,
        states: Iterable[JobState] | None = None,
        limit: int = 1000,
        owner: str | None = None,
        sweep: str | None = None,
        name: str | None = None,
    ) -> list[JobRecord]:
        """The newest jobs first; with `owner`, only that user's; with `sweep`, only its runs;
        with `name`, only those so named."""
        where: list[str] = []
        params: list[Any] = []
        if sweep is not None:
            where.append("sweep = ?")
            params.append(sweep)
        if name is not None:
            where.append("name = ?")
            params.append(name)
        if states is not None:
            values = [s.value for s in states]
            where.append(f"state IN ({','.join('?' * len(values))})")
            params += values
        if owner is not None:
            where.append("owner = ?")
            params.append(owner)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._query(
            f"SELECT * FROM jobs{clause} ORDER BY created_at DESC LIMIT ?", (*params, limit)
        )
        return self._kept.records(rows)

    def queued(self) -> Sequence[JobRecord]:
        """Every queued job, in the order the scheduler considers them (no limit: `list`
        returns the newest, and the oldest must never fall off the end)."""
        rows = self._query(
            "SELECT * FROM jobs WHERE state = ? ORDER BY priority DESC, created_at, id",
            (JobState.queued.value,),
        )
        return self._kept.records(rows)

    def states(self, job_ids: Iterable[str]) -> dict[str, tuple[JobState, str | None]]:
        """The state and end class of each of these jobs that exists."""
        ids = list(job_ids)
        if not ids:
            return {}
        rows = self._query(
            f"SELECT id, state, end_class FROM jobs WHERE id IN ({','.join('?' * len(ids))})",
            ids,
        )
        return {r["id"]: (JobState(r["state"]), r["end_class"]) for r in rows}

    def owned(self, job_ids: Iterable[str], owner: str) -> set[str]:
        """Those of these jobs that `owner` owns."""
        ids = list(job_ids)
        found: set[str] = set()
        for at in range(0, len(ids), 500):  # under SQLite's oldest limit on parameters
            part = ids[at : at + 500]
            rows = self._query(
                f"SELECT id FROM jobs WHERE owner = ? AND id IN ({','.join('?' * len(part))})",
                [owner, *part],
            )
            found.update(r["id"] for r in rows)
        return found

    def end_classes(self) -> dict[str, int]:
        """How many finished jobs ended in each class (jobs from before classes left out)."""
        rows = self._query(
            "SELECT end_class, count(*) FROM jobs WHERE end_class IS NOT NULL GROUP BY end_class"
        )
        return {r[0]: r[1] for r in rows}

    def newest_sweep(self, prefix: str, owner: str | None = None) -> str | None:
        """The newest sweep whose id is `prefix` or starts with `prefix-` (a sweep's name)."""
        mine, mine_params = _owned(owner)
        rows = self._query(
            "SELECT sweep FROM jobs WHERE (sweep = ? OR substr(sweep, 1, ?) = ?)"
            f"{mine} ORDER BY sweep = ? DESC, created_at DESC LIMIT 1",
            (prefix, len(prefix) + 1, f"{prefix}-", *mine_params, prefix),
        )
        return rows[0]["sweep"] if rows else None

    def queued_of(self, owner: str | None) -> int:
        """How many of `owner`'s jobs are queued."""
        return int(
            self._query(
                "SELECT count(*) FROM jobs WHERE state = ? AND owner IS ?",
                (JobState.queued.value, owner),
            )[0][0]
        )

    def count(self, state: JobState) -> int:
        return int(self._query("SELECT count(*) FROM jobs WHERE state = ?", (state.value,))[0][0])

    def counts(self) -> dict[JobState, int]:
        """How many jobs are in each state, every state included (0 for none)."""
        counts = dict.fromkeys(JobState, 0)
        for state, n in self._query("SELECT state, count(*) FROM jobs GROUP BY state"):
            counts[JobState(state)] = n
        return counts

    def run_times(
        self, bounds: Sequence[float]
    ) -> dict[JobState, tuple[tuple[int, ...], int, float]]:
        """Finished jobs' run times (their last attempt, start to end), by final state: the
        count at or under each of `bounds` (cumulative), the count, and the sum in seconds.
        Rows are never deleted, so each figure only grows: a Prometheus histogram."""
        le = ", ".join("total(d <= ?)" for _ in bounds)  # one placeholder per bound
        marks = ",".join("?" * len(FINISHED_STATES))
        rows = self._query(
            f"SELECT state, count(*), total(d){', ' if bounds else ''}{le} FROM"
            " (SELECT state, max(ended_at - started_at, 0) AS d FROM jobs"
            f" WHERE state IN ({marks}) AND started_at IS NOT NULL AND ended_at IS NOT NULL)"
            " GROUP BY state",
            (*bounds, *(s.value for s in FINISHED_STATES)),
        )
        return {JobState(r[0]): (tuple(int(c) for c in r[3:]), r[1], r[2]) for r in rows}

    def holdings(self) -> Sequence[Holding]:
        """What the starting and running jobs hold: their GPUs and, for shares, how much."""
        return [
            Holding(
                job.id,
                tuple(job.gpu_ids),
                job.spec.gpu_memory_mb,
                job.owner,
                job.spec.sweep,
                job.spec.name,
            )
            for job in reversed(self.list(ACTIVE_STATES))  # oldest first
        ]

    def transition(
        self, job_id: str, from_states: Iterable[JobState], to_state: JobState, **fields: Any
    ) -> bool:
        """Move a job to `to_state` if it is in one of `from_states`; set `fields` with it.

        Returns False (and changes nothing) if the job was in another state.
        """
        allowed = [s.value for s in from_states]
        sets = ["state = ?"]
        params: list[Any] = [to_state.value]
        for key, value in fields.items():
            if key not in _UPDATABLE:
                raise ValueError(f"field {key} cannot be updated")
            sets.append(f"{key} = ?")
            params.append(json.dumps(value) if key == "gpu_ids" else value)
        marks = ",".join("?" * len(allowed))
        sql = f"UPDATE jobs SET {', '.join(sets)} WHERE id = ? AND state IN ({marks})"
        return self._execute(sql, (*params, job_id, *allowed)) == 1

    def fail_queued(self, job_id: str, reason: str, end_class: EndClass) -> bool:
        """End a job that never started (still queued) as failed, for `reason`. False where
        it had left the queue meanwhile (started, cancelled)."""
        return self.transition(
            job_id,
            [JobState.queued],
            JobState.failed,
            reason=reason,
            ended_at=time.time(),
            end_class=end_class.value,
        )

    def retry(
        self,
        job: JobRecord,
        state: JobState,
        metrics: dict[str, object] | None = None,
        **outcome: Any,
    ) -> bool:
        """Record the running attempt's end as `state` (and its last `metrics` record) and
        queue the job's next attempt.

        One transaction: either the attempt is recorded and the job is queued again (GPUs
        released, attempt + 1), or nothing changes (the job had left `running`).
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                moved = self._db.execute(
                    "UPDATE jobs SET state = ?, attempt = attempt + 1, gpu_ids = '[]',"
                    " started_at = NULL, ended_at = NULL, exit_code = NULL, signal = NULL,"
                    " reason = NULL, pid = NULL, pid_start = NULL, end_class = NULL"
                    " WHERE id = ? AND state IN (?, ?) AND attempt = ?",
                    (
                        JobState.queued.value,
                        job.id,
                        JobState.starting.value,
                        JobState.running.value,
                        job.attempt,
                    ),
                ).rowcount
                if moved:
                    self._db.execute(
                        "INSERT INTO attempts (job_id, attempt, state, started_at, ended_at,"
                        " exit_code, signal, reason, end_class, metrics)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            job.id,
                            job.attempt,
                            state.value,
                            job.started_at,
                            outcome.get("ended_at"),
                            outcome.get("exit_code"),
                            outcome.get("signal"),
                            outcome.get("reason"),
                            outcome.get("end_class"),
                            None if metrics is None else json.dumps(metrics),
                        ),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return bool(moved)

    def attempts(self, job_id: str) -> Sequence[sqlite3.Row]:
        """The finished earlier attempts of a job, oldest first."""
        return self._query("SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt", (job_id,))

    def update(self, job_id: str, **fields: Any) -> None:
        """Set fields that do not change the state (pid, cancel flag)."""
        for key in fields:
            if key not in _UPDATABLE:
                raise ValueError(f"field {key} cannot be updated")
        sets = ", ".join(f"{k} = ?" for k in fields)
        values = [json.dumps(v) if k == "gpu_ids" else v for k, v in fields.items()]
        self._execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*values, job_id))


# The columns of a table from before `spec` that today's table keeps as they are.
_LEGACY_KEPT = (
    "id",
    "name",
    "state",
    "command",
    "priority",
    "gpu_ids",
    "attempt",
    "created_at",
    "started_at",
    "ended_at",
    "exit_code",
    "signal",
    "reason",
    "pid",
    "pid_start",
    "cancel_requested",
    "owner",
    "end_class",
    "sweep",
    "tree",
)


def _legacy_spec(row: dict[str, Any]) -> str:
    """The `spec` column of a job stored in the columns of an older agent."""
    settings: dict[str, Any] = {}
    for column, (name, default) in LEGACY_SETTINGS.items():
        value = row.get(column, default)
        if column in LEGACY_JSON:
            value = json.loads(value)
        elif column in LEGACY_BOOLS:
            value = bool(value)
        settings[name] = value
    return stored_spec(JobSpec.from_json(settings))


def _owned(owner: str | None) -> tuple[str, tuple[str, ...]]:
    """An SQL condition (text fixed here, value bound) restricting rows to one owner."""
    return ("", ()) if owner is None else (" AND owner = ?", (owner,))


_UPDATABLE = frozenset(
    {
        "gpu_ids",
        "started_at",
        "ended_at",
        "exit_code",
        "signal",
        "reason",
        "pid",
        "pid_start",
        "cancel_requested",
        "attempt",
        "end_class",
        "priority",
    }
)
