"""Runs in the agent: the job store's tables, the columns added since (added to an existing
jobs.db when the store opens), and what a jobs.db from before `JobSpec` held (rebuilt when
the store opens), so an agent upgrade keeps every job."""

# A job's settings are one JSON column (`spec`: `JobSpec.to_json`); a column of its own is
# only what SQL filters or sorts on, or what changes over the job's life. `name`, `priority`
# and `sweep` are both settings and such columns: the column is where each is kept (requeue
# changes a priority; lookups go by name, listings by sweep), and the stored spec leaves
# them out (see `records.COLUMN_SETTINGS`).
JOBS_COLUMNS = """
    id            TEXT PRIMARY KEY,
    name          TEXT,
    state         TEXT NOT NULL,
    command       TEXT NOT NULL,
    spec          TEXT NOT NULL,
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
    owner         TEXT,
    end_class     TEXT,
    sweep         TEXT,
    tree          TEXT
"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS jobs ({JOBS_COLUMNS});
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
    metrics    TEXT,
    PRIMARY KEY (job_id, attempt)
);
"""

# Columns a jobs.db made by an older agent (with a `spec` column) may lack: name -> its type
# and default, as in SCHEMA. Each is added by ALTER TABLE when the store opens; adding one
# is idempotent. None yet: a new setting goes into the spec, not here.
ADDED_COLUMNS: dict[str, str] = {}
# The same for the attempts table.
# `metrics`: the attempt's last metrics record (JSON), as `show` gives them.
ADDED_ATTEMPT_COLUMNS = {"end_class": "TEXT", "metrics": "TEXT"}

# The columns of a jobs.db from before `spec` (every one added over time; an older file
# lacks the later ones) that the spec is made of when the store rebuilds the table, each
# with the value a row without it means: the spec field it becomes, and that value.
LEGACY_SETTINGS = {
    "env": ("env", "{}"),
    "gpus": ("gpus", 0),
    "retries": ("retries", 0),
    "workers": ("workers", 1),
    "worker_timeout": ("worker_timeout", 300),
    "gpu_memory_mb": ("gpu_memory_mb", None),
    "private_network": ("private_network", 0),
    "after_ids": ("after", "[]"),
    "after_any": ("after_any", 0),
    "timeout": ("time_limit", None),
    "retry_on": ("retry_on", "infra"),
    "max_parallel": ("max_parallel", None),
    "mixed_gpus": ("mixed_gpus", 0),
    "notify": ("notify", "[]"),
}
# Old columns holding JSON text, and those holding 0 or 1 for a bool.
LEGACY_JSON = frozenset({"env", "after_ids", "notify"})
LEGACY_BOOLS = frozenset({"private_network", "after_any", "mixed_gpus"})
