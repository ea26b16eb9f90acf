"""GET /metrics on a real agent (two fake GPUs) over its Unix socket and its TLS listener,
parsed with prometheus_client's own parser: job counts follow jobs as they queue, run and
end; the fake GPUs appear; finished jobs' run times land in the histogram.

Then each job's GPU energy and GPU time, with energy counters the tests move through the
fake-GPU seam: two jobs sharing a GPU split its energy by their load, as `show`, `show
--json`, `ps --json` and `/metrics` tell it; a GPU without NVML's readings and a job without
a GPU say "not measured", never 0. (The meter's arithmetic: tests/unit/test_energy.py; an
agent restart that goes on counting: test_agent_restart.py.)"""

from __future__ import annotations

import json
import os
import re
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


def set_seam(agent: Agent, readings: dict) -> None:
    """The fake GPUs' readings, replaced whole at once (the agent reads the file any time)."""
    tmp = agent.paths.fake_gpus_seam.with_name("fake-gpus.json.tmp")
    tmp.write_text(json.dumps(readings))
    os.replace(tmp, agent.paths.fake_gpus_seam)


def show_json(agent: Agent, job: str) -> dict:
    shown = agent.cli("show", "--json", job)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def test_two_jobs_on_one_gpu_split_its_energy_by_their_load(agent, project):
    set_seam(agent, {"0": {"energy_mj": 5_000_000}})
    root = project({"wait.py": WAITER})
    a, b = (
        agent.cli("run", "--detach", "--gpu-memory", "2GiB", "wait.py", cwd=root).stdout.strip()
        for _ in range(2)
    )

    def init(job: str) -> int | None:  # the job's first process, PID 1 of its namespace
        pids = agent.paths.job_dir(job) / "shim.pid"
        return json.loads(pids.read_text()).get("init") if pids.exists() else None

    with agent.client() as client:
        for job in (a, b):
            wait_until(lambda job=job: client.job(job).state.value == "running", timeout=60)
            wait_until(lambda job=job: init(job), timeout=30)
        assert client.job(a).info.gpu_ids == client.job(b).info.gpu_ids == [0]
        # The GPU used 100 J, three quarters of its load a's processes', as NVML tells it.
        load = {str(init(a)): 60, str(init(b)): 20}
        set_seam(agent, {"0": {"energy_mj": 5_100_000, "process_utilization": load}})
        # Once a sample read it, a's end settles nothing more of it (its processes gone).
        wait_until(lambda: client.job(a).refresh_json()["energy"]["joules"] == 75.0, timeout=30)
        for job in (a, b):
            go(agent, job)
            client.job(job).wait(30)

    ea, eb = show_json(agent, a)["energy"], show_json(agent, b)["energy"]
    assert (ea["measured"], ea["joules"], eb["joules"]) == (True, 75.0, 25.0)
    assert ea["wh"] == round(75 / 3600, 6)
    for used in (ea, eb):
        assert used["split_by"]["utilisation"] > 0 and used["gpu_seconds"] > 0
        assert set(used["measured_by"]) == {"energy counter"}
        assert [attempt["joules"] for attempt in used["attempts"]] == [used["joules"]]
    listed = {j["id"]: j for j in json.loads(agent.cli("ps", "--json").stdout)}
    assert listed[a]["energy"] == ea and listed[b]["energy"] == eb
    line = next(x for x in agent.cli("show", a).stdout.splitlines() if "energy" in x)
    # Split by load since a sample saw the test's figures; equally before, if a sample came
    # between the jobs' start and those figures (the longer of the two leads).
    assert re.fullmatch(
        r"\s*energy  75\.0 J \(0\.02 Wh\); GPU time [\d.]+ GPU-s; NVML's energy counter,"
        r" split (by utilisation|equally)( \((by utilisation|equally) for [\d.]+ GPU-s\))?",
        line,
    ), line

    metrics = scrape(agent)
    joules = "gpuhop_job_gpu_energy_joules"
    assert value(metrics, joules, f"{joules}_total", job=a) == 75.0
    assert value(metrics, joules, f"{joules}_total", job=b) == 25.0
    seconds = "gpuhop_job_gpu_seconds"
    assert value(metrics, seconds, f"{seconds}_total", job=a) == ea["gpu_seconds"]
    # Job ids are another user's business: a user's scrape names only their own jobs, an
    # admin's (a Prometheus server's usual token) every job.
    with agent.client() as owner:
        user, admin = (owner.create_token(n, admin=n == "ops").token for n in ("eve", "ops"))
    for token, seen in ((user, set()), (admin, {a, b})):
        with raw_http(agent, token) as http:
            answer = http.get("/metrics")
        assert answer.status_code == 200, answer.text
        listed = parse(answer.text)
        assert {dict(labels)["job"] for _, labels in listed[joules]} >= seen
        assert {a, b} & {dict(labels)["job"] for _, labels in listed[joules]} == seen


def test_without_nvml_or_without_a_gpu_energy_is_not_measured_never_zero(agent, project):
    set_seam(agent, {})  # GPUs that give no energy reading: a host without NVML
    root = project({"quick.py": "print('done')"})
    with agent.client() as client:
        gpu = client.submit(["quick.py"], workdir=root, gpus=1).wait(60)
        cpu = client.submit(["quick.py"], workdir=root).wait(60)
    assert gpu.exit_code == cpu.exit_code == 0

    used = show_json(agent, gpu.id)["energy"]
    assert (used["measured"], used["joules"], used["wh"]) == (False, None, None)
    assert used["why"] == (
        f"GPU {gpu.gpu_ids[0]} reports neither an energy counter nor its power draw through NVML"
    )
    assert show_json(agent, cpu.id)["energy"] == {
        **dict.fromkeys(("attempt", "joules", "wh", "gpu_seconds")),
        "measured": False,
        "measured_by": {},
        "split_by": {},
        "unmeasured_gpu_seconds": 0.0,
        "why": "it used no GPU",
        "attempts": [],
    }
    assert "energy  not measured (it used no GPU)" in agent.cli("show", cpu.id).stdout
    assert "energy  not measured (GPU " in agent.cli("show", gpu.id).stdout
    metrics = scrape(agent)
    measured = metrics["gpuhop_job_gpu_energy_joules"]
    assert not [key for key in measured if ("job", gpu.id) in key[1] or ("job", cpu.id) in key[1]]


@pytest.mark.gpu
def test_on_a_real_gpu_a_jobs_energy_comes_from_nvml(make_agent, project, record_property):
    agent = make_agent()  # the host's own GPUs, found through NVML
    root = project({"idle.py": "import time\ntime.sleep(3)\n"})
    with agent.client() as client:
        job = client.submit(["idle.py"], workdir=root, gpus=1).wait(120)
    assert job.exit_code == 0 and job.started_at and job.ended_at

    used = show_json(agent, job.id)["energy"]
    record_property("gpu energy", json.dumps(used))  # the figures seen, for the record
    assert used["measured"] and used["joules"] > 0, used
    assert set(used["measured_by"]) <= {"energy counter", "power samples"}
    assert set(used["split_by"]) == {"whole GPU"}
    ran = (job.ended_at - job.started_at).total_seconds()
    assert 0 < used["gpu_seconds"] <= ran + 1
    # Even idle, a data-centre GPU draws tens of watts, and none more than 1.5 kW.
    assert 5 < used["joules"] / used["gpu_seconds"] < 1500, used
