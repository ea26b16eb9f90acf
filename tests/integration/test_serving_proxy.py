"""The agent's proxy to model servers (a real agent, real jobs; no TensorFlow): what it
passes on and back, and that it reaches only what the model server job itself listens on
(a job that names another process's port as its own gets a 502, and that process never
sees the request)."""

from __future__ import annotations

import hashlib
import http.server
import os
import threading

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)

# Uploaded as a "SavedModel", a tree's own `gpuhop` package shadows the real one under
# `python -m gpuhop.serving` in its work dir: the job runs this instead, and writes the
# port of a server that is not its own where the agent looks for its port.
SHADOW = """
import json, sys, time
ready = sys.argv[sys.argv.index("--ready-file") + 1]
json.dump({"port": int(open("target_port").read())}, open(ready, "w"))
print("claimed", flush=True)
time.sleep(600)
"""

# The same shadowing, for a job whose own server echoes what reached it (HTTP/1.1, kept
# alive); `?size=N` pads the answer to N bytes.
ECHO = """
import hashlib, http.server, json, sys, urllib.parse

class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.answer(b"")

    def do_POST(self):
        self.answer(self.rfile.read(int(self.headers.get("content-length", 0))))

    def answer(self, body):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        seen = {"method": self.command, "path": self.path, "peer": self.client_address[1],
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": hashlib.sha256(body).hexdigest()}
        data = json.dumps(seen).encode()
        data += b" " * max(0, int(query.get("size", ["0"])[0]) - len(data))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
ready = sys.argv[sys.argv.index("--ready-file") + 1]
json.dump({"port": server.server_address[1]}, open(ready, "w"))
server.serve_forever()
"""


def agent_http(agent) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=str(agent.paths.socket))
    return httpx.Client(transport=transport, base_url="http://agent", timeout=60)


def test_requests_and_answers_pass_through_as_sent(shared_agent, project):
    root = project(
        {
            "saved_model.pb": "not a model",
            "gpuhop/__init__.py": "",
            "gpuhop/serving/__init__.py": "",
            "gpuhop/serving/__main__.py": ECHO,
        }
    )
    with shared_agent.client() as client:
        model = client.serve(root, name="echo", timeout=60)
        try:
            base = f"/v1/serve/{model.job.id}"
            body = os.urandom(2 * 1024 * 1024)
            with agent_http(shared_agent) as agent:
                answer = agent.post(
                    f"{base}/v1/models/echo:predict?a=1&b=%2F",
                    content=body,
                    headers={"content-type": "application/json", "x-secret": "no"},
                )
                assert answer.status_code == 200
                seen = answer.json()
                assert seen["method"] == "POST"
                assert seen["path"] == "/v1/models/echo:predict?a=1&b=%2F"
                assert seen["body"] == hashlib.sha256(body).hexdigest()
                assert seen["headers"]["content-type"] == "application/json"
                assert "x-secret" not in seen["headers"]
                assert "authorization" not in seen["headers"]
                # An answer larger than the agent reads whole is streamed, all of it.
                big = agent.get(f"{base}/v1/models/echo?size={3 * 1024 * 1024}")
                assert big.status_code == 200
                assert len(big.content) == 3 * 1024 * 1024
                # One kept connection from the agent carries request after request.
                peers = {agent.get(f"{base}/v1/models/echo").json()["peer"] for _ in range(5)}
                assert len(peers) == 1
        finally:
            model.job.cancel(grace=0)
            model.job.wait(timeout=30)


def test_a_model_server_port_the_job_does_not_listen_on_is_refused(shared_agent, project):
    seen: list[str] = []

    class Other(http.server.BaseHTTPRequestHandler):
        """Another user's service on the host's loopback."""

        def do_POST(self) -> None:
            seen.append(self.path)
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        root = project(
            {
                "saved_model.pb": "not a model",
                "target_port": str(other.server_address[1]),
                "gpuhop/__init__.py": "",
                "gpuhop/serving/__init__.py": "",
                "gpuhop/serving/__main__.py": SHADOW,
            }
        )
        with shared_agent.client() as client:
            model = client.serve(root, name="shadow", timeout=60)
            try:
                with agent_http(shared_agent) as agent:
                    answer = agent.post(
                        f"/v1/serve/{model.job.id}/v1/models/shadow:predict",
                        json={"instances": [[1.0]]},
                    )
                assert answer.status_code == 502
                body = answer.json()
                assert body["code"] == "not_listening"
                # The host's loopback is not the job's: its server is in its private network.
                assert model.job.refresh().private_network
                assert (
                    f"job {model.job.id} (in its private network) has nothing listening on"
                    in (body["error"])
                )
                assert seen == []
            finally:
                model.job.cancel(grace=0)
                model.job.wait(timeout=30)
    finally:
        other.shutdown()
        other.server_close()
        thread.join()


def test_a_model_server_runs_on_a_share_of_one_gpu_at_the_priority_asked(make_agent, project):
    agent = make_agent(fake_gpus=1)
    root = project(
        {
            "saved_model.pb": "not a model",
            "gpuhop/__init__.py": "",
            "gpuhop/serving/__init__.py": "",
            "gpuhop/serving/__main__.py": ECHO,
        }
    )
    clash = agent.cli("serve", str(root), "--name", "echo", "--gpus", "2", "--gpu-memory", "1G")
    assert clash.returncode == 2
    assert "--gpu-memory gives the job a share of one GPU" in clash.stderr
    started = agent.cli(
        "serve", str(root), "--name", "echo", "--gpu-memory", "1GiB", "--priority", "-5", "-d"
    )
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    with agent.client() as client:
        model = client.model("echo")
        model.wait_ready(60)
        info = client.job(job_id).info
        assert (info.gpus, info.gpu_ids, info.gpu_memory_mb, info.priority) == (1, [0], 1024, -5)
        with agent_http(agent) as http:
            assert http.get(f"/v1/serve/{job_id}/v1/models/echo").status_code == 200
        # A second share fits beside it on the same GPU; the SDK takes the same options.
        second = client.serve(root, name="echo2", gpu_memory="2GiB", timeout=60)
        assert (second.job.info.gpu_ids, second.job.info.gpu_memory_mb) == ([0], 2048)
        with pytest.raises(TypeError, match="'pack' is not a job option"):
            client.serve(root, name="echo3", pack=True)
        model.job.cancel()
        second.job.cancel()


def test_serve_takes_the_job_options_env_among_them(shared_agent, project):
    # The shadowing server says what environment it got, and ends.
    says = "import os\nprint('GREETING=' + os.environ.get('GREETING', '-'))\n"
    root = project(
        {
            "saved_model.pb": "not a model",
            "gpuhop/__init__.py": "",
            "gpuhop/serving/__init__.py": "",
            "gpuhop/serving/__main__.py": says,
        }
    )
    started = shared_agent.cli("serve", str(root), "-n", "envd", "-e", "GREETING=hi", "-d")
    assert started.returncode == 0, started.stderr
    job = started.stdout.strip()
    followed = shared_agent.cli("logs", "-f", job)
    assert (followed.returncode, followed.stdout) == (0, "GREETING=hi\n")
    refused = shared_agent.cli("serve", str(root), "-n", "envd", "-e", "GPUHOP_X=1")
    assert refused.returncode == 2
    assert "environment variable GPUHOP_X is set by gpuhop" in refused.stderr
