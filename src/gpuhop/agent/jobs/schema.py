"""Runs in the agent: the job store's tables, and the columns added since the first release
(added to an existing jobs.db when the store opens, so an agent upgrade keeps every job)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
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
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_name ON jobs(name);
-- `ps` asks for the newest jobs: read in this order, not every row sorted per request.
CREATE INDEX IF NOT EXISTS jobs_created ON jobs(created_at);
-- One row per finished attempt of a job that was retried (the last attempt lives in jobs).
CREATE TABLE IF NOT EXISTS attempts (
    job_id     TEXT NOT NULL REFERENCES jobs(id),
    attempt    INTEGER NOT NULL,
    state      TEXT NOT NULL,
    started_at REAL,
    ended_at   REAL,
    exit_code  INTEGER,
    signal     INTEGER,
    reason     TEXT,
    end_class  TEXT,
    PRIMARY KEY (job_id, attempt)
);
"""

# Columns a jobs.db made by an older agent may lack: name -> its type and default, as in
# SCHEMA. Each is added by ALTER TABLE when the store opens; adding one is idempotent.
ADDED_COLUMNS = {
    "gpu_memory_mb": "INTEGER",
    "retries": "INTEGER NOT NULL DEFAULT 0",
    "workers": "INTEGER NOT NULL DEFAULT 1",
    "worker_timeout": "INTEGER NOT NULL DEFAULT 300",
    # The user who submitted the job; NULL for jobs from before ownership (admins see them).
    "owner": "TEXT",
    # 1: the job runs in a private network namespace, its ports reached through its relay.
    "private_network": "INTEGER NOT NULL DEFAULT 0",
    # Why a finished job ended (api.EndClass); NULL for jobs an older agent finished.
    "end_class": "TEXT",
    # The queue (issue 22): the jobs this one waits for, a time limit, what retries are for.
    "after_ids": "TEXT NOT NULL DEFAULT '[]'",
    "after_any": "INTEGER NOT NULL DEFAULT 0",
    "timeout": "REAL",
    "retry_on": "TEXT NOT NULL DEFAULT 'infra'",
    # The sweep (or array) a job is a run of, and how many of its runs may run at once.
    "sweep": "TEXT",
    "max_parallel": "INTEGER",
    # 1: several whole GPUs may be of different models.
    "mixed_gpus": "INTEGER NOT NULL DEFAULT 0",
    # The webhooks told of the job's start and end (a JSON list).
    "notify": "TEXT NOT NULL DEFAULT '[]'",
    # The digest of the job's tree (its copy is `tree.json` in its job dir), known at submit
    # so that a start need not hash that copy again; NULL for a job with no tree, or from an
    # agent before it (its start hashes the copy).
    "tree": "TEXT",
}
# The same for the attempts table.
ADDED_ATTEMPT_COLUMNS = {"end_class": "TEXT"}
