"""The agent's proxy to model servers reaches only what the model server job itself listens
on (a real agent, a real job; no TensorFlow): a job that names another process's port as
its own gets a 502, and that process never sees the request."""

from __future__ import annotations

import http.server
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
                transport = httpx.HTTPTransport(uds=str(shared_agent.paths.socket))
                with httpx.Client(transport=transport, base_url="http://agent") as agent:
                    answer = agent.post(
                        f"/v1/serve/{model.job.id}/v1/models/shadow:predict",
                        json={"instances": [[1.0]]},
                    )
                assert answer.status_code == 502
                body = answer.json()
                assert body["code"] == "not_listening"
                assert f"job {model.job.id} does not listen on 127.0.0.1:" in body["error"]
                assert "another process does" in body["error"]
                assert seen == []
            finally:
                model.job.cancel(grace=0)
                model.job.wait(timeout=30)
    finally:
        other.shutdown()
        other.server_close()
        thread.join()
