"""The job store on a real SQLite file: lookups, guarded state changes, GPUs in use."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.agent.jobs.placement import Holding
from gpuhop.agent.jobs.records import stored_spec
from gpuhop.agent.jobs.store import AmbiguousJob, JobNotFound, JobRecord, JobStore
from gpuhop.api import JobState
from gpuhop.api.spec import JobSpec, Mount

Q, S, R = JobState.queued, JobState.starting, JobState.running


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore(tmp_path / "jobs.db")
    try:
        yield s
    finally:
        s.close()


def new_job(
    store: JobStore, now: float = 1000.0, name: str | None = None, gpus: int = 0
) -> JobRecord:
    spec = JobSpec(env={"SEED": "1"}, gpus=gpus, priority=2, name=name)
    return store.create(["train.py", "--epochs", "3"], spec, now=now)


def test_create_then_get_round_trips_every_field(store: JobStore):
    created = new_job(store, now=1234.5, name="train", gpus=2)

    got = store.get(created.id)

    assert got == created
    assert len(got.id) == 8 and int(got.id, 16) >= 0
    assert (got.spec.name, got.state, got.command, got.spec.env) == (
        "train",
        JobState.queued,
        ["train.py", "--epochs", "3"],
        {"SEED": "1"},
    )
    assert (got.spec.gpus, got.spec.priority, got.gpu_ids, got.attempt, got.created_at) == (
        2,
        2,
        [],
        1,
        1234.5,
    )
    assert (got.pid, got.started_at, got.ended_at, got.cancel_requested) == (
        None,
        None,
        None,
        False,
    )


def test_jobs_survive_reopening_the_database(tmp_path: Path):
    first = JobStore(tmp_path / "jobs.db")
    try:
        job = new_job(first, name="persist")
        assert first.transition(job.id, [Q], S, gpu_ids=[1])
    finally:
        first.close()
    second = JobStore(tmp_path / "jobs.db")
    try:
        again = second.get(job.id)
        assert (again.spec.name, again.state, again.gpu_ids) == ("persist", S, [1])
    finally:
        second.close()


def test_get_unknown_id_raises(store: JobStore):
    with pytest.raises(JobNotFound):
        store.get("deadbeef")


# -- resolve ----------------------------------------------------------------------------------


def test_resolve_by_full_id_and_by_unique_prefix(store: JobStore):
    jobs = [new_job(store, now=float(i)) for i in range(3)]
    target = jobs[1]

    assert store.resolve(target.id).id == target.id
    # The shortest prefix no other job shares.
    for n in range(1, 9):
        prefix = target.id[:n]
        if sum(j.id.startswith(prefix) for j in jobs) == 1:
            break
    assert store.resolve(prefix).id == target.id
    assert store.resolve(prefix.upper()).id == target.id


def test_ambiguous_prefix_lists_every_match(store: JobStore):
    # 17 ids over 16 hex digits: at least two share a first character.
    jobs = [new_job(store, now=float(i)) for i in range(17)]
    first_chars = [j.id[0] for j in jobs]
    shared = next(c for c in first_chars if first_chars.count(c) >= 2)

    with pytest.raises(AmbiguousJob) as exc:
        store.resolve(shared)

    assert exc.value.ref == shared
    # Oldest first, like the jobs were created.
    assert exc.value.matches == [j.id for j in jobs if j.id.startswith(shared)]


def test_resolve_by_name_picks_the_newest_job_of_that_name(store: JobStore):
    new_job(store, now=10.0, name="train")
    newest = new_job(store, now=30.0, name="train")
    new_job(store, now=20.0, name="train")
    new_job(store, now=40.0, name="eval")

    assert store.resolve("train").id == newest.id


def test_a_jobs_exact_name_wins_over_another_jobs_id_prefix(store: JobStore):
    # `gpuhop logs A` or `cancel bad` must reach the job named so, not whichever job's id
    # happens to start with `a` (ids are matched case-insensitively) or `bad`.
    jobs = [new_job(store, now=float(i)) for i in range(16)]
    first = jobs[0].id
    upper = new_job(store, now=100.0, name=first[0].upper())
    lower = new_job(store, now=101.0, name=first[:3])

    assert store.resolve(first[0].upper()).id == upper.id
    assert store.resolve(first[:3]).id == lower.id
    # A full id still names its own job, whatever another job is called.
    named_like_an_id = new_job(store, now=102.0, name=jobs[1].id)
    assert store.resolve(jobs[1].id).id == jobs[1].id
    assert named_like_an_id.id != jobs[1].id
    # A prefix that is nobody's name is still a prefix.
    assert store.resolve(jobs[2].id[:7]).id == jobs[2].id


def test_resolve_unknown_reference_raises(store: JobStore):
    new_job(store, name="train")
    with pytest.raises(JobNotFound):
        store.resolve("nope")
    with pytest.raises(JobNotFound):
        store.resolve("Train")


# -- transitions --------------------------------------------------------------------------------


def test_transition_from_an_allowed_state_moves_and_sets_fields(store: JobStore):
    job = new_job(store, gpus=2)

    assert store.transition(job.id, [Q], S, gpu_ids=[2, 3]) is True
    assert store.transition(job.id, [S], R, pid=4242, pid_start="99", started_at=5.0) is True

    got = store.get(job.id)
    assert (got.state, got.gpu_ids, got.pid, got.pid_start, got.started_at) == (
        R,
        [2, 3],
        4242,
        "99",
        5.0,
    )


def test_transition_from_another_state_changes_nothing(store: JobStore):
    job = new_job(store)

    assert store.transition(job.id, [S, R], JobState.succeeded, exit_code=0) is False

    assert store.get(job.id) == job


def test_finished_job_cannot_be_moved_again(store: JobStore):
    job = new_job(store)
    assert store.transition(job.id, [Q], JobState.cancelled, reason="by user")

    assert store.transition(job.id, [Q], S) is False
    assert store.get(job.id).state == JobState.cancelled


def test_transition_of_an_unknown_job_is_false(store: JobStore):
    assert store.transition("00000000", [Q], S) is False


def test_transition_refuses_unknown_fields(store: JobStore):
    job = new_job(store)
    with pytest.raises(ValueError, match="name"):
        store.transition(job.id, [Q], S, name="renamed")
    assert store.get(job.id) == job


# -- holdings, update ---------------------------------------------------------------------------


def test_holdings_count_only_starting_and_running_jobs(store: JobStore):
    starting, running, done, requeued, queued = (
        new_job(store, now=float(t), gpus=1) for t in range(5)
    )
    store.transition(starting.id, [Q], S, gpu_ids=[0, 1])
    store.transition(running.id, [Q], S, gpu_ids=[2])
    store.transition(running.id, [S], R)
    store.transition(done.id, [Q], S, gpu_ids=[3])
    store.transition(done.id, [S], R)
    store.transition(done.id, [R], JobState.failed)
    store.transition(requeued.id, [Q], S, gpu_ids=[4])
    store.transition(requeued.id, [S], Q)  # keeps gpu_ids, but holds nothing while queued

    assert store.holdings() == [Holding(starting.id, (0, 1)), Holding(running.id, (2,))]
    assert store.get(queued.id).state == Q


def test_a_share_is_stored_and_held_with_its_size(store: JobStore):
    job = store.create(["t.py"], JobSpec(gpus=1, gpu_memory_mb=4096))
    plain = new_job(store, gpus=1)
    store.transition(job.id, [Q], S, gpu_ids=[1])
    store.transition(plain.id, [Q], S, gpu_ids=[0])

    assert store.get(job.id).spec.gpu_memory_mb == 4096
    assert plain.spec.gpu_memory_mb is None
    assert set(store.holdings()) == {Holding(job.id, (1,), 4096), Holding(plain.id, (0,))}


# The jobs table as the first release made it, before gpu_memory_mb existed.
OLD_SCHEMA = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, name TEXT, state TEXT NOT NULL, command TEXT NOT NULL,
    env TEXT NOT NULL, gpus INTEGER NOT NULL, priority INTEGER NOT NULL,
    gpu_ids TEXT NOT NULL DEFAULT '[]', attempt INTEGER NOT NULL DEFAULT 1,
    created_at REAL NOT NULL, started_at REAL, ended_at REAL, exit_code INTEGER,
    signal INTEGER, reason TEXT, pid INTEGER, pid_start TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
INSERT INTO jobs (id, state, command, env, gpus, priority, gpu_ids, created_at)
VALUES ('0ld0ld00', 'running', '["old.py"]', '{}', 1, 0, '[2]', 5.0);
"""


def test_an_older_jobs_db_keeps_its_jobs(tmp_path: Path):
    path = tmp_path / "jobs.db"
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SCHEMA)
    db.close()

    for _ in range(2):  # opening it again must not try to add the column twice
        s = JobStore(path)
        try:
            old = s.get("0ld0ld00")
            assert (old.command, old.gpu_ids, old.spec.gpu_memory_mb) == (["old.py"], [2], None)
            assert s.holdings() == [Holding("0ld0ld00", (2,))]
            new = s.create(["n.py"], JobSpec(gpus=1, gpu_memory_mb=512))
            assert s.get(new.id).spec.gpu_memory_mb == 512
            # A job from before trees were recorded has none: its start hashes its copy.
            assert old.tree is None
            tree = "ab" * 32
            assert s.get(s.create(["n.py"], JobSpec(), tree=tree).id).tree == tree
        finally:
            s.close()


# The jobs table as the last agent before `spec` made it: each setting a column of its own.
LEGACY_SCHEMA = """
CREATE TABLE jobs (
    id            TEXT PRIMARY KEY,
    name          TEXT,
    state         TEXT NOT NULL,
    command       TEXT NOT NULL,
    env           TEXT NOT NULL,
    gpus          INTEGER NOT NULL,
    priority      INTEGER NOT NULL,
    gpu_ids       TEXT NOT NULL DEFAULT '[]',
    attempt       INTEGER NOT NULL DEFAULT 1,
    created_at    REAL NOT NULL,
    started_at    REAL,
    ended_at      REAL,
    exit_code     INTEGER,
    signal        INTEGER,
    reason        TEXT,
    pid           INTEGER,
    pid_start     TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    retries       INTEGER NOT NULL DEFAULT 0,
    workers       INTEGER NOT NULL DEFAULT 1,
    worker_timeout INTEGER NOT NULL DEFAULT 300,
    gpu_memory_mb INTEGER,
    owner         TEXT,
    private_network INTEGER NOT NULL DEFAULT 0,
    end_class     TEXT,
    after_ids     TEXT NOT NULL DEFAULT '[]',
    after_any     INTEGER NOT NULL DEFAULT 0,
    timeout       REAL,
    retry_on      TEXT NOT NULL DEFAULT 'infra',
    sweep         TEXT,
    max_parallel  INTEGER,
    mixed_gpus    INTEGER NOT NULL DEFAULT 0,
    notify        TEXT NOT NULL DEFAULT '[]',
    tree          TEXT
);;
CREATE INDEX jobs_state ON jobs(state);
CREATE INDEX jobs_name ON jobs(name);
CREATE INDEX jobs_created ON jobs(created_at);
CREATE TABLE attempts (
    job_id TEXT NOT NULL REFERENCES jobs(id), attempt INTEGER NOT NULL, state TEXT NOT NULL,
    started_at REAL, ended_at REAL, exit_code INTEGER, signal INTEGER, reason TEXT,
    end_class TEXT, PRIMARY KEY (job_id, attempt)
);
"""
# The columns it gained after the queue's (issue 22): a file from before them lacks them.
LATER_COLUMNS = ("sweep", "max_parallel", "mixed_gpus", "notify", "tree")


@pytest.mark.parametrize("later", [True, False], ids=["last", "before-sweeps"])
def test_a_jobs_db_from_before_the_spec_keeps_every_job_its_spec_made_of_its_columns(
    tmp_path: Path, later: bool
):
    path = tmp_path / "jobs.db"
    schema = LEGACY_SCHEMA
    if not later:
        for column in LATER_COLUMNS:
            schema = "\n".join(line for line in schema.split("\n") if f" {column} " not in line)
        schema = schema.replace(",\n);", "\n);")  # the last column's comma
    with sqlite3.connect(path) as db:
        db.executescript(schema)
        columns = {r[1] for r in db.execute("PRAGMA table_info(jobs)")}
        assert set(LATER_COLUMNS) & columns == (set(LATER_COLUMNS) if later else set())
        db.execute(
            "INSERT INTO jobs (id, name, state, command, env, gpus, priority, gpu_ids, created_at,"
            " started_at, pid, retries, workers, worker_timeout, owner, private_network,"
            " after_ids, after_any, timeout, retry_on) VALUES"
            " ('aaaa0001', 'gang', 'running', '[\"train.py\", \"-v\"]', '{\"SEED\": \"1\"}', 4,"
            " -3, '[0, 1, 2, 3]', 10.0, 11.0, 4242, 2, 2, 60, 'alice', 1, '[\"bbbb0002\"]', 1,"
            " 3600.0, 'any')"
        )
        db.execute(
            "INSERT INTO jobs (id, state, command, env, gpus, priority, created_at, ended_at,"
            " exit_code, reason, gpu_memory_mb, end_class) VALUES ('bbbb0002', 'failed',"
            " '[\"a.py\"]', '{}', 1, 0, 5.0, 9.0, 3, 'exited with code 3', 2048, 'job')"
        )
        db.execute(
            "INSERT INTO jobs (id, state, command, env, gpus, priority, created_at)"
            " VALUES ('cccc0003', 'queued', '[\"b.py\"]', '{}', 0, 7, 12.0)"
        )
        if later:
            db.execute(
                "UPDATE jobs SET sweep = 'lr-1', max_parallel = 2, mixed_gpus = 1,"
                " notify = '[\"https://x.example/hook\"]', tree = ? WHERE id = 'cccc0003'",
                ("ab" * 32,),
            )
    db.close()

    for _ in range(2):  # opened again, it is rebuilt no more
        s = JobStore(path)
        try:
            gang, failed, queued = (s.get(i) for i in ("aaaa0001", "bbbb0002", "cccc0003"))
            assert (gang.state, gang.command, gang.gpu_ids, gang.pid, gang.owner) == (
                R,
                ["train.py", "-v"],
                [0, 1, 2, 3],
                4242,
                "alice",
            )
            assert gang.spec == JobSpec(
                name="gang",
                env={"SEED": "1"},
                gpus=4,
                priority=-3,
                retries=2,
                workers=2,
                worker_timeout=60,
                private_network=True,
                after=("bbbb0002",),
                after_any=True,
                time_limit=3600.0,
                retry_on="any",
            )
            assert (failed.state, failed.exit_code, failed.end_class, failed.ended_at) == (
                JobState.failed,
                3,
                "job",
                9.0,
            )
            assert failed.spec == JobSpec(gpus=1, gpu_memory_mb=2048)
            assert queued.spec.priority == 7 and queued.spec.retry_on == "infra"
            if later:
                assert (queued.spec.sweep, queued.spec.max_parallel, queued.tree) == (
                    "lr-1",
                    2,
                    "ab" * 32,
                )
                assert (queued.spec.mixed_gpus, queued.spec.notify) == (
                    True,
                    ("https://x.example/hook",),
                )
            else:
                assert (queued.spec.sweep, queued.tree, queued.spec.notify) == (None, None, ())
            assert [j.id for j in s.queued()] == ["cccc0003"]
            assert s.holdings() == [Holding("aaaa0001", (0, 1, 2, 3), None, "alice", name="gang")]
            assert [j.id for j in s.list()] == ["cccc0003", "aaaa0001", "bbbb0002"]
        finally:
            s.close()
    with sqlite3.connect(path) as db:
        tables = dict(db.execute("SELECT name, sql FROM sqlite_master").fetchall())
    db.close()
    assert {"jobs", "attempts", "jobs_state", "jobs_name", "jobs_created"} <= set(tables)
    assert "new_jobs" not in tables
    assert "REFERENCES jobs(id)" in tables["attempts"]


def test_a_requeued_jobs_spec_has_its_new_priority(store: JobStore):
    # The column is where a priority is kept: the stored spec leaves it out.
    job = new_job(store)
    assert store.transition(job.id, [Q], Q, priority=-5)
    assert store.get(job.id).spec.priority == -5
    assert [j.spec.priority for j in store.queued()] == [-5]


def test_a_spec_is_stored_whole(store: JobStore):
    spec = JobSpec(
        name="s[lr=0.1]",
        gpus=2,
        mixed_gpus=True,
        pack=True,
        python="/usr/bin/python3",
        requirements="numpy\n",
        data=(Mount("imagenet", 3, "data"), Mount("extra", None, "x/y")),
        after=("aaaa0001",),
        notify=("https://x.example/",),
        sweep="s-1",
        max_parallel=3,
        time_limit=5.5,
    )
    assert store.get(store.create(["t.py"], spec).id).spec == spec


@pytest.mark.parametrize(
    "spec",
    [
        JobSpec(),
        JobSpec(name="n", priority=-2, sweep="s-1", max_parallel=2, env={"A": "1"}),
        JobSpec(data=(Mount("d", 2, "in"), Mount("e", None, "x")), after=("a",), notify=("u",)),
        JobSpec(workers=2, gpus_per_worker=1, gpus=2, time_limit=1.5, requirements="numpy\n"),
    ],
)
def test_a_stored_spec_reads_back_whole(spec: JobSpec):
    settings = json.loads(stored_spec(spec))
    # What the spec asked for, less what the store keeps in columns of their own.
    assert settings == {
        k: v for k, v in spec.non_default().items() if k not in ("name", "priority", "sweep")
    }
    settings.update(name=spec.name, priority=spec.priority, sweep=spec.sweep)
    assert JobSpec.from_json(settings) == spec
    newer = {**settings, "gpu_model": "H100"}  # a newer agent's field is left out
    assert JobSpec.from_json(newer) == spec


def test_update_sets_non_state_fields(store: JobStore):
    job = new_job(store)

    store.update(job.id, pid=77, cancel_requested=1, reason="asked")

    got = store.get(job.id)
    assert (got.pid, got.cancel_requested, got.reason, got.state) == (77, True, "asked", Q)


@pytest.mark.parametrize(
    "field", ["state", "id", "name", "command", "env", "spec", "no_such_field"]
)
def test_update_refuses_unknown_fields(store: JobStore, field: str):
    job = new_job(store)
    with pytest.raises(ValueError, match=field):
        store.update(job.id, pid=1, **{field: "x"})
    assert store.get(job.id) == job


def test_update_can_set_gpu_ids(store: JobStore):
    job = new_job(store)
    store.update(job.id, gpu_ids=[0, 1])
    assert store.get(job.id).gpu_ids == [0, 1]


def test_list_filters_by_state_newest_first(store: JobStore):
    old, mid, new = (new_job(store, now=t) for t in (1.0, 2.0, 3.0))
    store.transition(mid.id, [Q], S)

    assert [j.id for j in store.list()] == [new.id, mid.id, old.id]
    assert [j.id for j in store.list([Q])] == [new.id, old.id]
    assert [j.id for j in store.list([Q], limit=1)] == [new.id]
    assert (store.count(Q), store.count(S), store.count(R)) == (2, 1, 0)


def test_a_state_dir_from_an_older_agent_gets_the_new_columns(tmp_path):
    import sqlite3

    from gpuhop.agent.jobs.store import ADDED_COLUMNS, JobStore

    db = tmp_path / "jobs.db"
    old = sqlite3.connect(db)
    old.execute(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT, state TEXT NOT NULL,"
        " command TEXT NOT NULL, env TEXT NOT NULL, gpus INTEGER NOT NULL,"
        " priority INTEGER NOT NULL, gpu_ids TEXT NOT NULL DEFAULT '[]',"
        " attempt INTEGER NOT NULL DEFAULT 1, created_at REAL NOT NULL, started_at REAL,"
        " ended_at REAL, exit_code INTEGER, signal INTEGER, reason TEXT, pid INTEGER,"
        " pid_start TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0)"
    )
    old.execute(
        "CREATE TABLE attempts (job_id TEXT NOT NULL REFERENCES jobs(id),"
        " attempt INTEGER NOT NULL, state TEXT NOT NULL, started_at REAL, ended_at REAL,"
        " exit_code INTEGER, signal INTEGER, reason TEXT, PRIMARY KEY (job_id, attempt))"
    )
    old.execute(
        "INSERT INTO jobs (id, state, command, env, gpus, priority, created_at)"
        " VALUES ('abcd1234', 'succeeded', '[\"x.py\"]', '{}', 0, 0, 1.0)"
    )
    old.execute("INSERT INTO attempts (job_id, attempt, state) VALUES ('abcd1234', 1, 'failed')")
    old.commit()
    old.close()
    store = JobStore(db)
    try:
        job = store.get("abcd1234")
        assert (job.spec.retries, job.spec.workers, job.spec.worker_timeout) == (0, 1, 300)
        # Finished before end classes existed: none is made up for it.
        assert (job.end_class, job.spec.after, job.spec.time_limit) == (None, (), None)
        assert job.spec.retry_on == "infra"
        assert [a["end_class"] for a in store.attempts("abcd1234")] == [None]
        assert {"spec", *ADDED_COLUMNS} <= {
            r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(jobs)")
        }
        JobStore(db).close()  # opening it again changes nothing
    finally:
        store.close()


def test_queued_returns_every_queued_job_oldest_first_by_priority(tmp_path):
    from gpuhop.agent.jobs.store import JobStore

    store = JobStore(tmp_path / "jobs.db")
    try:
        ids = [store.create(["x.py"], JobSpec(), now=float(i)).id for i in range(1005)]
        urgent = store.create(["x.py"], JobSpec(priority=5), now=9999.0).id
        queued = [j.id for j in store.queued()]
        # More than `list`'s default limit, and the oldest first after the urgent one.
        assert queued == [urgent, *ids]
    finally:
        store.close()


# -- figures for /metrics ----------------------------------------------------------------------


def finish(store: JobStore, started: float, ended: float, state: JobState) -> str:
    job = new_job(store)
    store.transition(job.id, [Q], S)
    store.transition(job.id, [S], R, started_at=started)
    store.transition(job.id, [R], state, ended_at=ended)
    return job.id


def test_counts_name_every_state(store: JobStore):
    assert store.counts() == dict.fromkeys(JobState, 0)
    new_job(store)
    finish(store, 10.0, 12.0, JobState.failed)
    assert store.counts() == {**dict.fromkeys(JobState, 0), Q: 1, JobState.failed: 1}


def test_run_times_are_cumulative_per_final_state(store: JobStore):
    finish(store, 100.0, 101.0, JobState.succeeded)  # 1 s: on the first bound, counted in it
    finish(store, 100.0, 130.0, JobState.succeeded)
    finish(store, 100.0, 99.0, JobState.failed)  # a clock that went back counts as 0 s
    new_job(store)  # never started: no run time
    assert store.run_times([1, 10, 60]) == {
        JobState.succeeded: ((1, 1, 2), 2, 31.0),
        JobState.failed: ((1, 1, 1), 1, 0.0),
    }
    assert store.run_times([]) == {
        JobState.succeeded: ((), 2, 31.0),
        JobState.failed: ((), 1, 0.0),
    }
