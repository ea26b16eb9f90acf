"""Model servers are reachable only through the agent: on a team agent (alice and bob by
token), bob's job scans the host's listening TCP ports and knocks on each, and finds none of
alice's model servers, while alice reaches hers through the agent as before.

Failed on the code before: a model server listened on the host's loopback without a
private network, so any job on the host could read its `/gpuhop/stats` and run predictions
on its owner's GPU, bypassing the agent's owner check. The server here is a stand-in (the
work dir's own `gpuhop` package shadows the real one under `python -m`, as in
test_serving_proxy) that puts a mark in every answer, so a knock that reaches it says so.
(A notebook server keeps the host's network, so that its kernels can download; its Jupyter
token, which no other job sees, guards it: see test_notebook_browser.)
"""

from __future__ import annotations

import http.server
import json
import secrets
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.client import Client
from tests.conftest import Agent, wait_until
from tests.integration import test_tls
from tests.integration.test_forward import job_log
from tests.team import team_agent, team_tokens

pytestmark = pytest.mark.timeout(180)

# remote(token) -> a Client of this module's agent with that token (test_tls's fixture).
remote = test_tls.remote

# A server that answers every request with {"mark": MARK, "predictions": [MARK]}; run as
# `python -m gpuhop.serving ... --ready-file F` it writes its port to F.
MARKED = """
import http.server, json, os, sys

MARK = open("mark").read()

class Marked(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.answer()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.answer()

    def answer(self):
        data = json.dumps({"mark": MARK, "predictions": [MARK]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Marked)
port = server.server_address[1]
ready = sys.argv[sys.argv.index("--ready-file") + 1]
json.dump({"port": port}, open(ready, "w"))
print("listening", flush=True)
server.serve_forever()
"""

# Bob's job: every TCP port listening on the host where loopback reaches it (/proc/net/tcp
# and tcp6: this network namespace's), each asked over HTTP; the marks it met, and where.
SCAN = """
import json, socket, sys

marks = sys.argv[1:]
ports = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        lines = open(table).read().splitlines()[1:]
    except FileNotFoundError:
        continue
    for line in lines:
        local, state = line.split()[1], line.split()[3]
        address, port = local.split(":")
        loopback = address in ("0100007F", "00000000", "0" * 32, "0" * 24 + "01000000")
        if state == "0A" and loopback:
            ports.add(int(port, 16))
found = {}
for port in sorted(ports):
    for host in ("127.0.0.1", "::1"):
        try:
            with socket.create_connection((host, port), timeout=2) as conn:
                conn.settimeout(2)
                conn.sendall(b"GET /gpuhop/stats HTTP/1.0\\r\\nhost: x\\r\\n\\r\\n")
                answer = b""
                while len(answer) < 65536 and (chunk := conn.recv(65536)):
                    answer += chunk
        except OSError:
            continue
        for mark in marks:
            if mark.encode() in answer:
                found.setdefault(mark, []).append(f"{host} port {port}")
print("scan " + json.dumps({"ports": sorted(ports), "found": found}), flush=True)
"""


@pytest.fixture(scope="module")
def tls_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    root = Path(tmp_path_factory.mktemp("private-servers"))
    with team_agent(root, 0) as agent:
        yield agent


@pytest.fixture(scope="module")
def tokens(tls_agent: Agent) -> dict[str, str]:
    return team_tokens(tls_agent)


def marked_tree(root: Path, module: str, mark: str) -> Path:
    """A work dir whose `python -m <module>` is the MARKED server."""
    files = {"mark": mark, "saved_model.pb": "not a model", f"{module}/__main__.py": MARKED}
    parts = module.split("/")
    for depth in range(1, len(parts)):
        files["/".join(parts[:depth]) + "/__init__.py"] = ""
    files[f"{module}/__init__.py"] = ""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def bobs_scan(bob: Client, root: Path, marks: list[str]) -> dict[str, object]:
    """What bob's job met knocking on every listening loopback port of the host."""
    root.mkdir()
    (root / "scan.py").write_text(SCAN)
    job = bob.submit(["scan.py", *marks], workdir=root)
    info = job.wait(timeout=120)
    log = job_log(job).decode(errors="replace")
    assert info.state == JobState.succeeded, log
    line = next(line for line in log.splitlines() if line.startswith("scan "))
    scan: dict[str, object] = json.loads(line.removeprefix("scan "))
    return scan


def test_another_users_job_reaches_no_model_server(remote, tokens, tmp_path):
    alice, bob = remote(tokens["alice"]), remote(tokens["bob"])
    model_mark, control_mark = (secrets.token_hex(16) for _ in range(2))

    # A service the test itself runs on the host's loopback: bob's scan must find it, or
    # finding nothing of alice's would prove nothing.
    class Control(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", str(len(control_mark)))
            self.end_headers()
            self.wfile.write(control_mark.encode())

        def log_message(self, *args: object) -> None:
            pass

    control = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Control)
    thread = threading.Thread(target=control.serve_forever, daemon=True)
    thread.start()
    model_root = marked_tree(tmp_path / "model", "gpuhop/serving", model_mark)
    model = None
    try:
        model = alice.serve(model_root, name="marked", timeout=60)
        # Alice's requests through the agent reach her server: predict, stats, forward.
        assert model.predict(instances=[[1.0]])["predictions"] == [model_mark]
        assert model.stats()["mark"] == model_mark
        with model.forward() as fwd, urllib.request.urlopen(fwd.url + "/v1/models/x") as r:
            assert json.load(r)["mark"] == model_mark
        wait_until(lambda: b"listening" in job_log(model.job), timeout=30)

        scan = bobs_scan(bob, tmp_path / "scan", [model_mark, control_mark])
        found = scan["found"]
        assert isinstance(found, dict)
        assert control.server_address[1] in scan["ports"], scan  # type: ignore[operator]
        assert control_mark in found, scan
        assert model_mark not in found, f"bob's job reached alice's model server: {scan}"
        assert model.job.refresh().private_network
        # Still served after the scan, through the agent only.
        assert model.predict(instances=[[2.0]])["predictions"] == [model_mark]
    finally:
        if model is not None:
            model.job.cancel(grace=0)
            model.job.wait(timeout=30)
        control.shutdown()
        control.server_close()
        thread.join()
