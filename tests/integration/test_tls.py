"""A real agent with a TLS listener on loopback, reached through the SDK as a remote.

One agent (one fake GPU) serves every test here that does not need its own; users are
tokens made through the owner's Unix socket. Clients pin the agent's real certificate.
"""

from __future__ import annotations

import getpass
import hashlib
import http.client
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from gpuhop.agent.server.listen import make_self_signed
from gpuhop.agent.server.protocol import KEEP_ALIVE_TIMEOUT
from gpuhop.api import JobState, fingerprint_of
from gpuhop.client import Client, GpuhopError
from gpuhop.client.submitted import tree_of
from gpuhop.client.sync.workdir import scan
from gpuhop.client.transport.httpxtransport import KEEP_ALIVE_SECONDS, HttpxClient, sync_transport
from gpuhop.client.transport.remotes import Remote, RemotesFile, save
from gpuhop.client.transport.tls import fetch_certificate, pinned_context
from gpuhop.client.transport.unixhttp import Timeout
from tests.conftest import Agent, wait_until
from tests.integration.test_forward import PAGE, SERVERS, echo_through, start_servers
from tests.team import team_agent, team_tokens

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(120)\n"
WRITER = """
import os, pathlib
out = pathlib.Path(os.environ["GPUHOP_ARTIFACTS_DIR"])
(out / "model").mkdir(parents=True, exist_ok=True)
(out / "model" / "weights.txt").write_text("trained by " + os.environ["WHO"])
print("hello from", os.environ["WHO"])
"""
UNAUTHORIZED = {
    "code": "unauthorized",
    "message": "this listener needs a valid token (Authorization: Bearer ...)",
    "detail": None,
}


@pytest.fixture(scope="module")
def tls_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    # This module's tests send its one agent some 25 wrong tokens, all from 127.0.0.1: more
    # than one address may send in a minute (test_token_guesses tests that limit).
    config = "auth_fail_limit = 1000\n"
    with team_agent(Path(tmp_path_factory.mktemp("tls-agent")), 1, config=config) as agent:
        yield agent


@pytest.fixture(scope="module")
def tokens(tls_agent: Agent) -> dict[str, str]:
    return team_tokens(tls_agent)


@pytest.fixture
def remote(
    tls_agent: Agent, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Callable[..., Client]:
    """remote(token, pem=None) -> a Client of remote 'team' with that token and pin."""
    monkeypatch.setenv("GPUHOP_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("GPUHOP_TOKEN", raising=False)
    monkeypatch.delenv("GPUHOP_REMOTE", raising=False)
    listener = tls_agent.listener
    real_pem, _ = fetch_certificate(listener.url)
    clients: list[Client] = []

    def make(token: str | None, pem: str | None = None) -> Client:
        pem = pem or real_pem
        team = Remote(
            name="team", url=listener.url, certificate=pem, fingerprint=fingerprint_of(pem)
        )
        team.token = token
        save(RemotesFile(remotes={"team": team}))
        client = Client(remote="team", cache_dir=tls_agent.cache)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def raw_http(agent: Agent, token: str | None) -> httpx.Client:
    """Plain HTTP over the pinned TLS connection, for requests the SDK never makes. Reads wait
    up to a minute: a followed log answers only when its job ends, and a job's
    start on a loaded 2-core machine can take longer than httpx's 5 s default."""
    listener = agent.listener
    pem, _ = fetch_certificate(listener.url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(
        base_url=listener.url, verify=pinned_context(pem), headers=headers, timeout=60
    )


def raw_get(agent: Agent, path: str, token: str) -> tuple[int, dict]:
    """GET `path` byte for byte as given (httpx would resolve `..` before sending)."""
    host, _, port = agent.listener.address.rpartition(":")
    pem, _ = fetch_certificate(agent.listener.url)
    conn = http.client.HTTPSConnection(host, int(port), context=pinned_context(pem), timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_user_runs_follows_and_pulls_a_job_over_tls(remote, tokens, project, tmp_path):
    root = project({"train.py": WRITER})
    with remote(tokens["alice"]) as client:
        info = client.info()
        assert (info.user, info.admin) == ("alice", False)
        job = client.submit(["train.py"], workdir=root, env={"WHO": "alice"})
        assert job.info.owner == "alice"
        out = b"".join(job.logs(follow=True)).decode()
        assert job.wait(timeout=60).state == JobState.succeeded, out
        assert "hello from alice" in out
        pulled = job.pull(tmp_path / "out")
    assert [p.relative_to(tmp_path / "out").as_posix() for p in pulled] == ["model/weights.txt"]
    assert (tmp_path / "out" / "model" / "weights.txt").read_text() == "trained by alice"


def test_an_idle_connection_is_given_up_before_the_agent_closes_it(tls_agent, tokens):
    """The client's idle connections expire before the agent's keep-alive closes them, so no
    request goes out on one the agent is closing (a race that failed requests when both were
    5 s): kept between requests close together, a new one after KEEP_ALIVE_SECONDS."""
    assert KEEP_ALIVE_SECONDS < KEEP_ALIVE_TIMEOUT
    listener = tls_agent.listener
    pem, _ = fetch_certificate(listener.url)
    client = HttpxClient(
        sync_transport(None, pinned_context(pem)),
        listener.url,
        {"Authorization": f"Bearer {tokens['alice']}"},
        Timeout(30, 30),
    )
    try:

        def connection() -> object:
            answer = client.request("GET", "/v1/agent")
            assert answer.status_code == 200
            return answer.extensions["network_stream"]

        first = connection()
        assert connection() is first
        time.sleep(KEEP_ALIVE_SECONDS + 0.2)  # idle past the client's expiry only
        assert connection() is not first
    finally:
        client.close()


@pytest.mark.parametrize("token", [None, "gpuhop_wrong", "not-even-the-shape"])
def test_without_a_valid_token_every_route_answers_401_and_nothing_else(tls_agent, token):
    routes = [
        ("GET", "/v1/jobs"),
        ("GET", "/v1/agent"),
        ("GET", "/v1/tokens"),
        ("GET", "/docs"),
        ("GET", "/openapi.json"),
        ("GET", "/v1/no-such-route"),
        ("POST", "/v1/jobs"),
        ("POST", "/v1/blobs/upload"),
        ("GET", "/v1/jobs/x/artifacts/a.txt"),
    ]
    with raw_http(tls_agent, token) as http:
        for method, path in routes:
            r = http.request(method, path, content=b"{}")
            assert r.status_code == 401, (method, path, r.text)
            assert r.json() == UNAUTHORIZED, (method, path)
        basic = http.get("/v1/jobs", headers={"Authorization": "Basic YWxpY2U6eA=="})
        assert basic.status_code == 401


def test_a_websocket_without_a_token_is_refused_with_401(tls_agent):
    listener = tls_agent.listener
    pem, _ = fetch_certificate(listener.url)
    url = listener.url.replace("https://", "wss://") + "/v1/jobs/x/ports/8888"
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(url, ssl=pinned_context(pem), open_timeout=10)
    assert refused.value.response.status_code == 401


def test_the_sdk_says_a_token_was_refused(remote, tls_agent):
    with pytest.raises(GpuhopError) as refused:
        remote("gpuhop_not-a-real-token").jobs()
    assert refused.value.status == 401
    assert refused.value.message.startswith("the agent refused the token for remote 'team'")
    assert "(missing, wrong or revoked)" in refused.value.message
    assert refused.value.message.endswith("; ask the agent's admin for a new token")
    with pytest.raises(GpuhopError) as missing:
        remote(None).info()
    assert missing.value.status == 401


def test_a_refused_token_from_the_environment_is_named(remote, tokens, monkeypatch):
    monkeypatch.setenv("GPUHOP_TOKEN", "gpuhop_stale")  # a stale token wins over ...
    with pytest.raises(GpuhopError) as refused:
        remote(tokens["alice"]).jobs()  # ... the valid one stored with the remote
    assert refused.value.status == 401
    assert "the token sent was $GPUHOP_TOKEN's, which overrides the one stored with the" in (
        refused.value.message
    )


def test_a_certificate_that_is_not_the_pinned_one_is_refused_clearly(remote, tokens, tls_agent):
    other_pem = make_self_signed(["localhost", "127.0.0.1"])[0].decode()
    pinned = fingerprint_of(other_pem)
    with pytest.raises(GpuhopError) as refused:
        remote(tokens["alice"], pem=other_pem).jobs()
    message = refused.value.message
    assert refused.value.code == "unreachable"
    assert (
        f"the certificate of remote 'team' ({tls_agent.listener.fingerprint}) does not match"
        f" the pinned fingerprint {pinned}"
    ) in message
    assert f"gpuhop remote add team {tls_agent.listener.url} --replace --fingerprint NEW" in message


def test_users_see_and_touch_only_their_own_jobs_admins_all(
    remote, tokens, tls_agent, project, tmp_path
):
    root = project({"sleep.py": SLEEPER, "train.py": WRITER})
    bob = remote(tokens["bob"])
    bobs = bob.submit(["sleep.py"], workdir=root, name="bobs-run", gpus=1)
    wait_until(lambda: bobs.refresh().state == JobState.running, timeout=60)
    done = bob.submit(["train.py"], workdir=root, env={"WHO": "bob"})
    assert done.wait(timeout=60).state == JobState.succeeded

    alice = remote(tokens["alice"])
    assert {j.id for j in alice.jobs()}.isdisjoint({bobs.id, done.id})
    # Every way of reaching bob's jobs answers as for a job that does not exist.
    for ref in (bobs.id, bobs.id[:3], "bobs-run", done.id):
        with pytest.raises(GpuhopError) as absent:
            alice.job(ref)
        assert (absent.value.status, absent.value.message) == (404, f"no job matches {ref!r}")
    with raw_http(tls_agent, tokens["alice"]) as http:
        for method, path in [
            ("GET", f"/v1/jobs/{done.id}/log"),
            ("GET", f"/v1/jobs/{done.id}/metrics"),
            ("GET", f"/v1/jobs/{done.id}/artifacts"),
            ("GET", f"/v1/jobs/{done.id}/artifacts/model/weights.txt"),
            ("POST", f"/v1/jobs/{bobs.id}/cancel"),
        ]:
            r = http.request(method, path)
            assert r.status_code == 404, (method, path, r.text)
            ref = path.split("/")[3]
            assert r.json() == {
                "code": "not_found",
                "message": f"no job matches {ref!r}",
                "detail": None,
            }
    # A GPU taken shows as taken, but not by whom.
    assert alice.gpus()[0].job_ids == []
    assert bobs.refresh().state == JobState.running

    carol = remote(tokens["carol"])
    assert {bobs.id, done.id} <= {j.id for j in carol.jobs()}
    assert carol.gpus()[0].job_ids == [bobs.id]
    assert carol.job(done.id).artifacts()[0].path == "model/weights.txt"
    assert carol.job(bobs.id).cancel(grace=1).state in (JobState.cancelled, JobState.running)
    assert bob.job(bobs.id).wait(timeout=60).state == JobState.cancelled
    with tls_agent.client() as owner:  # the Unix socket: the owner, an admin
        assert owner.job("bobs-run").info.owner == "bob"


def test_a_revoked_token_stops_working_at_once(remote, tls_agent):
    made = tls_agent.cli("agent", "token", "create", "dave")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    dave = remote(token)
    assert dave.info().user == "dave"
    listed = tls_agent.cli("agent", "token", "ls", "--json")
    ids = [t["id"] for t in json.loads(listed.stdout) if t["user"] == "dave"]
    assert len(ids) == 1 and token not in listed.stdout
    revoked = tls_agent.cli("agent", "token", "revoke", ids[0])
    assert revoked.returncode == 0, revoked.stderr
    with pytest.raises(GpuhopError) as refused:
        dave.info()
    assert refused.value.status == 401


def test_a_token_for_a_malformed_user_name_is_refused_in_words(tls_agent):
    for user in ("bad user", "a/b"):
        made = tls_agent.cli("agent", "token", "create", user)
        assert made.returncode == 2, made.stderr
        assert "Traceback" not in made.stderr and made.stdout == ""
        assert f"token for {user!r}: user: user must be 1-64 characters" in made.stderr
    listed = json.loads(tls_agent.cli("agent", "token", "ls", "--json").stdout)
    assert not {"bad user", "a/b"} & {t["user"] for t in listed}
    # The agent's own user: only as an admin (the holder would be the owner to every check).
    owner = getpass.getuser()
    plain = tls_agent.cli("agent", "token", "create", owner)
    assert plain.returncode == 2 and plain.stdout == "", plain.stderr
    assert f"{owner} is the agent's own user (who its socket serves)" in plain.stderr
    admin = tls_agent.cli("agent", "token", "create", owner, "--admin")
    assert admin.returncode == 0, admin.stderr
    for token in json.loads(tls_agent.cli("agent", "token", "ls", "--json").stdout):
        if token["user"] == owner:
            assert token["admin"]
            assert tls_agent.cli("agent", "token", "revoke", token["id"]).returncode == 0


def test_only_admins_manage_tokens(remote, tokens):
    with pytest.raises(GpuhopError) as refused:
        remote(tokens["alice"]).create_token("mallory", admin=True)
    assert (refused.value.status, refused.value.code) == (403, "forbidden")
    carol = remote(tokens["carol"])
    made = carol.create_token("erin")
    assert made.id in {t.id for t in carol.tokens()}
    carol.revoke_token(made.id)


def test_hostile_requests_get_4xx_with_reasons(tls_agent, tokens):
    token = tokens["alice"]
    big = b"[" + b"0," * (9 * 1024 * 1024) + b"0]"
    with raw_http(tls_agent, token) as http:
        answers = [
            http.post("/v1/jobs", content=big, headers={"content-type": "application/json"}),
            # No Content-Length: counted as it arrives.
            http.post(
                "/v1/blobs/missing",
                content=iter([big[: len(big) // 2], big[len(big) // 2 :]]),
                headers={"content-type": "application/json"},
            ),
            http.post(
                "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
            ),
            http.post("/v1/jobs", json={"command": ["x.py"], "owner": "bob"}),
            http.post("/v1/jobs", json={"command": ["x"], "env": {"GPUHOP_JOB_ID": "1"}}),
            http.post("/v1/trees", json={"entries": [_entry("../x")]}),
            http.post("/v1/trees", json={"entries": [_entry("/etc/passwd")]}),
            http.post("/v1/trees", json={"entries": [_entry("a/../../x")]}),
            http.post("/v1/trees", content=b"\xff\xfe garbage"),
            http.post(
                "/v1/jobs",
                content=b'{"command": ["\xff"]}',
                headers={"content-type": "application/json"},
            ),
            http.post("/v1/blobs/missing", json={"digests": ["../../etc/passwd"]}),
            http.delete("/v1/jobs"),
            http.get("/v1/jobs", params={"limit": "-1"}),
        ]
    for r in answers:
        assert 400 <= r.status_code < 500, (r.request.url, r.status_code, r.text)
        body = r.json()
        assert body["code"] and body["message"], body
    assert [r.status_code for r in answers[:2]] == [413, 413]
    assert "larger than" in answers[0].json()["message"]
    assert "not valid JSON" in answers[2].json()["message"]
    assert "owner" in answers[3].json()["message"]
    assert "path" in answers[5].json()["message"]
    unparsed = answers[9].json()["message"]  # not FastAPI's "There was an error parsing ..."
    assert unparsed == "the request body is not valid JSON (not UTF-8 text, or nested too deep)"


def test_blob_uploads_over_tls_store_only_whole_checked_blobs_of_a_token_holder(tls_agent, tokens):
    from gpuhop.api.framing import FRAME_HEADER

    def frame(data: bytes, digest: bytes | None = None) -> bytes:
        return FRAME_HEADER.pack(digest or hashlib.sha256(data).digest(), len(data)) + data

    def stored(data: bytes) -> bool:
        digest = hashlib.sha256(data).hexdigest()
        return (tls_agent.home / "blobs" / digest[:2] / digest).exists()

    anon, liar, cut = os.urandom(70_000), os.urandom(300_000), os.urandom(2_000_000)
    with raw_http(tls_agent, None) as web:
        refused = web.post("/v1/blobs/upload", content=frame(anon))
    with raw_http(tls_agent, tokens["alice"]) as web:
        wrong = web.post("/v1/blobs/upload", content=frame(liar, hashlib.sha256(b"x").digest()))
    assert refused.status_code == 401 and not stored(anon)
    assert wrong.status_code == 400 and wrong.json()["code"] == "bad_blob" and not stored(liar)
    # A body that ends before its Content-Length: the connection closes halfway.
    host, _, port = tls_agent.listener.address.rpartition(":")
    pem, _ = fetch_certificate(tls_agent.listener.url)
    conn = http.client.HTTPSConnection(host, int(port), context=pinned_context(pem), timeout=30)
    body = frame(cut)
    writing = lambda: list((tls_agent.home / "tmp").glob("upload-*"))  # noqa: E731
    try:
        conn.putrequest("POST", "/v1/blobs/upload")
        conn.putheader("Authorization", f"Bearer {tokens['alice']}")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        conn.send(body[:1_500_000])  # past the 1 MiB the agent gathers before writing
        wait_until(writing, timeout=30)  # the agent is writing the blob's first half
    finally:
        conn.close()
    wait_until(lambda: not writing(), timeout=30)  # and drops it when the connection ends
    assert not stored(cut)


def test_artifact_paths_cannot_climb_out(remote, tokens, tls_agent, project):
    client = remote(tokens["alice"])
    job = client.submit(["train.py"], workdir=project({"train.py": WRITER}), env={"WHO": "a"})
    assert job.wait(timeout=60).state == JobState.succeeded
    base = f"/v1/jobs/{job.id}/artifacts/"
    for path in (
        "../../../../../../etc/passwd",
        "%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "model/..%2f..%2f..%2fetc/passwd",
        "%2fetc%2fpasswd",
        "model/../../output.log",
    ):
        status, body = raw_get(tls_agent, base + path, tokens["alice"])
        assert 400 <= status < 500, (path, status, body)
        assert body["code"] in ("bad_path", "not_found"), (path, body)
    status, _ = raw_get(tls_agent, f"/v1/jobs/{job.id}/../../v1/tokens", tokens["alice"])
    assert status in (403, 404)


def test_the_default_agent_has_no_tcp_listener(shared_agent):
    with shared_agent.client() as client:
        info = client.info()
    assert info.listener is None and info.admin
    assert not shared_agent.paths.listen_file.exists()
    assert not shared_agent.paths.tls.exists()


def _entry(path: str) -> dict[str, object]:
    return {"path": path, "digest": "0" * 64, "size": 1}


def test_pinned_context_refuses_a_different_certificate(tls_agent):
    other = make_self_signed(["localhost"])[0].decode()
    with (
        pytest.raises(httpx.ConnectError),
        httpx.Client(verify=pinned_context(other)) as http,
    ):
        http.get(tls_agent.listener.url + "/v1/agent")


def test_knowing_a_digest_is_not_holding_the_file(remote, tokens, tls_agent, project, tmp_path):
    """Bob knows the digests of Alice's secret file and of her tree, but not the bytes: the
    agent must not let him run a job that reads them."""
    secret = "the weights of alice's unreleased model\n"
    root = project({"train.py": "print(open('secret.txt').read())", "secret.txt": secret})
    with remote(tokens["alice"]) as alice:
        assert alice.submit(["train.py"], workdir=root).wait(timeout=60).state.value == "succeeded"
    tree_bytes, tree_digest = tree_of(scan(root, tmp_path / "scan-cache").files)
    secret_digest = hashlib.sha256(secret.encode()).hexdigest()

    with raw_http(tls_agent, tokens["bob"]) as bob:
        missing = bob.post("/v1/blobs/missing", json={"digests": [secret_digest]})
        assert missing.json()["missing"] == [secret_digest]
        named = bob.post("/v1/trees", content=tree_bytes)
        assert named.status_code == 409
        assert named.json()["code"] == "missing_blobs"
        assert secret_digest in named.json()["detail"]["missing"]
        run = bob.post("/v1/jobs", json={"command": ["train.py"], "tree": tree_digest})
        assert run.status_code == 409
        assert run.json()["code"] == "missing_tree"

    # With the bytes in hand, Bob's client simply sends them, and his job runs.
    with remote(tokens["bob"]) as client:
        job = client.submit(["train.py"], workdir=root)
        assert client.last_sync is not None and client.last_sync.files_sent == 2
        assert job.wait(timeout=60).state == JobState.succeeded


def test_a_delta_cannot_reach_a_tree_or_a_file_one_has_not_stored(
    remote, tokens, tls_agent, project, tmp_path
):
    """A tree sent as a delta is held to the same rule: Bob cannot build on Alice's tree,
    nor add her secret file to a tree of his own by naming its digest."""
    secret = "alice's secret for deltas\n"
    root = project({"train.py": "print(open('secret.txt').read())", "secret.txt": secret})
    with remote(tokens["alice"]) as alice:
        assert alice.submit(["train.py"], workdir=root).wait(timeout=60).state.value == "succeeded"
    files = scan(root, tmp_path / "scan-cache").files
    _, alices = tree_of(files)
    theirs = tmp_path / "bob"
    theirs.mkdir()
    (theirs / "train.py").write_text("print(open('secret.txt').read())")
    with remote(tokens["bob"]) as bob_client:
        assert bob_client.submit(["train.py"], workdir=theirs).wait(timeout=60).state.value
    bobs_files = scan(theirs, tmp_path / "scan-cache").files
    _, bobs = tree_of(bobs_files)
    stolen = next(f for f in files if f.path == "secret.txt")
    _, wanted = tree_of(sorted([*bobs_files, stolen], key=lambda f: f.path))
    entry = {"path": "secret.txt", "digest": stolen.digest, "size": stolen.size}

    with raw_http(tls_agent, tokens["bob"]) as bob:
        on_hers = bob.post(
            "/v1/trees/delta", json={"parent": alices, "digest": wanted, "removed": ["x"]}
        )
        assert on_hers.status_code == 409, on_hers.text
        assert on_hers.json()["code"] == "missing_tree"
        assert alices in on_hers.json()["message"]
        on_his = bob.post(
            "/v1/trees/delta", json={"parent": bobs, "digest": wanted, "changed": [entry]}
        )
        assert on_his.status_code == 409, on_his.text
        assert on_his.json()["code"] == "missing_blobs"
        assert on_his.json()["detail"]["missing"] == [stolen.digest]
        # The same deltas inside a job request: the same answers.
        for delta, code in [
            ({"parent": alices, "digest": wanted, "removed": ["x"]}, "missing_tree"),
            ({"parent": bobs, "digest": wanted, "changed": [entry]}, "missing_blobs"),
        ]:
            job = {"command": ["train.py"], "tree": wanted, "tree_delta": delta}
            refused = bob.post("/v1/jobs", json=job)
            assert (refused.status_code, refused.json()["code"]) == (409, code), refused.text
        run = bob.post("/v1/jobs", json={"command": ["train.py"], "tree": wanted})
        assert run.status_code == 409
        assert run.json()["code"] == "missing_tree"


def test_a_forwarded_port_carries_real_traffic_over_tls_for_its_owner_only(
    remote, tokens, tls_agent, tmp_path
):
    root = tmp_path / "servers"
    (root / "www").mkdir(parents=True)
    (root / "servers.py").write_text(SERVERS)
    (root / "www" / "index.html").write_text(PAGE)
    with remote(tokens["alice"]) as alice:
        job, http_port, echo_port = start_servers(alice, root)
        try:
            with job.forward(echo_port) as fwd:
                payload = os.urandom(3 << 20)
                assert echo_through(("127.0.0.1", fwd.local_port), payload) == payload
            with job.forward(http_port) as fwd:
                assert httpx.get(f"{fwd.url}/index.html").text == PAGE

            # Bob cannot even find the job, let alone reach its ports.
            with raw_http(tls_agent, tokens["bob"]) as bob:
                refused = bob.get(f"/v1/jobs/{job.id}/ports/{echo_port}")
                assert refused.status_code == 404
                assert refused.json()["code"] == "not_found"
        finally:
            job.cancel(grace=0)


def test_a_shared_dataset_is_read_by_all_but_changed_only_by_its_pusher(
    remote, tokens, tls_agent, tmp_path
):
    data = tmp_path / "digits"
    data.mkdir()
    (data / "train.csv").write_text("x,y\n" + "1,2\n" * 5000)
    reader = tmp_path / "reader"
    reader.mkdir()
    (reader / "read.py").write_text("print(open('data/train.csv').read().count('1,2'))")
    with remote(tokens["alice"]) as alice:
        pushed = alice.data.push(data, "team-digits", shared=True).info
        assert pushed.owner == "alice" and pushed.shared_with == ["*"]
    with remote(tokens["bob"]) as bob:
        assert any(d.name == "team-digits" and d.owner == "alice" for d in bob.data.list())
        job = bob.submit(["read.py"], workdir=reader, data=["team-digits=data"])
        assert job.wait(timeout=60).state == JobState.succeeded
        assert b"5000" in b"".join(job.logs())
        # Naming Alice's chunk without sending it is not holding it.
        chunk = hashlib.sha256((data / "train.csv").read_bytes()).hexdigest()
        manifest = {"files": [{"path": "stolen.csv", "size": 20004, "executable": False,
                               "chunks": [chunk]}]}  # fmt: skip
        with raw_http(tls_agent, tokens["bob"]) as http:
            sent = http.post("/v1/datasets/bobs", json=manifest)
        assert sent.status_code == 409 and sent.json()["code"] == "missing_blobs", sent.text
        assert sent.json()["detail"]["missing"] == [chunk]
        with raw_http(tls_agent, tokens["carol"]) as http:  # an admin: it is on the agent
            assert http.post("/v1/blobs/missing", json={"digests": [chunk]}).json() == {
                "missing": []
            }
        for change in (lambda: bob.data.remove("team-digits"),
                       lambda: bob.data.push(data, "team-digits")):  # fmt: skip
            with pytest.raises(GpuhopError) as err:
                change()
            assert err.value.status == 403
            assert "pushed by alice" in err.value.message
    with remote(tokens["carol"]) as admin:
        assert admin.data.remove("team-digits") == [pushed.version]
