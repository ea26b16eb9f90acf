"""Which hosts a notification may reach (the SSRF rule) and what a webhook is sent."""

from __future__ import annotations

import json
import re

import pytest

from gpuhop.agent.config import Policy, PolicyError, load
from gpuhop.agent.jobs.notifier import HostRule, payload
from gpuhop.agent.jobs.records import JobRecord
from gpuhop.api import JobState
from gpuhop.api.queue import check_webhook_url
from gpuhop.api.spec import JobSpec


def record(**more: object) -> JobRecord:
    fields: dict = dict(
        id="abcd1234",
        state=JobState.failed,
        command=["train.py"],
        spec=JobSpec(name="grid[lr=0.1]", gpus=1),
        gpu_ids=[0],
        attempt=1,
        created_at=100.0,
        started_at=110.0,
        ended_at=170.5,
        exit_code=3,
        reason="exited with code 3 after 1 min",
        owner="alice",
    )
    fields.update(more)
    return JobRecord(**fields)


SLACK_HOOK = "https://hooks.slack.com/services/T0/B0/x"


def test_a_slack_incoming_webhook_gets_only_a_text():
    body = payload(record(), "failed", SLACK_HOOK, {"loss": 0.5})

    assert body == {
        "text": "gpuhop: job abcd1234 (grid[lr=0.1]) of alice failed: exited with code 3"
        " after 1 min; loss=0.5"
    }


def test_slack_reads_no_markup_in_the_text():
    body = payload(record(reason="a <!channel> & <https://x|y>"), "failed", SLACK_HOOK, None)
    assert body["text"].endswith("failed: a &lt;!channel&gt; &amp; &lt;https://x|y&gt;")


def test_a_discord_webhook_gets_its_content_and_pings_nobody():
    # Discord answered the generic JSON with 400 (it wants `content`): five tries, dropped.
    hook = "https://discord.com/api/webhooks/123/abc"
    body = payload(record(reason="@everyone " + "x" * 3000), "failed", hook, None)
    assert set(body) == {"content", "allowed_mentions"}
    assert body["content"].startswith("gpuhop: job abcd1234 (grid[lr=0.1]) of alice failed: @")
    assert len(body["content"]) == 2000 and body["allowed_mentions"] == {"parse": []}
    # Another path on that host is no webhook of Discord's: the facts as JSON.
    assert "job" in payload(record(), "failed", "https://discord.com/hooks/x", None)


def test_another_webhook_gets_the_jobs_facts_as_json():
    body = payload(record(), "failed", "https://ci.example.com/hook", {"loss": 0.5, "epoch": 2})

    job = body["job"]
    assert body["event"] == "failed" and body["text"].startswith("gpuhop: job abcd1234")
    assert (job["id"], job["owner"], job["state"], job["exit_code"]) == (
        "abcd1234",
        "alice",
        "failed",
        3,
    )
    assert job["duration_s"] == 60.5 and job["metrics"] == {"loss": 0.5, "epoch": 2}
    assert job["end_class"] is None  # an agent without failure classes


def test_a_start_says_started_and_no_reason_even_if_the_job_has_ended_since():
    body = payload(record(state=JobState.succeeded), "started", "http://x.example/", None)
    assert body["event"] == "started" and "exited" not in body["text"]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/",
        "http://[::1]/",
        "http://169.254.169.254/latest/meta-data",  # a cloud's metadata service
        "http://192.168.1.10/",
        "http://0.0.0.0:9000/",
        "http://localhost/",
        "http://agent.localhost/",
    ],
)
def test_with_no_allow_list_loopback_private_and_link_local_hosts_are_refused(url: str):
    assert HostRule().refusal(url, resolve=False) is not None


def test_with_no_allow_list_a_public_host_passes():
    assert HostRule().refusal("https://93.184.216.34/hook", resolve=False) is None
    assert HostRule().refusal("https://hooks.slack.com/services/x", resolve=False) is None


def test_an_allow_list_takes_only_its_hosts_ports_and_domains():
    rule = HostRule(["127.0.0.1:9000", "*.example.com", "hooks.slack.com"])

    assert rule.refusal("http://127.0.0.1:9000/x", resolve=True) is None
    assert rule.refusal("https://ci.example.com/x", resolve=True) is None
    assert rule.refusal("https://hooks.slack.com/x", resolve=True) is None
    assert "not among" in (rule.refusal("http://127.0.0.1:9001/x", resolve=True) or "")
    assert "not among" in (rule.refusal("https://evil.com/x", resolve=True) or "")
    assert "not among" in (rule.refusal("https://example.com.evil.com/", resolve=True) or "")


def test_an_allow_list_takes_ipv6_hosts_written_as_in_a_url():
    rule = HostRule(["[::1]:9000", "[fd00::2]"])

    assert rule.refusal("http://[::1]:9000/x", resolve=True) is None
    assert rule.refusal("http://[fd00::2]:8443/x", resolve=True) is None
    refused = rule.refusal("http://[::1]:9001/x", resolve=True) or ""
    assert refused.startswith("[::1]:9001 is not among the hosts this agent notifies")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://example.com/", "only http:// and https://"),
        ("http:///nohost", "only http:// and https://"),
        ("https://user:pw@example.com/", "credentials"),
        ("https://example.com:99999/", "notify URL"),
        ("https://example.com/a b", "spaces"),
    ],
)
def test_bad_webhook_urls_are_named(url: str, why: str):
    with pytest.raises(ValueError, match=why):
        check_webhook_url(url)


def test_agent_toml_takes_notify_lists_and_user_limits():
    policy = Policy().with_settings(
        {
            "notify": ["https://hooks.slack.com/services/x"],
            "notify_allowed_hosts": ["hooks.slack.com"],
            "user_max_gpus": 2,
            "user_max_queued": 10,
        },
        "agent.toml",
    )
    assert policy.notify == ("https://hooks.slack.com/services/x",)
    assert (policy.user_max_gpus, policy.user_max_queued) == (2, 10)
    with pytest.raises(PolicyError, match="notify"):
        Policy().with_settings({"notify": "https://x"}, "agent.toml")
    with pytest.raises(PolicyError, match="only http"):
        Policy().with_settings({"notify": ["file:///x"]}, "agent.toml")
    with pytest.raises(PolicyError, match="negative"):
        Policy().with_settings({"user_max_gpus": -1}, "agent.toml")


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("*", '"*" is not taken: it would let users\' webhooks reach every host'),
        ("https://hooks.slack.com", "a host, not a URL: hooks.slack.com"),
        ("*.example.com:8443", "is not a host"),
        ("hooks slack", "is not a host"),
    ],
)
def test_agent_toml_refuses_allowed_hosts_no_webhook_could_match(tmp_path, entry, words):
    """Such an entry would refuse every webhook (or, for "*", be read as allowing loopback
    and the private network): the agent does not start, saying what to write instead."""
    (tmp_path / "agent.toml").write_text(f"notify_allowed_hosts = [{json.dumps(entry)}]\n")
    with pytest.raises(PolicyError, match=re.escape(words)):
        load(tmp_path)


def test_agent_toml_takes_every_form_of_allowed_host_the_rule_matches(tmp_path):
    entries = ["hooks.slack.com", "ci.example.com:8443", "*.example.org", "[::1]:9000", "[fd00::2]"]
    (tmp_path / "agent.toml").write_text(f"notify_allowed_hosts = {json.dumps(entries)}\n")
    rule = HostRule(load(tmp_path).notify_allowed_hosts)
    for url in (
        "https://hooks.slack.com/services/x",
        "https://ci.example.com:8443/x",
        "https://a.example.org/x",
        "http://[::1]:9000/x",
        "http://[fd00::2]/x",
    ):
        assert rule.refusal(url, resolve=False) is None, url
