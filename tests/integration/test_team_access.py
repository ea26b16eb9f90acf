"""Issue 19, what one user of a team agent could do to the others: a real agent with a TLS
listener on loopback, two users (alice, bob) and an admin (carol), reached by token.

Each test here failed on the code before the fix it names: datasets readable by everyone,
a queue anyone could jump, streams outliving their revoked token, a quota held to sizes the
client declared, and a forward that only a TCP port (open to every local user) could carry.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import sqlite3
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from gpuhop.api import JobState
from gpuhop.api.data import CHUNK_HEADER, CONT, PART
from gpuhop.api.framing import FRAME_HEADER
from gpuhop.client import Client, GpuhopError
from gpuhop.client.transport.tls import fetch_certificate, pinned_context
from tests.conftest import Agent, wait_until
from tests.integration import test_inside, test_tls
from tests.integration.test_forward import SERVERS, start_servers
from tests.integration.test_tls import raw_http
from tests.team import team_agent, team_tokens

JOBS_QUOTA = "1MiB"
# remote(token) -> a Client of this module's agent with that token (test_tls's fixture).
remote = test_tls.remote
SLEEP = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"]


@pytest.fixture(scope="module")
def tls_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    root = Path(tmp_path_factory.mktemp("team-agent"))
    with team_agent(root, 1, "--jobs-quota", JOBS_QUOTA, "--gc-every-hours", "0") as agent:
        yield agent


@pytest.fixture(scope="module")
def tokens(tls_agent: Agent) -> dict[str, str]:
    return team_tokens(tls_agent)


def submit(http: httpx.Client, command: list[str], **fields: object) -> httpx.Response:
    return http.post("/v1/jobs", json={"command": command, **fields})


# -- the queue --------------------------------------------------------------------------------


def test_only_an_admin_queues_above_the_default_priority(tls_agent, tokens):
    with raw_http(tls_agent, tokens["alice"]) as alice:
        for priority in (1, 100):
            r = submit(alice, SLEEP, priority=priority)
            assert r.status_code == 403, r.text
            assert r.json()["code"] == "forbidden"
            assert "only an admin may raise a job's priority" in r.json()["message"]
        mine = [submit(alice, SLEEP, priority=p) for p in (0, -5)]
        assert [r.status_code for r in mine] == [201, 201], [r.text for r in mine]
    with raw_http(tls_agent, tokens["carol"]) as carol:
        urgent = submit(carol, SLEEP, priority=50)
        assert urgent.status_code == 201 and urgent.json()["priority"] == 50
        for r in (*mine, urgent):
            carol.post(f"/v1/jobs/{r.json()['id']}/cancel", params={"grace": 0})


def test_requeue_follows_the_same_rule_and_touches_only_ones_own_jobs(tls_agent, tokens):
    # The agent has one fake GPU: a job holding it keeps the next GPU job queued.
    with raw_http(tls_agent, tokens["alice"]) as alice:
        holder = submit(alice, SLEEP, gpus=1).json()["id"]
        waiting = submit(alice, SLEEP, gpus=1).json()["id"]
        raised = alice.post(f"/v1/jobs/{waiting}/requeue", json={"priority": 5})
        assert raised.status_code == 403, raised.text
        assert "only an admin may raise a job's priority" in raised.json()["message"]
        lowered = alice.post(f"/v1/jobs/{waiting}/requeue", json={"priority": -3})
        assert (lowered.status_code, lowered.json()["priority"]) == (200, -3)
    with raw_http(tls_agent, tokens["bob"]) as bob:
        theirs = bob.post(f"/v1/jobs/{waiting}/requeue", json={"priority": -10})
        assert theirs.status_code == 404, theirs.text
    with raw_http(tls_agent, tokens["carol"]) as carol:
        urgent = carol.post(f"/v1/jobs/{waiting}/requeue", json={"priority": 50})
        assert (urgent.status_code, urgent.json()["priority"]) == (200, 50)
        for job in (waiting, holder):
            carol.post(f"/v1/jobs/{job}/cancel", params={"grace": 0})


def test_an_admin_is_asked_for_the_id_where_users_jobs_share_a_name(tls_agent, tokens):
    with raw_http(tls_agent, tokens["alice"]) as alice, raw_http(tls_agent, tokens["bob"]) as bob:
        theirs = {
            who: submit(http, SLEEP, name="shared-name").json()["id"]
            for who, http in (("alice", alice), ("bob", bob))
        }
        mine = bob.get("/v1/jobs/shared-name")  # names are each user's own
        assert (mine.status_code, mine.json()["id"]) == (200, theirs["bob"])
    with raw_http(tls_agent, tokens["carol"]) as carol:
        both = carol.post("/v1/jobs/shared-name/cancel", params={"grace": 0})
        assert both.status_code == 409, both.text
        said = both.json()["message"]
        assert said.startswith("'shared-name' names jobs of 2 users (")
        assert f"alice's {theirs['alice']}" in said and f"bob's {theirs['bob']}" in said
        for job_id in theirs.values():  # nothing was cancelled; by id, each is
            assert carol.get(f"/v1/jobs/{job_id}").json()["state"] != "cancelled"
            carol.post(f"/v1/jobs/{job_id}/cancel", params={"grace": 0})


# -- quotas -----------------------------------------------------------------------------------


def test_the_jobs_quota_counts_the_stored_blobs_not_the_declared_sizes(
    remote, tokens, tls_agent, project, tmp_path
):
    weights = os.urandom(5 * 1024 * 1024)
    root = project({"main.py": "print('ran')\n"})
    (root / "weights.bin").write_bytes(weights)
    with remote(tokens["alice"]) as alice, pytest.raises(GpuhopError) as honest:
        alice.submit(["main.py"], workdir=root)  # sends the blobs, then is refused
    assert honest.value.status == 507 and "jobs quota" in honest.value.message
    # The same files in a tree that says the 5 MiB file is empty.
    entries = [
        {"path": name, "digest": hashlib.sha256(data).hexdigest(), "size": 0, "executable": False}
        for name, data in (("main.py", b"print('ran')\n"), ("weights.bin", weights))
    ]
    lying = json.dumps({"entries": entries}).encode()
    with raw_http(tls_agent, tokens["alice"]) as http:
        stored = http.post("/v1/trees", content=lying)
        assert stored.status_code in (200, 201), stored.text
        r = submit(http, ["main.py"], tree=hashlib.sha256(lying).hexdigest())
    assert r.status_code == 507, r.text
    assert "jobs quota" in r.json()["message"] and "5.0 MiB" in r.json()["message"]


# -- revocation -------------------------------------------------------------------------------


def test_revoking_a_token_ends_its_open_log_stream_and_forwards(remote, tls_agent, tmp_path):
    with tls_agent.client() as owner:
        made = owner.create_token("dave")
    root = tmp_path / "servers"
    (root / "www").mkdir(parents=True)
    (root / "servers.py").write_text(SERVERS)
    dave: Client = remote(made.token)
    job, _, echo_port = start_servers(dave, root)
    try:
        ended: list[BaseException | None] = []
        streaming = threading.Event()

        def follow() -> None:
            try:
                for _ in job.logs(follow=True):
                    streaming.set()  # the stream is open: it has carried the job's output
                ended.append(None)  # a clean end: as if the job had ended
            except BaseException as e:
                ended.append(e)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        pem, _ = fetch_certificate(tls_agent.listener.url)
        url = tls_agent.listener.url.replace("https://", "wss://")
        with ws_connect(
            f"{url}/v1/jobs/{job.id}/ports/{echo_port}",
            ssl=pinned_context(pem),
            additional_headers={"Authorization": f"Bearer {made.token}"},
        ) as tunnel:
            tunnel.send(b"ping")
            assert tunnel.recv(timeout=30) == b"ping"
            assert streaming.wait(timeout=30) and follower.is_alive()
            with tls_agent.client() as owner:
                owner.revoke_token(made.id)
            with pytest.raises(ConnectionClosed) as closed:
                tunnel.recv(timeout=30)  # a second and a bit where the machine is quiet
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        follower.join(timeout=10)
        assert not follower.is_alive(), "logs -f still flowing after its token was revoked"
        assert isinstance(ended[0], GpuhopError) and ended[0].status == 401, ended
        with tls_agent.client() as owner:  # revoking a token cancels none of its jobs
            assert owner.job(job.id).state == JobState.running
    finally:
        with tls_agent.client() as owner:
            owner.job(job.id).cancel(grace=0)


# -- seeing inside a job ----------------------------------------------------------------------


def test_only_the_owner_or_an_admin_gets_a_jobs_stacks(remote, tokens, tls_agent, project):
    """py-spy reaches the job where it runs as its user's own identity, sandboxed; another
    user is answered as for a job that does not exist."""
    root = project({"stuck.py": test_inside.STUCK})
    alice: Client = remote(tokens["alice"])
    job = alice.submit(["stuck.py"], workdir=root)
    try:
        wait_until(lambda: b"up" in b"".join(job.logs()), timeout=60)
        with raw_http(tls_agent, tokens["bob"]) as bob:
            theirs = bob.get(f"/v1/jobs/{job.id}/stacks")
            nobodys = bob.get("/v1/jobs/0000ffff/stacks")
        assert theirs.status_code == 404, theirs.text
        assert theirs.json()["message"] == f"no job matches {job.id!r}"
        assert nobodys.status_code == 404
        for who in ("alice", "carol"):
            with raw_http(tls_agent, tokens[who]) as http:
                shown = http.get(f"/v1/jobs/{job.id}/stacks")
            assert shown.status_code == 200, shown.text
            (process,) = shown.json()["processes"]
            assert "waits_for_a_peer_that_never_comes (stuck.py:5)" in process["stacks"]
    finally:
        job.cancel(grace=0)


# -- forward on a shared machine -------------------------------------------------------------


def test_a_forward_can_listen_on_a_unix_socket_only_its_user_can_open(remote, tokens, tmp_path):
    """A TCP forward serves every local user with the forwarder's token (as `ssh -L`); a
    Unix socket of mode 0600 serves only the forwarder's own processes."""
    root = tmp_path / "servers"
    (root / "www").mkdir(parents=True)
    (root / "servers.py").write_text(SERVERS)
    path = tmp_path / "tb.sock"
    job, _, echo_port = start_servers(remote(tokens["alice"]), root)
    try:
        with job.forward(echo_port, unix=path) as fwd:
            assert fwd.url == f"unix:{path}"
            assert stat.S_ISSOCK(path.lstat().st_mode)
            assert stat.S_IMODE(path.lstat().st_mode) == 0o600
            assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
            with socket.socket(socket.AF_UNIX) as conn:
                conn.connect(str(path))
                conn.sendall(b"over a private socket")
                conn.shutdown(socket.SHUT_WR)
                assert b"".join(iter(lambda: conn.recv(1024), b"")) == b"over a private socket"
            with pytest.raises(GpuhopError) as e:  # the path is taken while it listens
                job.forward(echo_port, unix=path)
            assert "exists" in e.value.message
        assert not path.exists()
    finally:
        job.cancel(grace=0)


# -- datasets ---------------------------------------------------------------------------------

READ = "print(open('data/secret.txt').read(), end='')\n"


def dataset_dir(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "ds"
    root.mkdir(parents=True, exist_ok=True)
    (root / "secret.txt").write_text(text)
    return root


def mount_and_read(client: Client, name: str, reader: Path) -> str:
    job = client.submit(["read.py"], workdir=reader, data=[f"{name}=data"])
    assert job.wait(timeout=60).state == JobState.succeeded
    return b"".join(job.logs()).decode()


def test_a_dataset_is_private_to_its_pusher_unless_shared(remote, tokens, project, tmp_path):
    name = "alices-labels"
    reader = project({"read.py": READ})
    alice, bob, carol = (remote(tokens[u]) for u in ("alice", "bob", "carol"))
    pushed = alice.data.push(dataset_dir(tmp_path, "alice's labels\n"), name).info
    assert (pushed.owner, pushed.shared_with) == ("alice", [])
    assert name not in {d.name for d in bob.data.list()}
    not_there = [
        lambda: bob.data.versions(name),
        lambda: bob.data.files(name),
        lambda: bob.data.remove(name),
        lambda: bob.data.share(name, "bob"),
        lambda: bob.submit(["read.py"], workdir=reader, data=[f"{name}=data"]),
    ]
    for attempt in not_there:
        with pytest.raises(GpuhopError) as e:
            attempt()
        assert e.value.status == 404 and "no dataset named" in e.value.message, e.value
    with pytest.raises(GpuhopError) as e:  # taken, without saying by whom
        bob.data.push(dataset_dir(tmp_path / "b", "bob's\n"), name)
    assert e.value.status == 403 and "another user" in e.value.message
    # An admin sees it and may mount it.
    assert name in {d.name for d in carol.data.list()}
    assert mount_and_read(carol, name, reader) == "alice's labels\n"

    # Shared with Bob: he sees and mounts it, but it stays Alice's to change.
    assert alice.data.share(name, "bob").shared_with == ["bob"]
    assert [d.owner for d in bob.data.list() if d.name == name] == ["alice"]
    assert mount_and_read(bob, name, reader) == "alice's labels\n"
    with pytest.raises(GpuhopError) as e:
        bob.data.share(name, "mallory")
    assert e.value.status == 403
    with pytest.raises(GpuhopError) as e:
        bob.data.remove(name, 1)
    assert e.value.status == 403
    assert e.value.message.endswith("was pushed by alice: only they or an admin may remove it")
    assert alice.data.unshare(name, "bob").shared_with == []
    assert name not in {d.name for d in bob.data.list()}

    # `data push --shared`: every user; a new version stays shared.
    shared = alice.data.push(dataset_dir(tmp_path, "v2\n"), name, shared=True).info
    assert (shared.version, shared.shared_with) == (2, ["*"])
    assert {d.version for d in bob.data.list() if d.name == name} == {1, 2}
    assert mount_and_read(bob, name, reader) == "v2\n"
    assert alice.data.remove(name) == [1, 2]


def test_the_claims_of_a_removed_datasets_chunks_go_with_it(remote, tokens, tls_agent, tmp_path):
    """A file of several chunks keeps them in the version's file, not as blobs; once the
    version is removed, garbage collection forgets who held them (claims.db stays small)."""
    alice, carol = remote(tokens["alice"]), remote(tokens["carol"])
    tree = tmp_path / "alices-big"
    tree.mkdir()
    (tree / "big.bin").write_bytes(os.urandom(5 << 20))
    alice.data.push(tree, "alices-big")
    record = tls_agent.home / "datasets" / "alices-big" / "v1.json"
    chunks = set(json.loads(record.read_text())["files"][0]["chunks"])
    assert len(chunks) > 1 and chunks <= claimed_blobs(tls_agent)
    assert alice.data.remove("alices-big") == [1]
    carol.gc()
    assert not chunks & claimed_blobs(tls_agent)


def claimed_blobs(agent: Agent) -> set[str]:
    db = sqlite3.connect(agent.home / "claims.db")
    try:
        return {row[0] for row in db.execute("SELECT digest FROM claims WHERE kind = 'blob'")}
    finally:
        db.close()


def test_a_dataset_from_before_owners_stays_visible_to_all(
    remote, tokens, tls_agent, project, tmp_path
):
    """Upgrades: a version recorded without an owner is everyone's, as it always was."""
    alice, bob = remote(tokens["alice"]), remote(tokens["bob"])
    reader = project({"read.py": READ})
    alice.data.push(dataset_dir(tmp_path, "old\n"), "old-corpus")
    record = tls_agent.home / "datasets" / "old-corpus" / "v1.json"
    fields = json.loads(record.read_text())
    del fields["owner"]  # as an agent before datasets had owners wrote it
    record.write_text(json.dumps(fields))
    assert [d.owner for d in bob.data.list() if d.name == "old-corpus"] == [None]
    assert mount_and_read(bob, "old-corpus", reader) == "old\n"
    with pytest.raises(GpuhopError) as e:  # but only an admin changes it
        bob.data.remove("old-corpus")
    assert e.value.status == 403
    assert remote(tokens["carol"]).data.remove("old-corpus") == [1]


def test_two_users_pushing_a_new_name_at_once_cannot_both_have_it(
    remote, tokens, tls_agent, tmp_path
):
    """The owner check and the push share one lock: the second pusher is refused, never
    handed v2 of the first one's dataset."""
    roots = {}
    for user in ("alice", "bob"):
        roots[user] = tmp_path / user
        roots[user].mkdir()
        # Big enough that assembling a version takes a while, so the pushes overlap.
        (roots[user] / "data.bin").write_bytes(os.urandom(6 * 1024 * 1024))
    clients = {u: remote(tokens[u]) for u in roots}
    for u, client in clients.items():  # chunks sent ahead: the race is between the pushes
        client.data.push(roots[u], f"warm-{u}")
        client.data.remove(f"warm-{u}")

    def push(user: str, name: str, outcomes: dict, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            outcomes[user] = clients[user].data.push(roots[user], name).info.owner
        except GpuhopError as e:
            outcomes[user] = e.status

    for round_ in range(4):
        name = f"contested-{round_}"
        outcomes: dict[str, object] = {}
        barrier = threading.Barrier(2)
        threads = [
            threading.Thread(target=push, args=(u, name, outcomes, barrier)) for u in clients
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert sorted(map(str, outcomes.values())) in (["403", "alice"], ["403", "bob"]), outcomes
        with remote(tokens["carol"]) as admin:
            assert [d.version for d in admin.data.versions(name)] == [1]
            admin.data.remove(name)


# -- what an upload tells ---------------------------------------------------------------------
# "Answers never reveal whether another user stored given bytes" (DESIGN.md).


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob_frames(contents: list[bytes]) -> bytes:
    return b"".join(FRAME_HEADER.pack(bytes.fromhex(sha(d)), len(d)) + d for d in contents)


def chunk_frames(contents: list[bytes], run: int = 2) -> bytes:
    """Files of one chunk each (blobs), but the last `run`: one file of those (a run)."""
    flags = [0] * (len(contents) - run) + [PART, *[PART | CONT] * (run - 1)][:run]
    return b"".join(
        CHUNK_HEADER.pack(bytes.fromhex(sha(d)), len(d), len(d), f) + d
        for d, f in zip(contents, flags, strict=True)
    )


UPLOADS = {"/v1/blobs/upload": blob_frames, "/v1/chunks/upload": chunk_frames}


@pytest.mark.parametrize("route", list(UPLOADS))
def test_an_upload_answers_alike_whether_another_user_stored_its_content(tls_agent, tokens, route):
    # Bob could once confirm a guess at Alice's file by uploading it: "bytes: 0" (blobs) or
    # "stored: 0" (chunks) said that it was there already.
    frames = UPLOADS[route]
    alices = [os.urandom(70_000) for _ in range(4)]
    fresh = [os.urandom(70_000) for _ in range(4)]  # the same sizes, stored by no one
    with raw_http(tls_agent, tokens["alice"]) as alice:
        assert alice.post(route, content=frames(alices)).status_code == 200
    with raw_http(tls_agent, tokens["bob"]) as bob:
        theirs = bob.post(route, content=frames(alices))
        new = bob.post(route, content=frames(fresh))
        digests = [sha(d) for d in alices + fresh]
        missing = bob.post(route.replace("upload", "missing"), json={"digests": digests})
    assert new.status_code == 200, new.text
    assert (theirs.status_code, theirs.json()) == (new.status_code, new.json())
    assert new.json()["bytes"] == 4 * 70_000  # what arrived, stored now or before
    assert missing.json()["missing"] == []  # all his now: he sent their bytes


@pytest.mark.parametrize("route", list(UPLOADS))
def test_an_upload_refused_for_room_answers_alike_and_claims_nothing(tmp_path, route):
    """At the storage quota, content stored before once skipped the check (200 where new
    content got 507); and of a refused upload, what it had stored went, but content another
    user had stored stayed, claimed by the uploader: `missing` told the two apart."""
    frames = blob_frames if "blobs" in route else functools.partial(chunk_frames, run=0)
    small, big = 20_000, 100_000
    with team_agent(tmp_path, 0, "--storage-quota", "1MiB", "--gc-every-hours", "0") as agent:
        tokens = team_tokens(agent)
        alices = [os.urandom(small), os.urandom(big)]
        with raw_http(agent, tokens["alice"]) as alice:
            assert alice.post(route, content=frames(alices)).status_code == 200
        with raw_http(agent, tokens["bob"]) as bob:
            # Bob fills the quota but for 50 KB: room for a small file, not a big one.
            filler = [os.urandom((1 << 20) - small - big - 50_000)]
            assert bob.post(route, content=frames(filler)).status_code == 200
            fresh = [os.urandom(small), os.urandom(big)]
            answers = [
                bob.post(route, content=frames(contents))
                for contents in (
                    [alices[1]],  # refused at once: the same answer, figures and all
                    [fresh[1]],
                    [alices[0], os.urandom(big)],  # refused after a first file that fits
                    [fresh[0], os.urandom(big)],
                )
            ]
            digests = [sha(d) for d in alices + fresh]
            missing = bob.post(route.replace("upload", "missing"), json={"digests": digests})
    assert [a.status_code for a in answers] == [507] * 4, [a.text for a in answers]
    assert answers[0].json() == answers[1].json()
    assert {a.json()["code"] for a in answers} == {"insufficient_storage"}
    assert missing.json()["missing"] == digests


def test_a_tree_naming_another_users_file_is_refused_as_one_naming_a_new_file(tls_agent, tokens):
    """A tree that names a blob Bob never sent is refused whether anyone stored the blob or
    not. Once, a stored one passed the store's check and was refused after it in other
    words, and beside a blob stored by no one it was left out of the `missing` list."""
    alices, fresh, nobodys = os.urandom(30_000), os.urandom(30_000), os.urandom(30_000)
    with raw_http(tls_agent, tokens["alice"]) as alice:
        assert alice.post("/v1/blobs/upload", content=blob_frames([alices])).status_code == 200

    def tree(*contents: bytes) -> bytes:
        entries = [
            {"path": f"f{i}", "digest": sha(d), "size": len(d), "executable": False}
            for i, d in enumerate(contents)
        ]
        return json.dumps({"entries": entries}).encode()

    with raw_http(tls_agent, tokens["bob"]) as bob:
        answers = {
            guess: [bob.post("/v1/trees", content=tree(*c)) for c in ([guess], [guess, nobodys])]
            for guess in (alices, fresh)
        }
    for guess, (alone, beside) in answers.items():
        assert alone.status_code == beside.status_code == 409, alone.text
        assert alone.json()["detail"]["missing"] == [sha(guess)]
        assert sorted(beside.json()["detail"]["missing"]) == sorted([sha(guess), sha(nobodys)])
    messages = {a.json()["message"] for pair in answers.values() for a in pair}
    assert len(messages) == 2, messages  # "1 file(s) ..." and "2 file(s) ...", alike


# -- secrets ----------------------------------------------------------------------------------

PROBE = """\
import hashlib, os, sys
print("given", hashlib.sha256(os.environ.get("KEY", "").encode()).hexdigest())
try:
    open(sys.argv[1], "rb").read()
    print("store: read")
except OSError as e:
    print("store:", type(e).__name__)
"""


def test_doctor_names_a_users_own_bucket_credentials_never_the_agents(remote, tokens):
    """On a team agent a bucket's fetch signs with the user's secrets only: doctor names
    them, or says there are none, and never looks at the agent's own configuration."""
    alice, bob = (remote(tokens[u]) for u in ("alice", "bob"))
    value = "key-" + os.urandom(8).hex()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        alice.set_secret(name, value)
    try:
        mine, theirs = (
            next(c for c in who.doctor(probe=False) if c.name == "bucket credentials")
            for who in (alice, bob)
        )
    finally:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            alice.remove_secret(name)
    assert mine.status == "passed" and value not in mine.detail
    assert mine.detail == (
        "a bucket's fetch signs with your secrets AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY;"
        " never the agent's own environment or ~/.aws (this agent serves a team)"
    )
    assert theirs.status == "warning"
    assert theirs.detail.startswith(
        "none: you have no secret named AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY, and a"
        " bucket's fetch here signs with your own secrets only, never the agent's own"
    )


def test_a_secret_is_its_users_alone_even_to_an_admin(remote, tokens, tls_agent, project):
    value = "alice-" + os.urandom(8).hex()
    alice, bob, carol = (remote(tokens[u]) for u in ("alice", "bob", "carol"))
    alice.set_secret("ALICE_KEY", value)
    root = project({"probe.py": PROBE})
    store = str(tls_agent.paths.secrets_db)
    # Bob, and Carol the admin, neither list it nor can name it in a job, nor remove it.
    for other in (bob, carol):
        assert "ALICE_KEY" not in {s.name for s in other.secrets()}
        with pytest.raises(GpuhopError) as e:
            other.submit(["probe.py", store], workdir=root, secrets=["ALICE_KEY=KEY"])
        assert e.value.status == 400 and "you have no secret named ALICE_KEY" in e.value.message
        with pytest.raises(GpuhopError) as e:
            other.remove_secret("ALICE_KEY")
        assert e.value.status == 404
    # Alice's job has it; no job, hers or Bob's, can open the store it is kept in.
    mine = alice.submit(["probe.py", store], workdir=root, secrets=["ALICE_KEY=KEY"])
    theirs = bob.submit(["probe.py", store], workdir=root)
    assert mine.wait(timeout=60).state == theirs.wait(timeout=60).state == JobState.succeeded
    sha = hashlib.sha256(value.encode()).hexdigest()
    mine_said, theirs_said = (b"".join(j.logs()).decode() for j in (mine, theirs))
    assert f"given {sha}" in mine_said and "store: read" not in mine_said
    assert f"given {sha}" not in theirs_said and "store: read" not in theirs_said
    assert "store: " in theirs_said
    # No route answers with a value: there is none for one secret.
    with httpx.Client(
        base_url=tls_agent.listener.url,
        verify=pinned_context(fetch_certificate(tls_agent.listener.url)[0]),
        headers={"Authorization": f"Bearer {tokens['carol']}"},
    ) as http:
        assert http.get("/v1/secrets/ALICE_KEY").status_code in (404, 405)
        assert value not in http.get("/v1/secrets").text
    alice.remove_secret("ALICE_KEY")
