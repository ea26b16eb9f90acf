"""`ps` (GET /v1/jobs) keeps each job's answer until it changes (gpuhop.agent.services.listing):
its answer is, byte for byte, the jobs' own answers (GET /v1/jobs/ID), and it shows every
change: a job's state, priority and dependencies, its log and metrics as it writes them."""

from __future__ import annotations

import json

import httpx

from gpuhop.api import JobState
from tests.conftest import wait_until

HOLD = """
import os, time
from gpuhop.runtime import log_metrics
art = os.environ["GPUHOP_ARTIFACTS_DIR"]
print("started", flush=True)
step = said = 0
while not os.path.exists(os.path.join(art, "go")):
    if not said and os.path.exists(os.path.join(art, "say")):
        print("said", flush=True)
        said = 1
    if os.path.exists(os.path.join(art, f"more{step}")):
        print(f"more {step}", flush=True)
        log_metrics(step=step, loss=1.0 / (step + 1))
        step += 1
    time.sleep(0.02)
"""
QUICK = """
from gpuhop.runtime import log_metrics
log_metrics(step=0, accuracy=0.5)
print("quick")
"""


def listing(raw: httpx.Client) -> bytes:
    r = raw.get("/v1/jobs", params={"limit": 50})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    return r.content


def one_by_one(raw: httpx.Client, ids: list[str]) -> bytes:
    """The listing as the jobs' own answers make it."""
    return b"[" + b",".join(raw.get(f"/v1/jobs/{i}").content for i in ids) + b"]"


def listed(raw: httpx.Client) -> dict[str, dict]:
    return {j["id"]: j for j in raw.get("/v1/jobs", params={"limit": 50}).json()}


# `ps`'s columns, and another set with the log's size (the one value a running job's log
# changes).
FIELD_SETS = [
    "id,name,state,priority,gpus,gpu_ids,memory_peak_mb,gpu_memory_mb,created_at,started_at,"
    "ended_at,latest_metrics,command",
    "log_size,id,waiting_for",
]


def same_in_fields(raw: httpx.Client) -> None:
    """Each field set's listing is the whole listing's jobs with those fields only, less
    the null ones, the same values, in JobInfo's order."""
    whole = raw.get("/v1/jobs", params={"limit": 50}).json()
    for fields in FIELD_SETS:
        r = raw.get("/v1/jobs", params={"limit": 50, "fields": fields})
        assert r.status_code == 200, r.text
        names = fields.split(",")
        chosen = [{k: v for k, v in job.items() if k in names and v is not None} for job in whole]
        assert r.json() == chosen
        assert [list(job) for job in r.json()] == [list(job) for job in chosen]


def metrics_step(raw: httpx.Client, job_id: str) -> int | None:
    return (listed(raw)[job_id]["latest_metrics"] or {}).get("step")


def test_ps_answers_each_job_as_show_does_and_shows_every_change(make_agent, project):
    agent = make_agent(fake_gpus=1)
    root = project({"hold.py": HOLD, "quick.py": QUICK})
    transport = httpx.HTTPTransport(uds=str(agent.paths.socket))
    with agent.client() as client, httpx.Client(transport=transport, base_url="http://x") as raw:
        done = client.submit(["quick.py"], workdir=root)
        assert done.wait(60).state == JobState.succeeded
        holder = client.submit(["hold.py"], workdir=root, gpus=1)
        art = agent.home / "jobs" / holder.id / "artifacts"
        log = agent.home / "jobs" / holder.id / "output.log"
        wait_until(lambda: log.exists() and b"started" in log.read_bytes(), 60)
        queued = client.submit(["quick.py"], workdir=root, gpus=1)
        waiter = client.submit(["quick.py"], workdir=root, after=queued.id)

        # Byte for byte the jobs' own answers, kept or not.
        first = listing(raw)
        ids = [j["id"] for j in httpx.Response(200, content=first).json()]
        assert ids == [waiter.id, queued.id, holder.id, done.id]
        assert first == one_by_one(raw, ids)
        assert listing(raw) == first
        same_in_fields(raw)
        jobs = listed(raw)
        assert jobs[done.id]["latest_metrics"]["accuracy"] == 0.5
        assert jobs[waiter.id]["waiting_for"] == [queued.id]

        # A running job's log and metrics, as it writes them.
        for step in range(2):
            (art / f"more{step}").touch()
            wait_until(lambda s=step: metrics_step(raw, holder.id) == s)
            wait_until(lambda: listed(raw)[holder.id]["log_size"] == log.stat().st_size)
            same_in_fields(raw)
        assert listed(raw)[holder.id]["state"] == "running"
        # Its log alone grows: still the job's own answer, byte for byte.
        (art / "say").touch()
        wait_until(lambda: b"said" in log.read_bytes())
        wait_until(lambda: listed(raw)[holder.id]["log_size"] == log.stat().st_size)
        assert listing(raw) == one_by_one(raw, ids)
        same_in_fields(raw)

        # A queued job's priority, then its end; and what its dependant waits for.
        queued.requeue(-5)
        assert listed(raw)[queued.id]["priority"] == -5
        queued.cancel(grace=0)
        jobs = listed(raw)
        assert jobs[queued.id]["state"] == "cancelled"
        assert jobs[waiter.id]["state"] != "queued" or jobs[waiter.id]["waiting_for"] == []

        (art / "go").touch()
        assert holder.wait(60).state == JobState.succeeded
        wait_until(lambda: listed(raw)[holder.id]["state"] == "succeeded")
        wait_until(lambda: not client.jobs(["queued", "starting", "running"]), 60)
        final = listing(raw)
        assert final == one_by_one(raw, ids)
        same_in_fields(raw)


def test_ps_shows_the_schedulers_word_on_a_queued_job_without_a_row_written(make_agent, project):
    """Why a queued job waits is the scheduler's, not the job store's: a GPU quarantined for
    a fault (its own store) changes it with no job's row written, and `ps` shows it."""
    agent = make_agent(fake_gpus=2)
    root = project({"hold.py": HOLD})
    transport = httpx.HTTPTransport(uds=str(agent.paths.socket))
    with agent.client() as client, httpx.Client(transport=transport, base_url="http://x") as raw:
        holder = client.submit(["hold.py"], workdir=root, gpus=1)
        try:
            wait_until(lambda: listed(raw)[holder.id]["state"] == "running", 60)
            both = client.submit(["hold.py"], workdir=root, gpus=2)  # waits for GPU 1 too
            busy = f"1st in line; waits for 2 GPUs; held by {holder.id}"
            assert wait_until(lambda: listed(raw)[both.id]["waiting"]) == busy
            assert listed(raw)[both.id]["waiting"] == busy  # the kept answer
            free = 1 - listed(raw)[holder.id]["gpu_ids"][0]
            seam = agent.paths.fake_gpus_seam  # the fake GPUs' readings (test_gpu_health)
            seam.with_suffix(".tmp").write_text(json.dumps({str(free): {"xid": 79}}))
            seam.with_suffix(".tmp").replace(seam)
            why = wait_until(lambda: listed(raw)[both.id]["waiting"] != busy, 30)
            assert f"GPU(s) {free} quarantined" in listed(raw)[both.id]["waiting"], why
            assert listed(raw)[both.id]["state"] == "queued"
        finally:
            for job in client.jobs(["queued", "starting", "running"]):
                client.job(job.id).cancel(grace=0)
