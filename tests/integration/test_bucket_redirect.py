"""A bucket's server that answers an object's read with a redirect to another server (a
user's own server can): the fetch's reader (what the agent runs, with obstore, which follows
redirects to any host) refuses the other server's answer, as it would the cloud's metadata
service's (the GPU host's own credentials). Real servers on loopback, real HTTP."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpuhop.agent.storage import bucketreads
from gpuhop.agent.storage.buckets import BucketError, Credentials, client
from gpuhop.agent.storage.objectdownloads import ObjectId

SECRET = b"what only the host's own network may read"


class Elsewhere(http.server.BaseHTTPRequestHandler):
    """The other server: answers every read with SECRET, and an ETag of its own."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(SECRET)))
        self.send_header("ETag", '"elsewhere"')
        self.end_headers()
        self.wfile.write(SECRET)

    def log_message(self, *args: object) -> None:
        pass


def redirecting(to: str) -> type[http.server.BaseHTTPRequestHandler]:
    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(307)
            self.send_header("Location", f"{to}/latest/meta-data/iam/security-credentials/x")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    return Redirect


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("listed_etag", ["d41d8cd98f00b204e9800998ecf8427e", "elsewhere-not"])
def test_an_answer_from_another_server_is_refused(tmp_path: Path, listed_etag: str) -> None:
    with serving(Elsewhere) as other, serving(redirecting(other)) as bucket_server:
        values = {
            "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "x" * 40,
            "AWS_ENDPOINT_URL": bucket_server,
            "AWS_REGION": "us-east-1",
        }
        reader = client(Credentials("dave", values, own_config=False), 2)
        oid = ObjectId(bucket_server, "data", "train/creds.json", listed_etag, len(SECRET))
        part = tmp_path / "part"
        try:
            with pytest.raises(BucketError, match="is not the object it listed"):
                bucketreads.download(reader, oid, part, lambda n: None)
        finally:
            reader.close()
    assert not part.exists() or SECRET not in part.read_bytes()
