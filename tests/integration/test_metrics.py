"""GET /metrics on a real agent (two fake GPUs) over its Unix socket and its TLS listener,
parsed with prometheus_client's own parser: job counts follow jobs as they queue, run and
end; the fake GPUs appear; finished jobs' run times land in the histogram."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuhop import __version__
from gpuhop.api import JobState
from tests.conftest import Agent, wait_until
from tests.integration.test_tls import UNAUTHORIZED, raw_http

GiB = 2**30
# Waits for a file named "go" in its artifacts dir, then exits 0. (Not its work dir: that
# is an overlay in the job's own mount namespace, which a file made beside it on the host
# may never reach.)
WAITER = (
    "import os, time\n"
    "go = os.path.join(os.environ['GPUHOP_ARTIFACTS_DIR'], 'go')\n"
    "while not os.path.exists(go):\n    time.sleep(0.02)\n"
)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    root = Path(tmp_path_factory.mktemp("metrics-agent"))
    agent = Agent(root / "home", root / "cache", 2, args=("--listen", "127.0.0.1:0"))
    try:
        yield agent.start()
    finally:
        agent.shutdown()


def scrape(agent: Agent) -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """Every sample: {family: {(sample name, sorted labels): value}}."""
    transport = httpx.HTTPTransport(uds=str(agent.paths.socket))
    with httpx.Client(transport=transport, base_url="http://agent") as http:
        response = http.get("/metrics")
    assert response.status_code == 200, response.text
    return parse(response.text)


def parse(text: str) -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    return {
        family.name: {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
        for family in text_string_to_metric_families(text)
    }


def value(metrics: dict, family: str, sample: str | None = None, **labels: str) -> float:
    return metrics[family][(sample or family, tuple(sorted(labels.items())))]


def go(agent: Agent, job_id: str) -> None:
    (agent.paths.jobs / job_id / "artifacts" / "go").touch()


def test_jobs_queue_gpus_and_run_times_follow_the_jobs(agent, project):
    before = scrape(agent)
    assert {s: value(before, "gpuhop_jobs", state=s.value) for s in JobState} == dict.fromkeys(
        JobState, 0
    )
    assert value(before, "gpuhop_queue_length") == 0
    assert value(before, "gpuhop_jobs_submitted", "gpuhop_jobs_submitted_total") == 0
    assert value(before, "gpuhop_agent_info", version=__version__) == 1
    for gpu in ("0", "1"):
        key = {"gpu": gpu, "name": "Fake GPU"}
        assert value(before, "gpuhop_gpu_memory_total_bytes", **key) == 8 * GiB
        assert value(before, "gpuhop_gpu_memory_used_bytes", **key) == 0
        assert value(before, "gpuhop_gpu_utilization_percent", **key) == 0
        assert value(before, "gpuhop_gpu_reserved_memory_bytes", **key) == 0
    assert "process_resident_memory_bytes" in before  # the agent's own process

    root = project({"wait.py": WAITER})
    with agent.client() as client:
        big = client.submit(["wait.py"], workdir=root, gpus=2)
        wait_until(lambda: big.refresh().state == JobState.running)
        waiting = client.submit(["wait.py"], workdir=root, gpus=1)
        dropped = client.submit(["wait.py"], workdir=root, gpus=1)
        dropped.cancel()
        busy = scrape(agent)
        assert value(busy, "gpuhop_jobs", state="running") == 1
        assert value(busy, "gpuhop_jobs", state="queued") == 1
        assert value(busy, "gpuhop_jobs", state="cancelled") == 1
        assert value(busy, "gpuhop_queue_length") == 1
        assert value(busy, "gpuhop_queue_oldest_wait_seconds") > 0
        assert value(busy, "gpuhop_jobs_submitted", "gpuhop_jobs_submitted_total") == 3
        for gpu in ("0", "1"):
            key = {"gpu": gpu, "name": "Fake GPU"}
            assert value(busy, "gpuhop_gpu_reserved_memory_bytes", **key) == 8 * GiB
            assert value(busy, "gpuhop_gpu_jobs", **key) == 1

        go(agent, big.id)
        wait_until(lambda: waiting.refresh().state == JobState.running)
        go(agent, waiting.id)
        assert waiting.wait(timeout=60).state == JobState.succeeded
        assert big.wait(timeout=60).state == JobState.succeeded

    after = scrape(agent)
    assert value(after, "gpuhop_jobs", state="succeeded") == 2
    assert value(after, "gpuhop_jobs", state="running") == 0
    assert value(after, "gpuhop_queue_length") == 0
    assert value(after, "gpuhop_queue_oldest_wait_seconds") == 0
    hist = "gpuhop_job_duration_seconds"
    assert value(after, hist, f"{hist}_count", state="succeeded") == 2
    assert value(after, hist, f"{hist}_bucket", state="succeeded", le="+Inf") == 2
    assert value(after, hist, f"{hist}_sum", state="succeeded") > 0
    # The cancelled job never started: it has no run time to count.
    assert value(after, hist, f"{hist}_count", state="cancelled") == 0
    buckets = [
        v
        for (name, labels), v in after[hist].items()
        if name == f"{hist}_bucket" and ("state", "succeeded") in labels
    ]
    assert buckets == sorted(buckets)  # cumulative
    assert value(after, "gpuhop_gpu_reserved_memory_bytes", gpu="0", name="Fake GPU") == 0


def test_the_format_follows_the_accept_header(agent):
    transport = httpx.HTTPTransport(uds=str(agent.paths.socket))
    with httpx.Client(transport=transport, base_url="http://agent") as http:
        plain = http.get("/metrics")
        openmetrics = http.get(
            "/metrics", headers={"Accept": "application/openmetrics-text;version=1.0.0"}
        )
    assert plain.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert openmetrics.headers["content-type"].startswith(
        "application/openmetrics-text; version=1.0.0"
    )
    assert openmetrics.text.endswith("# EOF\n")


def test_over_tls_metrics_need_a_token_and_any_user_may_scrape(agent):
    with agent.client() as owner:
        token = owner.create_token("prometheus").token
    with raw_http(agent, None) as http:
        refused = http.get("/metrics")
    assert refused.status_code == 401
    assert refused.json() == UNAUTHORIZED
    with raw_http(agent, "gpuhop_not-a-token") as http:
        assert http.get("/metrics").status_code == 401
    with raw_http(agent, token) as http:
        answer = http.get("/metrics")
    assert answer.status_code == 200
    metrics = parse(answer.text)
    assert {"gpuhop_jobs", "gpuhop_queue_length", "gpuhop_gpu_memory_total_bytes"} <= set(metrics)
