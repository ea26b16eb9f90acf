"""Jobs kept apart by owner in the store, tokens kept as hashes, fingerprints and --listen."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpuhop.agent.jobs.store import AmbiguousJob, JobNotFound, JobStore
from gpuhop.agent.server.listen import parse_listen
from gpuhop.agent.tokens import TokenStore
from gpuhop.api import normalize_fingerprint
from gpuhop.api.spec import JobSpec
from gpuhop.home import AgentError

FP = "SHA256:" + ":".join(["AB"] * 32)


def make(store: JobStore, job_id: str, owner: str | None, name: str | None = None) -> None:
    store.create(["x"], JobSpec(name=name), job_id=job_id, owner=owner)


def test_a_user_resolves_and_lists_only_their_own_jobs(tmp_path: Path):
    store = JobStore(tmp_path / "jobs.db")
    try:
        make(store, "aaaa0001", "alice", name="run")
        make(store, "aaaa0002", "bob", name="run")
        # bob's job neither matches nor makes alice's prefix ambiguous
        assert store.resolve("aaaa", owner="alice").id == "aaaa0001"
        assert store.resolve("run", owner="alice").id == "aaaa0001"
        with pytest.raises(JobNotFound):
            store.resolve("aaaa0002", owner="alice")
        with pytest.raises(AmbiguousJob):
            store.resolve("aaaa")  # an admin sees both
        assert [j.id for j in store.list(owner="bob")] == ["aaaa0002"]
        assert {j.owner for j in store.list()} == {"alice", "bob"}
    finally:
        store.close()


def test_an_older_jobs_db_gains_the_owner_column(tmp_path: Path):
    db = sqlite3.connect(tmp_path / "jobs.db")
    db.execute(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT, state TEXT NOT NULL,"
        " command TEXT NOT NULL, env TEXT NOT NULL, gpus INTEGER NOT NULL,"
        " priority INTEGER NOT NULL, gpu_ids TEXT NOT NULL DEFAULT '[]',"
        " attempt INTEGER NOT NULL DEFAULT 1, created_at REAL NOT NULL, started_at REAL,"
        " ended_at REAL, exit_code INTEGER, signal INTEGER, reason TEXT, pid INTEGER,"
        " pid_start TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0)"
    )
    db.execute(
        "INSERT INTO jobs (id, state, command, env, gpus, priority, created_at)"
        " VALUES ('old00001', 'succeeded', '[\"x\"]', '{}', 0, 0, 1.0)"
    )
    db.commit()
    db.close()
    store = JobStore(tmp_path / "jobs.db")
    try:
        assert store.get("old00001").owner is None
        assert store.list(owner="alice") == []
    finally:
        store.close()


def store_bytes(db: Path) -> dict[str, bytes]:
    """Every file of a SQLite store, by name: in WAL mode new rows sit in `-wal`, not the db."""
    return {p.name: p.read_bytes() for p in db.parent.glob(db.name + "*")}


def test_tokens_are_stored_as_hashes_and_revocable(tmp_path: Path):
    db = tmp_path / "tokens.db"
    tokens = TokenStore(db)
    try:
        record, token = tokens.create("alice", admin=False)
        checked = tokens.check(token)
        assert checked is not None and (checked.id, checked.user) == (record.id, "alice")
        assert [t.last_used_at is not None for t in tokens.list()] == [True]
        assert tokens.check(token + "x") is None
        assert tokens.check("") is None
        # While the store is open (the row in the WAL) and once it is checkpointed and closed.
        files = store_bytes(db)
        assert record.id.encode() in b"".join(files.values())  # the row is in what was read
        assert not [name for name, data in files.items() if token.encode() in data]
        tokens.close()
        files = store_bytes(db)
        assert record.id.encode() in files["tokens.db"]
        assert not [name for name, data in files.items() if token.encode() in data]
        tokens = TokenStore(db)
        assert tokens.revoke(record.id) is not None
        assert tokens.check(token) is None
        assert tokens.revoke(record.id) is None
    finally:
        tokens.close()


@pytest.mark.parametrize(
    "text",
    [
        FP,
        FP.lower(),
        FP.removeprefix("SHA256:"),
        FP.replace(":", " ").replace("SHA256 ", ""),
        "ab" * 32,
        "sha256=" + "AB" * 32,
        f"  {FP}\n",
    ],
)
def test_fingerprints_in_any_common_spelling_normalize_to_the_display_form(text: str):
    assert normalize_fingerprint(text) == FP


@pytest.mark.parametrize("text", ["", "SHA256:", "AB" * 31, "ZZ" * 32, "SHA1:" + "AB" * 32])
def test_things_that_are_not_fingerprints_are_refused(text: str):
    with pytest.raises(ValueError):
        normalize_fingerprint(text)


def test_listen_addresses():
    assert (parse_listen("127.0.0.1:0").host, parse_listen("127.0.0.1:0").port) == ("127.0.0.1", 0)
    assert parse_listen("[::1]:8443").host == "::1"
    assert not parse_listen("localhost:1", tls=False).tls
    for bad in ("8443", ":8443", "host:", "host:99999", "host:http"):
        with pytest.raises(AgentError, match="HOST:PORT"):
            parse_listen(bad)
    for open_host in ("0.0.0.0:8443", "[::]:8443", "10.1.2.3:8443"):
        with pytest.raises(AgentError, match="without TLS"):
            parse_listen(open_host, tls=False)
    with pytest.raises(AgentError, match="go together"):
        parse_listen("127.0.0.1:0", cert=Path("/etc/hostname"))
