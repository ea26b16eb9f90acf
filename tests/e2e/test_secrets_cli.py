# ruff: noqa: F811 (the fixture imported from test_notify is a parameter here)
"""Secrets as a user handles them: `gpuhop secret set | ls | rm` and `run --secret`, against a
real agent. The job gets the value; no text gpuhop shows or keeps (log, `logs`, `show`, `ps`,
its metrics, the dashboard, /metrics, a webhook's payload, the state dir's files and
databases) ever holds it."""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path

import httpx
import pytest

from tests.conftest import Agent, wait_until
from tests.integration.test_notify import Webhook, notify_agent  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(120)

# Prints the secret whole, then split across two writes with a pause between them, and
# proves it has the right value without printing it (its hash).
JOB = """\
import hashlib, os, sys, time
value = os.environ["API_TOKEN"]
print("token:", value, flush=True)
sys.stdout.write("split:" + value[:5]); sys.stdout.flush(); time.sleep(0.2)
sys.stdout.write(value[5:] + ":end\\n"); sys.stdout.flush()
print("alias", os.environ["ALIAS"] == value, "sha", hashlib.sha256(value.encode()).hexdigest())
print("stderr:", value, file=sys.stderr, flush=True)
import json
pin = int(os.environ["PIN_CODE"])
with open(os.environ["GPUHOP_METRICS_FILE"], "a") as f:  # as a string, in a key, in a number
    f.write(json.dumps({"step": 1, "loss": 0.5, "note": "key " + value, value: 2.0}) + "\\n")
    f.write(json.dumps({"step": 2, "loss": 0.25, "note": "key " + value, "pin": pin}) + "\\n")
"""


def _files(home: Path) -> dict[Path, bytes]:
    """Every regular file of the state dir but the secrets' own store: the job store (WAL
    included: every `*.db*`), the jobs' dirs, logs, trees and blobs."""
    return {
        p: p.read_bytes()
        for p in home.rglob("*")
        if p.is_file() and not p.is_symlink() and "secrets" not in p.relative_to(home).parts
    }


def _dashboard(agent: Agent, job_id: str) -> list[str]:
    """The dashboard's job page and its JSON (the job, the list, its log), as the owner."""
    transport = httpx.HTTPTransport(uds=str(agent.paths.socket))
    with httpx.Client(transport=transport, base_url="http://gpuhop", timeout=30) as http:
        code = http.post("/v1/ui/login-codes").json()["code"]
        cookie = http.get("/ui/login", params={"code": code}).cookies["gpuhop_ui"]
        http.cookies.clear()
        paths = [f"/ui/jobs/{job_id}", f"/ui/api/jobs/{job_id}", "/ui/api/jobs"]
        paths += [f"/ui/api/jobs/{job_id}/log", f"/ui/api/jobs/{job_id}/metrics"]
        answers = [http.get(p, headers={"cookie": f"gpuhop_ui={cookie}"}) for p in paths]
    assert [r.status_code for r in answers] == [200] * len(paths), [r.text for r in answers]
    return [r.text for r in answers]


def test_a_job_gets_its_secret_and_no_surface_shows_it(notify_agent: Agent, project):
    """On an agent whose admin allows notifications to loopback (test_notify's), so that a
    real webhook receives the job's start and end."""
    agent = notify_agent
    value = "tok-" + secrets.token_hex(16)
    pin = str(9 * 10**14 + secrets.randbelow(10**14))  # a secret of digits, written as a number
    root = project({"job.py": JOB})
    for name, given in (("API_TOKEN", value), ("PIN_CODE", pin)):
        set_ = agent.cli("secret", "set", name, input=given + "\n")
        assert set_.returncode == 0, set_.stderr
    webhook = Webhook()
    try:
        run = agent.cli(
            "run",
            "--secret",
            "API_TOKEN",
            "--secret",
            "API_TOKEN=ALIAS",
            "--secret",
            "PIN_CODE",
            "--notify",
            f"{webhook.url}/hook",
            "job.py",
            cwd=root,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        wait_until(lambda: len(webhook.events("/hook")) == 2)
        notified = webhook.events("/hook")
    finally:
        webhook.close()
    sha = hashlib.sha256(value.encode()).hexdigest()
    assert f"alias True sha {sha}" in run.stdout  # it had the value, under both names
    assert "token: ***" in run.stdout and "split:***:end" in run.stdout  # the split one too
    assert "stderr: ***" in run.stdout
    job_id = json.loads(agent.cli("ps", "--json").stdout)[0]["id"]

    shown = [run.stdout, run.stderr]
    for args in (("logs", job_id), ("show", job_id, "--json"), ("show", job_id), ("ps", "--json")):
        answer = agent.cli(*args)
        assert answer.returncode == 0, answer.stderr
        shown.append(answer.stdout + answer.stderr)
    info = json.loads(shown[3])
    assert info["secrets"] == ["API_TOKEN", "API_TOKEN=ALIAS", "PIN_CODE"]
    assert "API_TOKEN" not in info["env"] and "ALIAS" not in info["env"]
    # Its metrics as served: the value masked in a string, and a number of the PIN's digits.
    assert info["latest_metrics"] == {"step": 2, "loss": 0.25, "note": "key ***", "pin": "***"}
    with agent.client() as client:
        records, _ = client.job(job_id).metrics()
    assert records[0] == {"step": 1, "loss": 0.5, "note": "key ***", "***": 2.0}
    shown.append(json.dumps(records))
    # The webhook's payloads: its start, and its end with the last metrics, masked.
    assert [n["event"] for n in notified] == ["started", "succeeded"]
    assert notified[1]["job"]["metrics"]["note"] == "key ***"
    shown.append(json.dumps(notified))
    shown += _dashboard(agent, job_id)
    shown.append(_scrape(agent))
    assert [i for i, text in enumerate(shown) if value in text or pin in text] == []
    assert value[:12] not in "".join(shown)  # not even the split half of it

    log = agent.paths.job_dir(job_id) / "output.log"
    assert b"token: ***\n" in log.read_bytes()
    # The metrics file as kept: masked once the job ended.
    kept = (agent.paths.job_dir(job_id) / "metrics.jsonl").read_text().splitlines()
    assert json.loads(kept[0]) == {"step": 1, "loss": 0.5, "note": "key ***", "***": 2.0}
    leaked = [
        p
        for p, data in _files(agent.home).items()
        if value.encode() in data or pin.encode() in data
    ]
    assert leaked == []
    store = agent.paths.secrets_db
    assert store.stat().st_mode & 0o777 == 0o600
    assert store.parent.stat().st_mode & 0o777 == 0o700


def _scrape(agent: Agent) -> str:
    """The agent's /metrics, as Prometheus scrapes it."""
    transport = httpx.HTTPTransport(uds=str(agent.paths.socket))
    with httpx.Client(transport=transport, base_url="http://gpuhop", timeout=30) as http:
        answer = http.get("/metrics")
    assert answer.status_code == 200, answer.text
    return answer.text


def test_secret_commands_never_take_or_show_a_value(shared_agent: Agent, tmp_path: Path):
    value = "file-" + secrets.token_hex(8)
    (tmp_path / "key.txt").write_text(value + "\n")
    done = shared_agent.cli("secret", "set", "FROM_FILE", "--from-file", str(tmp_path / "key.txt"))
    assert done.returncode == 0, done.stderr
    listed = shared_agent.cli("secret", "ls")
    json_listed = shared_agent.cli("secret", "ls", "--json")
    assert "FROM_FILE" in listed.stdout and value not in listed.stdout + json_listed.stdout
    assert {"name", "set_at"} == set(
        next(s for s in json.loads(json_listed.stdout) if s["name"] == "FROM_FILE")
    )
    # No way to give the value as an argument: no such option, no second argument.
    for args in (("FROM_FILE", value), ("FROM_FILE", "--value", value)):
        refused = shared_agent.cli("secret", "set", *args, input=value)
        assert refused.returncode == 2 and (
            "unexpected extra argument" in refused.stderr.lower()
            or "no such option" in refused.stderr.lower()
        )
    bad = shared_agent.cli("secret", "set", "1BAD", input="long enough")
    assert bad.returncode == 2 and "secret name '1BAD' is not valid" in bad.stderr
    empty = shared_agent.cli("secret", "set", "EMPTY", input="")
    assert empty.returncode == 2 and "no value for EMPTY" in empty.stderr
    # A value of a character or three would turn those characters into *** in every log.
    short = shared_agent.cli("secret", "set", "SHORT", input="abc")
    assert short.returncode == 2
    assert "a secret's value must be at least 4 characters" in " ".join(short.stderr.split())
    assert "SHORT" not in shared_agent.cli("secret", "ls").stdout
    (tmp_path / "binary").write_bytes(b"ab\xff\xfe")
    binary = [
        shared_agent.cli("secret", "set", "BINARY", input=b"ab\xff\xfe", text=False),
        shared_agent.cli("secret", "set", "BINARY", "--from-file", str(tmp_path / "binary")),
    ]
    for refused in binary:
        said = refused.stderr if isinstance(refused.stderr, str) else refused.stderr.decode()
        assert refused.returncode == 2
        assert "the value of BINARY is not UTF-8 text (byte 2)" in said
    removed = shared_agent.cli("secret", "rm", "FROM_FILE")
    assert removed.returncode == 0, removed.stderr
    again = shared_agent.cli("secret", "rm", "FROM_FILE")
    assert again.returncode != 0 and "you have no secret named FROM_FILE" in again.stderr


def test_a_job_naming_an_unknown_secret_or_spelling_one_out_is_refused(
    shared_agent: Agent, project
):
    root = project({"job.py": "print('never runs')"})
    unknown = shared_agent.cli("run", "--secret", "NO_SUCH_SECRET", "job.py", cwd=root)
    assert unknown.returncode != 0
    assert "you have no secret named NO_SUCH_SECRET" in unknown.stderr
    value = "spelled-" + secrets.token_hex(8)
    assert shared_agent.cli("secret", "set", "SPELLED", input=value).returncode == 0
    spelled = shared_agent.cli("run", "-e", f"KEY={value}", "job.py", cwd=root)
    assert spelled.returncode != 0
    assert "environment (--env) holds the value of one of your secrets" in spelled.stderr
    assert value not in spelled.stderr + spelled.stdout
    clash = shared_agent.cli("run", "--secret", "SPELLED=X", "-e", "X=1", "job.py", cwd=root)
    assert clash.returncode == 2 and "X is given both by --env and by --secret" in clash.stderr
