"""The dashboard's doors, without a browser: a real agent (one fake GPU, the owner's Unix
socket and a TLS listener with users' tokens), plain HTTP, and `gpuhop ui`'s proxy in-process.

Every /ui route but the login and the static files wants a session cookie that arrives with
the credentials of the user it belongs to; a login code works once; a change wants the
dashboard's own header; a user sees only their own jobs; the proxy forwards /ui and nothing
else.
"""

from __future__ import annotations

import io
import sys
import zipfile
from collections.abc import Callable, Iterator
from http.client import HTTPConnection
from pathlib import Path

import httpx
import pytest

from gpuhop.agent.ui import api as ui_api
from gpuhop.agent.ui import pages as ui_pages
from gpuhop.api import fingerprint_of
from gpuhop.client import Client
from gpuhop.client.transport.remotes import Remote, RemotesFile, save
from gpuhop.client.transport.tls import fetch_certificate, pinned_context
from tests.conftest import Agent, wait_until

SLEEP = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"]
WRITE_PAGE = [
    sys.executable,
    "-c",
    "import os; d = os.environ['GPUHOP_ARTIFACTS_DIR'];"
    " open(os.path.join(d, 'report.html'), 'w').write('<script>alert(1)</script>');"
    " open(os.path.join(os.fsencode(d), b'caf\\xe9.txt'), 'w').write('latin-1')",
]
WRITE_EVENTS = """
import os
for d in ("logs/fit/20250101-120000/train", "logs/fit/20250101-120000/validation",
          "__pycache__", os.path.join(os.environ["GPUHOP_TENSORBOARD_DIR"], "train")):
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "events.out.tfevents.1700000000.host.1.v2"), "wb").write(b"")
open("logs/notes.txt", "w").write("not an event file")
"""
NOT_ROUTED = {"/ui/login", "/ui/static/{name}"}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    root = Path(tmp_path_factory.mktemp("ui-agent"))
    agent = Agent(root / "home", root / "cache", 1, args=("--listen", "127.0.0.1:0"))
    try:
        yield agent.start()
    finally:
        agent.shutdown()


@pytest.fixture(scope="module")
def tokens(agent: Agent) -> dict[str, str]:
    with agent.client() as owner:
        return {u: owner.create_token(u).token for u in ("alice", "bob")}


@pytest.fixture(scope="module")
def owner_http(agent: Agent) -> Iterator[httpx.Client]:
    transport = httpx.HTTPTransport(uds=str(agent.paths.socket))
    with httpx.Client(transport=transport, base_url="http://gpuhop", timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def user_http(agent: Agent, tokens: dict[str, str]) -> Iterator[Callable[[str], httpx.Client]]:
    """user_http("alice") -> plain HTTP over the pinned TLS listener with alice's token."""
    pem, _ = fetch_certificate(agent.listener.url)
    made: list[httpx.Client] = []

    def make(user: str) -> httpx.Client:
        client = httpx.Client(
            base_url=agent.listener.url,
            verify=pinned_context(pem),
            headers={"Authorization": f"Bearer {tokens[user]}"},
            timeout=30,
        )
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def code_for(http: httpx.Client) -> str:
    r = http.post("/v1/ui/login-codes")
    assert r.status_code == 201, r.text
    return r.json()["code"]


def login(http: httpx.Client, code: str) -> str:
    """The session cookie's value, from trading `code` at /ui/login."""
    r = http.get("/ui/login", params={"code": code})
    assert r.status_code == 303, r.text
    assert r.headers["location"] == "/ui/"
    http.cookies.clear()  # sent by hand below, so each request says what it carries
    return r.cookies["gpuhop_ui"]


def with_cookie(cookie: str) -> dict[str, str]:
    return {"cookie": f"gpuhop_ui={cookie}"}


def submit(http: httpx.Client, command: list[str], **fields: object) -> str:
    r = http.post("/v1/jobs", json={"command": command, **fields})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_a_login_code_works_once_and_sets_a_strict_session_cookie(owner_http):
    code = code_for(owner_http)
    r = owner_http.get("/ui/login", params={"code": code})
    assert r.status_code == 303
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("gpuhop_ui=")
    attributes = {part.strip().lower() for part in cookie.split(";")}
    assert {"httponly", "samesite=strict", "path=/ui", "max-age=43200"} <= attributes
    owner_http.cookies.clear()
    again = owner_http.get("/ui/login", params={"code": code})
    assert again.status_code == 401
    assert "used already or has expired" in again.text
    assert "set-cookie" not in again.headers
    for bad in ("", "x" * 43, "../../v1"):
        assert owner_http.get("/ui/login", params={"code": bad}).status_code == 401


def test_a_code_works_only_with_the_credentials_it_was_made_for(owner_http, user_http):
    alice = user_http("alice")
    assert owner_http.get("/ui/login", params={"code": code_for(alice)}).status_code == 401
    assert alice.get("/ui/login", params={"code": code_for(owner_http)}).status_code == 401
    assert user_http("bob").get("/ui/login", params={"code": code_for(alice)}).status_code == 401
    # The control: a code does log in with the credentials it was made for.
    assert login(alice, code_for(alice)) and login(owner_http, code_for(owner_http))


def test_every_ui_route_wants_the_session_and_its_users_credentials(agent, owner_http, user_http):
    job = submit(owner_http, [sys.executable, "-c", "print('secret-output')"], name="mine")
    routes = sorted(
        (method, route.path)
        for route in (*ui_api.router.routes, *ui_pages.router.routes)
        for method in route.methods  # type: ignore[attr-defined]
        if route.path not in NOT_ROUTED  # type: ignore[attr-defined]
    )
    assert len(routes) >= 12
    owners = login(owner_http, code_for(owner_http))
    alice = user_http("alice")
    for method, template in routes:
        path = template.replace("{ref}", job).replace("{path:path}", "a.txt")
        for http, headers in (
            (owner_http, {}),  # the owner's own socket, but no session
            (owner_http, with_cookie("made-up")),
            (alice, with_cookie(owners)),  # the owner's session, alice's credentials
        ):
            r = http.request(method, path, headers={**headers, "x-gpuhop-ui": "1"})
            assert r.status_code == 401, (method, path, r.text)
            assert job not in r.text and "secret-output" not in r.text
    assert owner_http.get("/ui/api/jobs", headers=with_cookie(owners)).status_code == 200
    page = owner_http.get("/ui/", headers=with_cookie(owners))
    assert page.status_code == 200 and '<script type="module"' in page.text


def test_the_pages_carry_security_headers_and_no_inline_script(owner_http):
    cookie = login(owner_http, code_for(owner_http))
    for path in ("/ui/", "/ui/gpus", "/ui/jobs/x", "/ui/api/jobs", "/ui/static/job.js"):
        r = owner_http.get(path, headers=with_cookie(cookie))
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "no-referrer"
        assert r.headers["x-content-type-options"] == "nosniff"
        if path.endswith("/") or path.startswith("/ui/jobs"):
            assert "<script>" not in r.text  # scripts come from files only
    # Only the package's own CSS and JS files, by name.
    for name in ("pages.py", "nope.js", "%2e%2e%2Fpages.py", "jobs.html"):
        assert owner_http.get(f"/ui/static/{name}").status_code == 404, name


def test_an_artifact_is_a_download_never_a_page(owner_http):
    job = submit(owner_http, WRITE_PAGE)
    wait_until(lambda: owner_http.get(f"/v1/jobs/{job}").json()["state"] == "succeeded")
    cookie = login(owner_http, code_for(owner_http))
    r = owner_http.get(f"/ui/api/jobs/{job}/artifacts/report.html", headers=with_cookie(cookie))
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["content-disposition"].startswith("attachment")
    assert r.headers["content-security-policy"].startswith("sandbox")
    # A name that is not UTF-8: listed with its bytes, and fetched by them.
    listed = owner_http.get(f"/ui/api/jobs/{job}/artifacts", headers=with_cookie(cookie)).json()
    odd = next(a for a in listed if a.get("raw"))
    assert odd["path"] == "caf\\xe9.txt" and odd["raw"] == "caf%E9.txt"
    r = owner_http.get(f"/ui/api/jobs/{job}/artifacts/{odd['raw']}", headers=with_cookie(cookie))
    assert r.status_code == 200 and r.content == b"latin-1"


def test_the_job_page_learns_where_the_job_wrote_tensorboard_runs(owner_http):
    # Where the tutorials log (./logs/fit/STAMP/{train,validation}) and where gpuhop's
    # callback does ($GPUHOP_TENSORBOARD_DIR/train); not in __pycache__, nor other files.
    job = submit(owner_http, [sys.executable, "-c", WRITE_EVENTS])
    wait_until(lambda: owner_http.get(f"/v1/jobs/{job}").json()["state"] == "succeeded")
    cookie = with_cookie(login(owner_http, code_for(owner_http)))
    runs = owner_http.get(f"/ui/api/jobs/{job}/tensorboard", headers=cookie).json()["runs"]
    assert runs == [
        "train",
        "logs/fit/20250101-120000/train",
        "logs/fit/20250101-120000/validation",
    ]
    quiet = submit(owner_http, [sys.executable, "-c", "open('notes.txt', 'w').write('x')"])
    wait_until(lambda: owner_http.get(f"/v1/jobs/{quiet}").json()["state"] == "succeeded")
    assert owner_http.get(f"/ui/api/jobs/{quiet}/tensorboard", headers=cookie).json() == {
        "runs": []
    }


def test_a_cancel_wants_the_dashboards_own_header(owner_http):
    job = submit(owner_http, SLEEP)
    cookie = login(owner_http, code_for(owner_http))
    cancel = f"/ui/api/jobs/{job}/cancel"
    assert owner_http.post(cancel, headers=with_cookie(cookie)).status_code == 403
    cross_site = {**with_cookie(cookie), "x-gpuhop-ui": "1", "sec-fetch-site": "same-site"}
    assert owner_http.post(cancel, headers=cross_site).status_code == 403
    assert owner_http.get(f"/v1/jobs/{job}").json()["state"] in ("queued", "starting", "running")
    csrf = {**with_cookie(cookie), "x-gpuhop-ui": "1"}
    assert owner_http.post(cancel, headers=csrf, content=b"x" * 100_000).status_code == 413
    r = owner_http.post(cancel, headers=csrf)
    assert r.status_code == 200, r.text
    wait_until(lambda: owner_http.get(f"/v1/jobs/{job}").json()["state"] == "cancelled")


def test_a_user_sees_only_their_own_jobs_in_the_dashboard(owner_http, user_http):
    alice, bob = user_http("alice"), user_http("bob")
    mine = submit(alice, SLEEP, name="alices-run")
    theirs = submit(bob, SLEEP, name="bobs-run", gpus=1)
    wait_until(lambda: bob.get(f"/v1/jobs/{theirs}").json()["state"] == "running", timeout=60)
    cookie = with_cookie(login(alice, code_for(alice)))
    me = alice.get("/ui/api/me", headers=cookie).json()
    assert (me["user"], me["admin"]) == ("alice", False)
    listed = alice.get("/ui/api/jobs", headers=cookie).json()["jobs"]
    assert mine in {j["id"] for j in listed}
    assert {j["owner"] for j in listed} == {"alice"}
    # Whether the list goes on past its limit counts her jobs alone: bob's are not older
    # ones of hers (the page says "the newest N" only where there are more).
    for limit, more in ((len(listed), False), (1, len(listed) > 1)):
        page = alice.get(f"/ui/api/jobs?limit={limit}", headers=cookie).json()
        assert (len(page["jobs"]), page["more"]) == (limit, more), limit
    paths = ("", "/log", "/metrics", "/artifacts", "/artifacts/a.txt", "/archive", "/archive/d")
    for path in (*paths, "/tensorboard", "/stacks"):
        r = alice.get(f"/ui/api/jobs/{theirs}{path}", headers=cookie)
        assert r.status_code == 404, (path, r.text)
    # The job page's Stacks button, on her own running job: where its Python is now.
    wait_until(lambda: b"up" in alice.get(f"/v1/jobs/{mine}/log").content, timeout=60)
    (process,) = alice.get(f"/ui/api/jobs/{mine}/stacks", headers=cookie).json()["processes"]
    assert "<module> (<string>:1)" in process["stacks"], process
    csrf = {**cookie, "x-gpuhop-ui": "1"}
    assert alice.post(f"/ui/api/jobs/{theirs}/cancel", headers=csrf).status_code == 404
    gpus = alice.get("/ui/api/gpus", headers=cookie).json()
    assert gpus["gpus"][0]["job_ids"] == [] and gpus["gpus"][0]["memory_reserved_mb"] > 0
    assert gpus["names"] == {}  # nor the name of another user's job holding it
    # The agent samples its GPUs from its start: the page has their history to draw.
    history = wait_until(lambda: alice.get("/ui/api/gpus", headers=cookie).json()["history"])
    assert history["0"]["utilization"][0] == 0  # a fake GPU reads 0
    assert bob.get(f"/v1/jobs/{theirs}").json()["state"] == "running"
    for http, job in ((alice, mine), (bob, theirs)):
        http.post(f"/v1/jobs/{job}/cancel", params={"grace": 0})


def test_one_users_login_churn_logs_nobody_else_out(user_http):
    """Issue 19: sessions and codes were global tables evicting the oldest first, so one
    user's 300 logins in a second ended every other session and voided pending codes."""
    alice, bob = user_http("alice"), user_http("bob")
    alices_session = with_cookie(login(alice, code_for(alice)))
    alices_pending = code_for(alice)
    for _ in range(300):  # past the old global caps of 256 sessions and 64 codes
        code_for(bob)  # a pending code left behind each time, too
        login(bob, code_for(bob))
    assert alice.get("/ui/api/me", headers=alices_session).status_code == 200
    assert alice.get("/ui/login", params={"code": alices_pending}).status_code == 303


def test_a_browser_straight_at_the_tls_port_gets_the_login_page(agent):
    pem, _ = fetch_certificate(agent.listener.url)
    with httpx.Client(base_url=agent.listener.url, verify=pinned_context(pem)) as anonymous:
        r = anonymous.get("/ui/")
    assert r.status_code == 401
    assert r.headers["content-type"].startswith("text/html")
    assert "gpuhop ui" in r.text


def raw(port: int, method: str, path: str, headers: dict[str, str] | None = None):
    """A request sent byte for byte (httpx would resolve `..` first)."""
    conn = HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.getheader("set-cookie"), response.read().decode()
    finally:
        conn.close()


def test_the_proxy_forwards_the_dashboard_and_nothing_else(agent):
    with agent.client() as client, client.dashboard() as dashboard:
        port = dashboard.port
        assert raw(port, "GET", "/v1/jobs")[0] == 404
        for sneaky in ("/ui/../v1/jobs", "/ui/%2e%2e/v1/jobs", "/ui/api/..%2F..%2Fv1%2Fjobs"):
            assert raw(port, "GET", sneaky)[0] == 400, sneaky
        assert raw(port, "GET", "/ui/", {"Host": f"rebound.example:{port}"})[0] == 403
        # The proxy reaches the owner's socket, yet without the session nothing is shown.
        status, _, body = raw(port, "GET", "/ui/api/jobs")
        assert status == 401 and '"unauthorized"' in body

        link = dashboard.login_url()
        status, cookie, _ = raw(port, "GET", link.removeprefix(f"http://127.0.0.1:{port}"))
        assert status == 303 and cookie is not None
        assert cookie.startswith(f"gpuhop_ui_{port}=")  # named after this proxy's port
        session = cookie.split(";")[0].split("=", 1)[1]
        mine = {"Cookie": f"other=1; gpuhop_ui_{port}={session}"}
        assert raw(port, "GET", "/ui/api/jobs", mine)[0] == 200
        # The agent's own cookie name, or another proxy's, is not passed on.
        assert raw(port, "GET", "/ui/api/jobs", {"Cookie": f"gpuhop_ui={session}"})[0] == 401
        foreign = {**mine, "X-Gpuhop-UI": "1", "Origin": "http://127.0.0.1:1"}
        assert raw(port, "POST", "/ui/api/jobs/x/cancel", foreign)[0] == 403
        assert raw(port, "POST", "/ui/api/logout", {**mine, "X-Gpuhop-UI": "1"})[0] == 200
        assert raw(port, "GET", "/ui/api/jobs", mine)[0] == 401  # logged out


def test_a_users_proxy_goes_over_tls_with_their_token(agent, tokens, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHOP_CONFIG_DIR", str(tmp_path / "config"))
    pem, _ = fetch_certificate(agent.listener.url)
    team = Remote(
        name="team", url=agent.listener.url, certificate=pem, fingerprint=fingerprint_of(pem)
    )
    team.token = tokens["bob"]
    save(RemotesFile(remotes={"team": team}))
    with Client(remote="team", cache_dir=agent.cache) as client, client.dashboard() as dashboard:
        port = dashboard.port
        status, cookie, _ = raw(port, "GET", dashboard.login_url().split(str(port), 1)[1])
        assert status == 303 and cookie is not None
        headers = {"Cookie": cookie.split(";")[0]}
        status, _, body = raw(port, "GET", "/ui/api/me", headers)
        assert status == 200 and '"user":"bob"' in body


def test_a_sweeps_page_lists_its_runs_for_their_owner_only(owner_http, user_http):
    alice, bob = user_http("alice"), user_http("bob")
    quick = [sys.executable, "-c", "pass"]
    runs = {submit(alice, quick, name=f"s[lr={lr}]", sweep="s-ab12") for lr in (1, 2)}
    other = submit(alice, quick, name="not-in-it")
    cookie = with_cookie(login(alice, code_for(alice)))
    page = alice.get("/ui/sweeps/s-ab12", headers=cookie)
    assert page.status_code == 200 and 'src="/ui/static/sweep.js"' in page.text
    for ref in ("s-ab12", "s"):  # its id, or its name (the newest sweep of that name)
        listed = alice.get("/ui/api/jobs", params={"sweep": ref}, headers=cookie).json()["jobs"]
        assert {j["id"] for j in listed} == runs and other not in {j["id"] for j in listed}
    assert alice.get("/ui/static/sweep.js").status_code == 200
    bobs = with_cookie(login(bob, code_for(bob)))
    assert bob.get("/ui/api/jobs", params={"sweep": "s-ab12"}, headers=bobs).status_code == 404
    # Nor can he cancel it; its owner can (the runs that have ended stay as they ended).
    cancel = "/ui/api/sweeps/s-ab12/cancel"
    assert bob.post(cancel, headers={**bobs, "x-gpuhop-ui": "1"}).status_code == 404
    r = alice.post(cancel, headers={**cookie, "x-gpuhop-ui": "1"})
    assert r.status_code == 200 and {j["id"] for j in r.json()["jobs"]} == runs


def test_an_artifact_directory_comes_as_one_zip_named_safely(owner_http):
    job = submit(owner_http, WRITE_PAGE)
    wait_until(lambda: owner_http.get(f"/v1/jobs/{job}").json()["state"] == "succeeded")
    cookie = with_cookie(login(owner_http, code_for(owner_http)))
    r = owner_http.get(f"/ui/api/jobs/{job}/archive", headers=cookie)
    assert r.status_code == 200, r.text
    assert r.headers["content-disposition"] == f"attachment; filename*=utf-8''{job}-artifacts.zip"
    assert r.headers["content-security-policy"].startswith("sandbox")
    with zipfile.ZipFile(io.BytesIO(r.content)) as zf:
        assert zf.read("report.html") == b"<script>alert(1)</script>"
        assert zf.read("caf\\xe9.txt") == b"latin-1"  # named as the listing names it
    for path, status, said in (
        ("/archive/report.html", 404, "has no artifact directory report.html"),
        ("/archive/nothing", 404, "has no artifact directory nothing"),
        ("/archive/%2e%2e/%2e%2e", 400, ".."),
    ):
        r = owner_http.get(f"/ui/api/jobs/{job}{path}", headers=cookie)
        assert (r.status_code, said in r.text) == (status, True), (path, r.text)
