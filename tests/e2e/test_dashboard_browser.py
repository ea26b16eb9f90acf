"""The web dashboard in a real browser (Debian's chromium, driven by Playwright), as a user
sees it: a real agent with a fake GPU, `gpuhop ui --no-browser` as a real process, and its
login link opened in chromium. A job that logs metrics is watched until its loss chart gains
points, shown on the GPU page as the holder of the GPU, and cancelled from its page. Without
the login, nothing is shown. A GPU quarantined for a fault says why on the GPU page. A
screenshot of the job page is kept in test-output/.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, Agent, missing, wait_until

CHROMIUM = os.environ.get("GPUHOP_TEST_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = REPO / "test-output"
TRAIN = """
import math, os, time
from gpuhop.runtime import artifacts_dir, log_metrics

(artifacts_dir() / "config.json").write_text('{"lr": 0.01}')
os.makedirs("logs/fit/20250101-120000/train")  # where the TensorBoard tutorial logs
open("logs/fit/20250101-120000/train/events.out.tfevents.1.host.1.v2", "wb").close()
log_metrics(memory_mb=300.0, memory_peak_mb=2048.0)  # as the hook's framework readings
for step in range(1, 2000):
    loss = 2.0 * math.exp(-step / 20)
    log_metrics(step=step, epoch=step // 10 + 1, loss=loss, accuracy=1 - loss / 2.2)
    print(f"step {step} loss {loss:.4f} <b>not markup</b>", flush=True)
    time.sleep(0.3)
"""

if importlib.util.find_spec("playwright") is None:
    missing("needs playwright (pip: playwright)")
if not os.access(CHROMIUM, os.X_OK):
    missing(f"needs Debian's chromium at {CHROMIUM} (scripts/setup-system installs it)")
from playwright import sync_api  # noqa: E402


@pytest.fixture
def dashboard(make_agent) -> Iterator[tuple[Agent, subprocess.Popen[str], str]]:
    """A fake-GPU agent and `gpuhop ui` serving it: (agent, the ui process, its login link)."""
    agent = make_agent(fake_gpus=1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuhop", "ui", "--no-browser", "--port", "0"],
        env=agent.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        link = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/ui/login\?code=[\w-]{43,}", link), link
        yield agent, proc, link
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield chromium
        finally:
            chromium.close()


def test_watch_a_job_train_and_cancel_it_from_the_browser(
    dashboard, browser, project, tmp_path, record_property
):
    agent, proc, link = dashboard
    origin = link.split("/ui/")[0]
    with agent.client() as client:
        job = client.submit(
            ["train.py", "--lr", "0.01"],
            workdir=project({"train.py": TRAIN}),
            gpus=1,
            name="sweep",
            env={"LR_SCHEDULE": "cosine", "WANDB_API_KEY": "not-for-screenshots"},
        )
        done = client.submit(["python3", "-c", "print('hi')"], name="quick")
        done.wait(timeout=60)

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    expect = sync_api.expect

    # The login link leads to the jobs list, which shows both jobs.
    page.goto(link)
    assert page.url == f"{origin}/ui/"
    expect(page.locator(f'tr[data-job="{job.id}"]')).to_contain_text("sweep")
    expect(page.locator(f'tr[data-job="{done.id}"] [data-state]')).to_have_text("succeeded")
    page.click('[data-filter="running"]')
    expect(page.locator(f'tr[data-job="{done.id}"]')).to_have_count(0)
    expect(page.locator(f'tr[data-job="{job.id}"] [data-state]')).to_have_text("running")

    # Its page: the loss chart gains points while it trains; the log is text, not markup.
    page.click(f'tr[data-job="{job.id}"] a')
    expect(page.locator("#command")).to_have_text("train.py --lr 0.01")
    expect(page.locator("#env")).to_contain_text("cosine")
    expect(page.locator("#env")).not_to_contain_text("not-for-screenshots")  # masked
    expect(page.locator(".facts")).to_contain_text("peak 2.0 GiB")
    artifact = page.locator("#artifacts a", has_text="config.json")
    expect(artifact).to_be_visible(timeout=15_000)
    with page.expect_download() as download:
        artifact.click()
    assert Path(download.value.path()).read_text() == '{"lr": 0.01}'
    # It wrote TensorBoard logs: the page says how to see them.
    expect(page.locator("#tensorboard")).to_have_text(f"gpuhop tensorboard {job.id}")
    expect(page.locator(".facts")).to_contain_text("shows logs/fit/20250101-120000/train")

    loss = page.locator('[data-metric="loss"]')
    expect(loss).to_have_attribute("data-points", re.compile(r"[1-9]\d*"))
    seen = int(loss.get_attribute("data-points") or 0)
    page.wait_for_function(
        "n => +document.querySelector('[data-metric=\"loss\"]').dataset.points > n", arg=seen
    )
    expect(page.locator('[data-metric="accuracy"] svg path.line')).to_have_count(1)
    expect(page.locator("#log")).to_contain_text("<b>not markup</b>")
    expect(page.locator("#log b")).to_have_count(0)
    # Where it is now: the Stacks button shows its Python stack (py-spy on the agent's host).
    page.click("#stacks-button")
    expect(page.locator("#stacks")).to_contain_text("<module> (train.py:")
    shot = tmp_path / "dashboard-job.png"
    page.screenshot(path=str(shot), full_page=True)
    SCREENSHOTS.mkdir(exist_ok=True)
    kept = shutil.copyfile(shot, SCREENSHOTS / "dashboard-job.png")
    record_property("screenshot", str(kept))

    # The GPU page: the fake GPU, held by the job.
    page.click("nav >> text=GPUs")
    gpu = page.locator('[data-gpu="0"]')
    expect(gpu).to_contain_text("Fake GPU")
    expect(gpu.locator(f'a[data-job="{job.id}"]')).to_be_visible()

    # Cancel from the job's page, after a confirm; the state changes there.
    gpu.locator(f'a[data-job="{job.id}"]').click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel")
    expect(page.locator(".job-head [data-state]")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#cancel")).to_be_hidden()
    assert not errors, errors
    context.close()

    # No login, no dashboard: a fresh browser gets the login page, the API nothing.
    stranger = browser.new_context()
    other = stranger.new_page()
    for path in ("/ui/", f"/ui/jobs/{job.id}", "/ui/api/jobs", "/ui/gpus"):
        response = other.goto(origin + path)
        assert response is not None and response.status == 401, path
        assert job.id not in other.content()
        expect(other.locator("body")).to_contain_text("Run gpuhop ui")
    # The link that logged the first browser in does not work twice.
    response = other.goto(link)
    assert response is not None and response.status == 401
    expect(other.locator("body")).to_contain_text("used already or has expired")
    stranger.close()
    # Nor does the proxy, which reaches the owner's socket, stand in for the login.
    refused = httpx.get(f"{origin}/ui/api/jobs")
    assert refused.status_code == 401 and job.id not in refused.text

    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 0
    assert proc.stderr is not None and "stopped the dashboard" in proc.stderr.read()


CURVE = """
import sys
from gpuhop.runtime import log_metrics

lr = float(sys.argv[1])
for step in range(1, 6):
    log_metrics(step=step, val_loss=lr / step)
"""


# A real Keras `fit`'s default output (tests/unit/test_termtext.py says what it holds).
KERAS_LOG = REPO / "tests" / "unit" / "data" / "keras_fit.log"
REPLAY = "import sys\nsys.stdout.buffer.write(open('keras_fit.log', 'rb').read())\n"


def test_a_sweeps_page_draws_every_runs_curve_on_one_chart(dashboard, browser, project):
    agent, _, link = dashboard
    work = project({"curve.py": CURVE, "replay.py": REPLAY})
    shutil.copyfile(KERAS_LOG, work / "keras_fit.log")
    with agent.client() as client:
        sweep = client.sweep("curve.py {lr}", {"lr": ["1", "2", "3"]}, name="lrs", workdir=work)
        keras = client.submit(["replay.py"], workdir=work, name="keras")
        for run in [*sweep.runs, keras]:
            run.wait(timeout=60)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(link)
    page.goto(link.split("/ui/")[0] + f"/ui/sweeps/{sweep.id}")
    expect = sync_api.expect
    expect(page.locator("#runs tbody tr")).to_have_count(3)
    expect(page.locator("#runs")).to_contain_text("lrs[lr=2]")
    chart = page.locator('[data-metric="val_loss"]')
    expect(chart.locator("svg path.line")).to_have_count(3)
    expect(chart).to_have_attribute("data-points", "15")
    expect(chart.locator(".legend")).to_contain_text("lrs[lr=3]")

    # A Keras progress bar's log reads as a terminal shows it, as `gpuhop logs` writes it.
    from gpuhop.cli.termtext import render

    page.goto(link.split("/ui/")[0] + f"/ui/jobs/{keras.id}")
    expect(page.locator("#log")).to_contain_text("Epoch 2/2")
    assert page.locator("#log").text_content() == render(KERAS_LOG.read_bytes())
    assert not errors, errors
    context.close()


def test_the_gpu_page_says_why_a_gpu_is_quarantined(dashboard, browser):
    agent, _, link = dashboard
    agent.paths.fake_gpus_seam.write_text('{"0": {"xid": 79}}')
    with agent.client() as client:
        wait_until(lambda: client.gpus()[0].quarantined)
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(link)
    page.click("nav >> text=GPUs")
    note = page.locator('[data-gpu="0"] [data-quarantined="0"]')
    sync_api.expect(note).to_contain_text("Quarantined: XID 79 (GPU fell off the bus)")
    sync_api.expect(note).to_contain_text("gpuhop gpus --release 0")
    assert not errors, errors
    context.close()
