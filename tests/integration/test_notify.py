"""Notifications (issue 22): a real HTTP server in the test receives the agent's POSTs when a
job starts and ends; webhooks that refuse or never answer hold up neither submits nor other
jobs; and the agent refuses to aim notifications at loopback hosts no admin allowed."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuhop.agent.jobs.notifier import HostRule, Notifier
from gpuhop.api import JobState
from gpuhop.api.spec import MAX_NOTIFY_URLS
from gpuhop.client import GpuhopError
from tests.conftest import Agent, wait_until

METRICS = (
    "import json, os\n"
    "with open(os.environ['GPUHOP_METRICS_FILE'], 'a') as f:\n"
    "    f.write(json.dumps({'epoch': 1, 'loss': 0.25}) + '\\n')\n"
)
# A webhook that never answers keeps its connection this long (the agent's timeout).
HANG_SECONDS = 120


class Webhook:
    """A real HTTP server on loopback that records every POST: (path, JSON body)."""

    def __init__(self, fail_first: int = 0) -> None:
        """`fail_first`: answer the first this many POSTs with a 503."""
        self.received: list[tuple[str, dict]] = []
        received = self.received
        failures = [fail_first]

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, json.loads(body)))
                self.send_response(503 if failures[0] > 0 else 204)
                failures[0] -= 1
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def events(self, path: str) -> list[dict]:
        return [body for p, body in self.received if p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


class Silent:
    """A port that accepts connections and never answers on them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.held.append(self.sock.accept()[0])

    def open_connections(self) -> int:
        """Held connections the agent has not given up on (its end not yet closed)."""
        count = 0
        for conn in self.held:
            conn.setblocking(False)
            try:
                closed = conn.recv(65536, socket.MSG_PEEK) == b""
            except BlockingIOError:
                closed = False
            except OSError:
                closed = True
            count += not closed
        return count

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join()
        for conn in self.held:
            conn.close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/nobody"


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture(scope="module")
def notify_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """An agent whose admin allows notifications to 127.0.0.1 (the test's servers)."""
    root = Path(tmp_path_factory.mktemp("notify-agent"))
    (root / "home").mkdir()
    (root / "home" / "agent.toml").write_text(
        f'notify_allowed_hosts = ["127.0.0.1"]\nnotify_timeout_seconds = {HANG_SECONDS}\n'
    )
    agent = Agent(root / "home", root / "cache", None)
    try:
        yield agent.start()
    finally:
        agent.shutdown()


def test_a_webhook_hears_of_a_jobs_start_and_success_or_failure(notify_agent, webhook, project):
    root = project({"ok.py": METRICS, "bad.py": "raise SystemExit(3)\n"})
    with notify_agent.client() as client:
        ok = client.submit(["ok.py"], workdir=root, name="good", notify=[f"{webhook.url}/ok"])
        bad = client.submit(["bad.py"], workdir=root, notify=[f"{webhook.url}/bad"])
        assert ok.wait(timeout=60).state == JobState.succeeded
        assert bad.wait(timeout=60).state == JobState.failed
    wait_until(lambda: len(webhook.events("/ok")) == 2 and len(webhook.events("/bad")) == 2)
    started, ended = webhook.events("/ok")
    assert (started["event"], ended["event"]) == ("started", "succeeded")
    job = ended["job"]
    assert (job["id"], job["name"], job["state"], job["exit_code"]) == (
        ok.id,
        "good",
        "succeeded",
        0,
    )
    assert job["owner"] and job["duration_s"] >= 0 and "end_class" in job
    assert job["metrics"] == {"epoch": 1, "loss": 0.25}
    assert f"job {ok.id} (good)" in ended["text"] and "succeeded" in ended["text"]
    assert [e["event"] for e in webhook.events("/bad")] == ["started", "failed"]
    assert webhook.events("/bad")[1]["job"]["exit_code"] == 3


def test_one_webhook_given_alone_as_a_str_is_told(notify_agent, webhook, project):
    # As `data`, `secrets` and `after` take one alone: a str was read as its characters,
    # and the submit refused "notify URL 'h'".
    root = project({"main.py": "pass\n"})
    with notify_agent.client() as client:
        job = client.submit(["main.py"], workdir=root, notify=f"{webhook.url}/one")
        assert job.wait(timeout=60).state == JobState.succeeded
    wait_until(lambda: len(webhook.events("/one")) == 2)
    assert [e["job"]["id"] for e in webhook.events("/one")] == [job.id, job.id]


def test_a_webhooks_url_is_a_secret_kept_out_of_the_agents_log_and_views(
    notify_agent, webhook, project
):
    """Slack's, Discord's and ntfy's webhook URLs carry their token in the path: whoever can
    read the agent's log, `show`, `ps` or the dashboard could post to the user's channel."""
    token = "T0001/B0002/s3cretW3bhookT0ken"
    root = project({"main.py": "pass\n"})
    with notify_agent.client() as client:
        job = client.submit(["main.py"], workdir=root, notify=[f"{webhook.url}/{token}"])
        assert job.wait(timeout=60).state == JobState.succeeded
    wait_until(lambda: len(webhook.events(f"/{token}")) == 2)
    shown = notify_agent.cli("show", "--json", job.id)
    listed = notify_agent.cli("ps", "--json")
    assert shown.returncode == 0 and listed.returncode == 0, shown.stderr + listed.stderr
    assert json.loads(shown.stdout)["notify"] == [f"{webhook.url}/…"]
    assert job.id in listed.stdout
    for seen in (notify_agent.paths.logfile.read_text(), shown.stdout, listed.stdout):
        assert "s3cret" not in seen


def test_a_job_cancelled_before_it_starts_is_told_once(notify_agent, webhook, project):
    root = project(
        {
            "bad.py": "raise SystemExit(3)\n",
            "ok.py": "pass\n",
            "nap.py": "import time; time.sleep(60)\n",
        }
    )
    with notify_agent.client() as client:
        first = client.submit(["bad.py"], workdir=root)
        # Waits for `first`, which fails: cancelled before it starts, naming it.
        after = client.submit(["ok.py"], workdir=root, after=first, notify=[f"{webhook.url}/a"])
        assert after.wait(timeout=60).state == JobState.cancelled
        held = client.submit(["nap.py"], workdir=root, after=after, after_any=True)
        queued = client.submit(["ok.py"], workdir=root, after=held, notify=[f"{webhook.url}/q"])
        queued.cancel()
        held.cancel()
    wait_until(lambda: webhook.events("/a") and webhook.events("/q"))
    for path, job in (("/a", after), ("/q", queued)):
        (told,) = webhook.events(path)
        assert told["event"] == "cancelled" and told["job"]["id"] == job.id
        assert told["job"]["end_class"] == "cancelled"
    assert first.id in webhook.events("/a")[0]["job"]["reason"]


def test_unreachable_webhooks_hold_up_neither_submits_nor_other_jobs(
    notify_agent, webhook, project
):
    silent = Silent()
    try:
        root = project({"main.py": "print('hi')\n"})
        with notify_agent.client() as client:
            first = client.submit(["main.py"], workdir=root, notify=[closed_port_url(), silent.url])
            # The agent is now stuck waiting on the silent webhook (for HANG_SECONDS) ...
            wait_until(lambda: silent.open_connections() >= 1)
            assert first.wait(timeout=60).state == JobState.succeeded
            # ... and still a submit is taken, its job runs, and its webhook hears of it.
            second = client.submit(["main.py"], workdir=root, notify=[f"{webhook.url}/2"])
            assert second.wait(timeout=60).state == JobState.succeeded
            wait_until(lambda: len(webhook.events("/2")) == 2)
        assert silent.open_connections() >= 1  # never answered, never given up on yet
    finally:
        silent.close()


def test_a_webhook_that_never_answers_holds_up_only_its_own_notifications(
    notify_agent, webhook, project
):
    """More of one hanging webhook's notifications than the agent has senders: each waits
    for the webhook's timeout (HANG_SECONDS), yet another webhook hears of its job at once."""
    silent = Silent()
    try:
        root = project({"main.py": "pass\n"})
        hanging = [f"{silent.url}/{i}" for i in range(MAX_NOTIFY_URLS)]
        with notify_agent.client() as client:
            first = client.submit(["main.py"], workdir=root, notify=hanging)
            assert first.wait(timeout=60).state == JobState.succeeded
            wait_until(lambda: silent.open_connections() >= 1)
            second = client.submit(["main.py"], workdir=root, notify=[f"{webhook.url}/2"])
            assert second.wait(timeout=60).state == JobState.succeeded
            wait_until(lambda: len(webhook.events("/2")) == 2)
        assert silent.open_connections() >= 1  # still hanging: heard of before its timeout
    finally:
        silent.close()


def test_notifications_to_hosts_an_admin_did_not_allow_are_refused(
    notify_agent, shared_agent, project
):
    root = project({"main.py": "pass\n"})
    with notify_agent.client() as client, pytest.raises(GpuhopError) as listed:
        client.submit(["main.py"], workdir=root, notify=["https://example.com/hook"])
    assert listed.value.status == 400
    assert "example.com:443 is not among the hosts this agent notifies" in listed.value.message
    # An agent with no allow-list: public hosts only, never loopback or private ones.
    with shared_agent.client() as client:
        for url, why in (
            ("http://127.0.0.1:8080/x", "loopback, private or reserved"),
            ("http://[::1]/x", "loopback, private or reserved"),
            ("http://10.1.2.3/x", "loopback, private or reserved"),
            ("http://localhost:5000/x", "only an admin can allow it"),
        ):
            with pytest.raises(GpuhopError) as refused:
                client.submit(["main.py"], workdir=root, notify=[url])
            assert refused.value.status == 400 and why in refused.value.message, url
        with pytest.raises(GpuhopError) as scheme:
            client.submit(["main.py"], workdir=root, notify=["file:///etc/passwd"])
        assert "only http:// and https:// URLs are allowed" in scheme.value.message


def test_too_many_webhooks_are_refused_naming_the_limit(notify_agent, webhook, project):
    root = project({"main.py": "pass\n"})
    urls = [f"{webhook.url}/{i}" for i in range(MAX_NOTIFY_URLS + 1)]
    ran = notify_agent.cli("run", "-d", *(f"--notify={url}" for url in urls), "main.py", cwd=root)
    assert ran.returncode == 2
    assert f"notify: {len(urls)} webhooks; a job may have at most {MAX_NOTIFY_URLS}" in ran.stderr
    assert "List should have" not in ran.stderr
    # Said before the work dir is synced, not after its upload.
    hashed: list[object] = []
    with notify_agent.client() as client:
        with pytest.raises(GpuhopError) as many:
            client.submit(["main.py"], workdir=root, notify=urls, on_hash=hashed.append)
        assert f"{len(urls)} webhooks; a job may have at most" in many.value.message
    assert hashed == []  # the work dir was not even scanned


def test_notify_desktop_tells_this_machine_when_a_waited_for_job_ends(
    shared_agent, project, tmp_path
):
    root = project({"main.py": METRICS.replace("'loss'", "'[red]loss'")})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shown = tmp_path / "shown.txt"
    notify_send = bin_dir / "notify-send"
    notify_send.write_text(f'#!/bin/sh\nprintf "%s|" "$@" > {shown}\n')
    notify_send.chmod(0o755)
    env = {**shared_agent.env, "PATH": f"{bin_dir}:{shared_agent.env['PATH']}"}

    ran = shared_agent.cli("run", "--notify", "desktop", "main.py", cwd=root, env=env)

    assert ran.returncode == 0, ran.stderr
    args = shown.read_text().split("|")
    assert args[0] == "--app-name=gpuhop"
    assert args[1].startswith("gpuhop: job ") and args[1].endswith(" succeeded")
    # The body is the text the terminal shows, not its markup; the job's own brackets stay.
    job_id = args[1].split()[2]
    assert args[2].startswith(f"job {job_id} succeeded: exited with code 0 after ")
    assert args[2].endswith("\n  last metrics: epoch=1 [red]loss=0.25")
    # Without notify-send: a terminal bell and a line.
    (tmp_path / "empty").mkdir()
    bare = {**shared_agent.env, "PATH": str(tmp_path / "empty")}
    ran = shared_agent.cli("run", "--notify", "desktop", "main.py", cwd=root, env=bare)
    assert ran.returncode == 0, ran.stderr
    assert "\agpuhop: job " in ran.stderr and " succeeded\n" in ran.stderr
    detached = shared_agent.cli("run", "--notify", "desktop", "-d", "main.py", cwd=root)
    assert detached.returncode == 2 and "needs a run that waits" in detached.stderr


def test_a_failing_webhook_is_tried_again_and_a_jobs_end_never_overtakes_its_start():
    hook = Webhook(fail_first=2)
    notifier = Notifier(HostRule(["127.0.0.1"]), first_delay=0.01)
    try:
        assert notifier.send(f"{hook.url}/x", {"event": "started"}, key="job1")
        assert notifier.send(f"{hook.url}/x", {"event": "succeeded"}, key="job1")
        wait_until(lambda: len(hook.received) == 4)
        # Several senders, yet the end waits for its start, refused twice, to be taken.
        assert [body["event"] for _, body in hook.received] == [
            "started",
            "started",
            "started",
            "succeeded",
        ]
    finally:
        notifier.close()
        hook.close()


def test_one_users_hanging_webhooks_leave_senders_for_the_others(webhook):
    """Mallory's webhooks, each on a host of its own, never answer: as many of them as there
    are senders take at most `per_owner` of those, and Alice's notification goes out."""
    silents = [Silent() for _ in range(4)]
    notifier = Notifier(HostRule(["127.0.0.1"]), senders=4, per_owner=2, timeout=HANG_SECONDS)
    try:
        for i, silent in enumerate(silents):
            assert notifier.send(silent.url, {"n": i}, key=f"job{i}", owner="mallory")
        wait_until(lambda: sum(s.open_connections() for s in silents) == 2)
        assert notifier.send(f"{webhook.url}/alice", {"n": 9}, key="job9", owner="alice")
        wait_until(lambda: webhook.events("/alice") == [{"n": 9}])
        assert sum(s.open_connections() for s in silents) == 2  # still waiting for an answer
    finally:
        notifier.close()
        for silent in silents:
            silent.close()


def test_the_queue_of_notifications_is_bounded():
    silent = Silent()
    notifier = Notifier(HostRule(["127.0.0.1"]), senders=1, max_pending=2, timeout=0.2)
    try:
        # Each of another user's jobs, so that none passes a user's share of the queue.
        assert notifier.send(silent.url, {"n": 1}, owner="a")
        assert notifier.send(silent.url, {"n": 2}, owner="b")
        assert not notifier.send(silent.url, {"n": 3}, owner="c")  # dropped, not held without bound
        assert notifier.dropped == 1
    finally:
        notifier.close()
        silent.close()


def test_one_users_notifications_fill_only_their_share_of_the_queue(webhook, caplog):
    """Mallory's webhook never answers and her jobs send more than the whole queue holds: a
    quarter of it waits, the rest of hers are dropped (said once in the log), and Alice's
    still go out. Once hers are given up, her new ones are queued again."""
    silent = Silent()
    notifier = Notifier(HostRule(["127.0.0.1"]), max_pending=12, timeout=HANG_SECONDS, tries=1)
    try:
        sent = [
            notifier.send(silent.url, {"n": n}, key=f"job{n}", owner="mallory") for n in range(20)
        ]
        assert sent == [True] * 3 + [False] * 17
        assert notifier.dropped == 17
        for n in range(3):
            assert notifier.send(f"{webhook.url}/alice", {"n": n}, key=f"a{n}", owner="alice")
        wait_until(lambda: len(webhook.events("/alice")) == 3)

        def said(words: str) -> list[str]:
            return [r.getMessage() for r in caplog.records if words in r.getMessage()]

        assert said("notifications of mallory's jobs are dropped from now on: 3 of theirs") == [
            "notifications of mallory's jobs are dropped from now on: 3 of theirs are waiting"
            " already, a user's share of the queue (webhooks that do not answer?)"
        ]
        silent.close()  # her webhook hangs up: her notifications fail, and are given up
        wait_until(lambda: said("notifications of mallory's jobs are queued again"))
        assert said("mallory's jobs are queued again") == [
            "notifications of mallory's jobs are queued again; 17 were dropped"
        ]
        assert notifier.send(f"{webhook.url}/mallory", {"n": 20}, key="job20", owner="mallory")
        wait_until(lambda: webhook.events("/mallory") == [{"n": 20}])
    finally:
        notifier.close()
        silent.close()


def test_the_text_names_the_models_metrics_not_when_the_record_was_written(
    notify_agent, webhook, project
):
    """A Keras-style record: its time, planned epochs and a flag are no metrics of the model;
    the text keeps room for the validation metrics instead (six values at most)."""
    record = {
        "time": 1796260947.186,
        "epoch": 20,
        "epochs": 20,
        "step": 900,
        "loss": 0.0345,
        "accuracy": 0.9916,
        "val_loss": 0.0953,
        "val_accuracy": 0.9722,
        "flag": True,
    }
    script = (
        "import json, os\n"
        "with open(os.environ['GPUHOP_METRICS_FILE'], 'a') as f:\n"
        f"    f.write(json.dumps({record!r}) + '\\n')\n"
    )
    root = project({"fit.py": script})
    with notify_agent.client() as client:
        fit = client.submit(["fit.py"], workdir=root, notify=[f"{webhook.url}/fit"])
        assert fit.wait(timeout=60).state == JobState.succeeded
    wait_until(lambda: len(webhook.events("/fit")) == 2)
    ended = webhook.events("/fit")[1]
    assert ended["text"].endswith(
        "; epoch=20, step=900, loss=0.0345, accuracy=0.9916, val_loss=0.0953, val_accuracy=0.9722"
    )
    assert ended["job"]["metrics"]["time"] == record["time"]  # the payload keeps the record


def test_a_jobs_metric_names_never_put_mentions_or_links_in_the_text(
    notify_agent, webhook, project
):
    """The text goes to chat channels (the agent's `notify`: the admin's, told of every job):
    a hostile job's metric named "<!channel> ..." or "@all" must not ping everyone there."""
    record = {
        "<!channel> log in again at <https://evil.example|slack.com>": 1,
        "@all": 2,
        "train/loss": 0.5,
    }
    script = (
        "import json, os\n"
        "with open(os.environ['GPUHOP_METRICS_FILE'], 'a') as f:\n"
        f"    f.write(json.dumps({record!r}) + '\\n')\n"
    )
    root = project({"evil.py": script})
    with notify_agent.client() as client:
        job = client.submit(["evil.py"], workdir=root, notify=[f"{webhook.url}/evil"])
        assert job.wait(timeout=60).state == JobState.succeeded
    wait_until(lambda: len(webhook.events("/evil")) == 2)
    ended = webhook.events("/evil")[1]
    assert ended["text"].endswith("; train/loss=0.5")
    assert ended["job"]["metrics"] == record  # as data, it stays
