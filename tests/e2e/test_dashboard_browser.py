"""The web dashboard in a real browser (Debian's chromium, driven by Playwright), as a user
sees it: a real agent with a fake GPU, `gpuhop ui --no-browser` as a real process, and its
login link opened in chromium; one agent, dashboard and browser for the module (each test
logs a fresh browser context in with a code of its own).

A job that logs metrics is watched until its loss chart (loss and val_loss on one chart,
smoothed, on a log scale, zoomed) gains points, with its GPU's load on its page; it is shown
on the GPU page as the holder of the GPU by its name, and cancelled from its page. Without
the login, nothing is shown. The job list shows commands, dates and ids, folds a sweep's runs
under the sweep, and fits a phone. A sweep's page compares its runs by epoch, marks the best,
sorts, and cancels the sweep. A SavedModel directory downloads as one zip, a file with a
line break in its name as any other. A long metric name wraps on a phone, and one named as
every JavaScript object's own (`constructor`, `__proto__`) is drawn as logged; a sweep ranked
by an error (`mape`) marks its lowest run best, by the agent's rule. A GPU quarantined for a
fault says why on the GPU page. A page that loses the agent (stopped; `gpuhop ui` gone quiet)
says so in a banner and greys what it shows, and carries on where it was once the agent
answers again; the job list says when it shows only the newest jobs.
Screenshots of the job, list and sweep pages at desktop (1280 px) and phone (390 px) widths,
and of the list that lost its agent, are kept in test-output/.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gpuhop.agent.callers import owner_login
from gpuhop.agent.jobs.store import JobStore
from gpuhop.api import JobState
from gpuhop.api.metrics import higher_is_better
from gpuhop.api.spec import JobSpec
from tests.conftest import REPO, Agent, missing, wait_until
from tests.unit.test_metric_direction import HIGHER, LOWER

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
    if step % 5 == 0:  # as Keras logs val_loss, at the end of an epoch
        log_metrics(step=step, epoch=step // 10 + 1, val_loss=loss * 1.3)
    # Where the fit is, as gpuhop's Keras callback says it (runtime/callbacks.py: Progress).
    log_metrics(step=step, epoch=step // 10 + 1, epochs=200, progress=1,
                epoch_step=step % 10 + 1, epoch_steps=10, eta=round((1999 - step) * 0.3, 1))
    print(f"step {step} loss {loss:.4f} <b>not markup</b>", flush=True)
    time.sleep(0.3)
"""

if importlib.util.find_spec("playwright") is None:
    missing("needs playwright (pip: playwright)")
if not os.access(CHROMIUM, os.X_OK):
    missing(f"needs Debian's chromium at {CHROMIUM} (scripts/setup-system installs it)")
from playwright import sync_api  # noqa: E402

# Playwright's assertions give up after 5 s by default: a page that polls every 2-5 s, in a
# Chromium sharing two busy cores, may take longer to show what is already true. A passing
# check costs no more for it.
sync_api.expect.set_options(timeout=30_000)


@pytest.fixture(scope="module")
def dashboard(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Agent, subprocess.Popen[str], str]]:
    """A fake-GPU agent and `gpuhop ui` serving it: (agent, the ui process, its login link)."""
    root = Path(tmp_path_factory.mktemp("dashboard-agent"))
    agent = Agent(root / "home", root / "cache", 1).start()
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
        agent.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield chromium
        finally:
            chromium.close()


DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def signed_in(browser, dashboard, viewport=DESKTOP):
    """A fresh browser context logged in with a code of its own: (context, page, errors)."""
    agent, _, link = dashboard
    with agent.client() as client:
        code = client.ui_login_code().code
    context = browser.new_context(viewport=viewport, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{link.split('/ui/')[0]}/ui/login?code={code}")
    return context, page, errors


def screenshot(page, name: str, record_property) -> None:
    """Keep a full-page screenshot as test-output/NAME.png (named in the pytest summary)."""
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    record_property("screenshot", str(path))


def fits(page, selector: str) -> bool:
    """Whether every element `selector` matches lies within the page's width (nothing cut
    off or pushed out sideways)."""
    return page.evaluate(
        """s => [...document.querySelectorAll(s)].every(e => {
            const r = e.getBoundingClientRect();
            return r.width > 0 && r.left >= 0 && r.right <= document.documentElement.clientWidth;
        })""",
        selector,
    )


def test_watch_a_job_train_and_cancel_it_from_the_browser(
    dashboard, browser, project, record_property
):
    agent, _, link = dashboard
    origin = link.split("/ui/")[0]
    # The GPU's load, and its energy counter (as NVML's, in mJ).
    agent.paths.fake_gpus_seam.write_text('{"0": {"utilization": 42, "energy_mj": 1000}}')
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
    # The login's answer moves the page on to the list; beside a busy CPU that can land
    # after goto returns (a fresh-clone run beside a hog still showed the login's URL).
    page.wait_for_url(f"{origin}/ui/")
    assert page.url == f"{origin}/ui/"
    expect(page.locator(f'tr[data-job="{job.id}"]')).to_contain_text("sweep")
    expect(page.locator(f'tr[data-job="{done.id}"] [data-state]')).to_have_text("succeeded")
    # Its command as a shell takes it back, when it was made (in full on hover), its id a link.
    row = page.locator(f'tr[data-job="{done.id}"]')
    expect(row.locator('[data-label="Command"]')).to_have_text(
        """python3 -c 'print('"'"'hi'"'"')'"""
    )
    expect(row.locator("time")).to_have_text(re.compile(r"^(just now|\d+ min ago)$"))
    assert re.search(r"\d{4}", row.locator("time").get_attribute("title") or "")
    expect(row.locator(f'a.jobid[href="/ui/jobs/{done.id}"]')).to_have_text(done.id)
    page.click('[data-filter="running"]')
    expect(page.locator(f'tr[data-job="{done.id}"]')).to_have_count(0)
    expect(page.locator(f'tr[data-job="{job.id}"] [data-state]')).to_have_text("running")

    # Its page: the loss chart gains points while it trains; the log is text, not markup.
    page.click(f'tr[data-job="{job.id}"] a.jobid')
    expect(page.locator("#command")).to_have_text("train.py --lr 0.01")
    # The load of its own GPU, as the agent reads it.
    expect(page.locator('#job-gpus [data-gpu="0"] [data-stat="utilisation"]')).to_contain_text(
        "42%"
    )
    expect(page.locator("#env")).to_contain_text("cosine")
    expect(page.locator("#env")).not_to_contain_text("not-for-screenshots")  # masked
    expect(page.locator(".facts")).to_contain_text("peak 2.0 GiB")
    # What its GPU used so far: measured from its start, however little.
    expect(page.locator(".facts")).to_contain_text(
        re.compile(
            r"GPU energy\s*[\d.]+ J \([\d.]+ Wh\); GPU time [\d.]+ GPU-s; NVML's energy counter"
        )
    )
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
    # Its val_loss is drawn with its loss, on one chart with a legend, as TensorBoard does.
    expect(loss.locator("svg path.line")).to_have_count(2)
    expect(loss.locator(".legend")).to_have_text(re.compile(r"loss\s*val_loss"))
    expect(page.locator('[data-metric="val_loss"]')).to_have_count(0)
    # Smoothing keeps the raw lines, faint, behind the smoothed ones.
    expect(loss.locator("svg path.raw")).to_have_count(0)
    page.locator("#smoothing").fill("0.8")
    expect(loss.locator("svg path.raw")).to_have_count(2)
    # A log scale: the y ticks go 1, 2, 5 (or 1, 1.5, 2, 3, 5, 7) times a power of ten.
    page.check("#log-scale")
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-metric="loss"] .axis text[text-anchor=end]')]
            .map(t => +t.textContent).every(v => [1, 1.5, 2, 3, 5, 7]
            .some(m => Math.abs(v / 10 ** Math.floor(Math.log10(v)) - m) < 1e-6))"""
    )
    # A drag across the chart zooms in; a double click zooms out.
    box = loss.locator("svg").bounding_box()
    assert box is not None
    middle = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.4, middle)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.8, middle, steps=4)
    page.mouse.up()
    expect(loss).to_have_attribute("data-zoomed", "true")
    page.mouse.dblclick(box["x"] + box["width"] * 0.6, middle)
    expect(loss).not_to_have_attribute("data-zoomed", "true")
    page.locator("#smoothing").fill("0.6")
    expect(page.locator("#log")).to_contain_text("<b>not markup</b>")
    expect(page.locator("#log b")).to_have_count(0)
    # The header says where the fit is, as `gpuhop run`'s status line does, over a thin bar.
    expect(page.locator("#job-progress-text")).to_have_text(
        re.compile(r"^epoch \d+/200 · \d+/10 · ETA \d{1,2}:\d\d$")
    )
    width = page.locator("#job-progress .bar").evaluate("e => e.getBoundingClientRect().width")
    assert 0 < width < page.locator("#job-progress .track").bounding_box()["width"] / 2
    # Where it is now: the Stacks button shows its Python stack (py-spy on the agent's host).
    page.click("#stacks-button")
    expect(page.locator("#stacks")).to_contain_text("<module> (train.py:")
    screenshot(page, "dashboard-job", record_property)
    page.set_viewport_size(PHONE)
    assert fits(page, "#job-gpus, #charts, #log, .job-head")
    screenshot(page, "dashboard-job-phone", record_property)
    page.set_viewport_size(DESKTOP)

    # The GPU page: the fake GPU, held by the job, named as the job list names it.
    page.click("nav >> text=GPUs")
    gpu = page.locator('[data-gpu="0"]')
    expect(gpu).to_contain_text("Fake GPU")
    expect(gpu.locator(f'a[data-job="{job.id}"]')).to_have_text("sweep")

    # Cancel from the job's page, after a confirm; the state changes there.
    gpu.locator(f'a[data-job="{job.id}"]').click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel")
    expect(page.locator(".job-head [data-state]")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#cancel")).to_be_hidden()
    expect(page.locator("#job-gpus")).to_be_hidden()  # it holds none now
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
    agent.paths.fake_gpus_seam.unlink()


CURVE = """
import sys
from gpuhop.runtime import log_metrics

lr = float(sys.argv[1])
for epoch in range(1, 6):
    loss = lr / epoch
    log_metrics(epoch=epoch, loss=loss, val_loss=loss + 0.5, accuracy=1 - loss / 10)
"""
WAIT = "import time\nprint('waiting', flush=True)\ntime.sleep(300)\n"
MODEL = """
import os
from gpuhop.runtime import artifacts_dir

model = artifacts_dir() / "export" / "model"  # as model.export(path) lays one out
(model / "variables").mkdir(parents=True)
(model / "assets").mkdir()
(model / "saved_model.pb").write_bytes(b"graph" * 1000)
(model / "variables" / "variables.index").write_bytes(b"index")
(model / "variables" / "variables.data-00000-of-00001").write_bytes(os.urandom(100_000))
(artifacts_dir() / "notes.txt").write_text("top level")
(artifacts_dir() / "two\\nlines.txt").write_text("a name with a line break")
"""


# A real Keras `fit`'s default output (tests/unit/test_termtext.py says what it holds).
KERAS_LOG = REPO / "tests" / "unit" / "data" / "keras_fit.log"
REPLAY = "import sys\nsys.stdout.buffer.write(open('keras_fit.log', 'rb').read())\n"


@pytest.fixture(scope="module")
def sweep_jobs(dashboard, tmp_path_factory):
    """A finished sweep of three runs that log loss, val_loss and accuracy per epoch, a job
    that wrote a SavedModel, and one that replayed a Keras progress bar; all ended."""
    agent, _, _ = dashboard
    work = Path(tmp_path_factory.mktemp("sweep-project"))
    for name, text in {"curve.py": CURVE, "replay.py": REPLAY, "model.py": MODEL}.items():
        (work / name).write_text(text)
    shutil.copyfile(KERAS_LOG, work / "keras_fit.log")
    with agent.client() as client:
        sweep = client.sweep("curve.py {lr}", {"lr": ["3", "1", "2"]}, name="lrs", workdir=work)
        keras = client.submit(["replay.py"], workdir=work, name="keras")
        model = client.submit(["model.py"], workdir=work, name="export")
        for run in [*sweep.runs, keras, model]:
            run.wait(timeout=60)
    return sweep, keras, model


def test_the_job_list_folds_a_sweep_and_fits_a_phone(
    dashboard, browser, sweep_jobs, record_property
):
    sweep, keras, model = sweep_jobs
    context, page, errors = signed_in(browser, dashboard)
    expect = sync_api.expect
    # The sweep is one line, its runs folded under it until opened.
    line = page.locator(f'tr[data-sweep="{sweep.id}"]')
    expect(line).to_contain_text("sweep lrs")
    expect(line).to_contain_text("3 runs")
    expect(line.locator('[data-state="succeeded"]')).to_have_count(1)
    expect(page.locator(f'tr[data-in-sweep="{sweep.id}"]')).to_have_count(0)
    line.locator("button.toggle").click()
    runs = page.locator(f'tr[data-in-sweep="{sweep.id}"]')
    expect(runs).to_have_count(3)
    expect(runs.first).to_contain_text("curve.py")
    expect(page.locator(f'tr[data-job="{keras.id}"]')).to_contain_text("replay.py")
    screenshot(page, "dashboard-list", record_property)

    # On a phone each job is a card: its id, state, command and age all in view.
    page.set_viewport_size(PHONE)
    card = page.locator(f'tr[data-job="{keras.id}"]')
    for label in ("Job", "State", "Command", "Created", "Duration"):
        expect(card.locator(f'[data-label="{label}"]')).to_be_visible()
    assert fits(page, "#jobs td, #jobs .badge")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    screenshot(page, "dashboard-list-phone", record_property)
    page.set_viewport_size(DESKTOP)

    # An ended job that logged nothing says so; one that wrote a SavedModel gives it as a zip.
    page.click(f'tr[data-job="{model.id}"] a.jobid')
    expect(page.locator("#chart-note")).to_have_text("This job logged no metrics.")
    folder = page.locator('#artifacts [data-dir="export/model"]')
    expect(folder).to_contain_text("SavedModel · 3 files")
    with page.expect_download() as download:
        folder.locator("a").click()
    assert download.value.suggested_filename == f"{model.id}-model.zip"
    with zipfile.ZipFile(download.value.path()) as zf:
        assert sorted(zf.namelist()) == [
            "saved_model.pb",
            "variables/variables.data-00000-of-00001",
            "variables/variables.index",
        ]
        assert zf.read("saved_model.pb") == b"graph" * 1000
        assert zf.testzip() is None
    # A file whose name has a line break downloads as any other (the proxy's route took
    # none: "Not Found").
    with page.expect_download() as download:
        page.locator("#artifacts a", has_text="lines.txt").click()
    assert Path(download.value.path()).read_text() == "a name with a line break"
    with page.expect_download() as download:
        page.click("#artifacts-zip")
    with zipfile.ZipFile(download.value.path()) as zf:
        assert "notes.txt" in zf.namelist() and "export/model/saved_model.pb" in zf.namelist()
    assert not errors, errors
    context.close()


def test_a_sweeps_page_compares_its_runs_and_cancels_the_sweep(
    dashboard, browser, project, sweep_jobs, record_property
):
    agent, _, _ = dashboard
    sweep, keras, _ = sweep_jobs
    origin = dashboard[2].split("/ui/")[0]
    context, page, errors = signed_in(browser, dashboard)
    page.goto(f"{origin}/ui/sweeps/{sweep.id}")
    expect = sync_api.expect
    expect(page.locator("#runs tbody tr")).to_have_count(3)
    expect(page.locator("#runs")).to_contain_text("lrs[lr=2]")
    # Every run's curve on each metric's chart, against the epoch, under one legend that
    # names each run by its values.
    expect(page.locator("#x-axis")).to_have_value("epoch")
    chart = page.locator('[data-metric="val_loss"]')
    expect(chart.locator("svg path.line")).to_have_count(3)
    expect(chart).to_have_attribute("data-points", "15")
    expect(page.locator("#legend span")).to_have_text(["lr=3", "lr=1 ★", "lr=2"])
    expect(page.locator(".legend:visible")).to_have_count(1)
    # The best run by val_loss (lr=1: the lowest) is marked, in the table and on the charts.
    best = page.locator(f'#runs tr[data-job="{sweep.runs[1].id}"]')
    expect(best.locator(".best-mark")).to_be_visible()
    expect(chart.locator("svg path.line.best")).to_have_count(1)
    # The table sorts by any column, either way.
    page.click('#runs button[data-column="best val_loss"]')
    expect(page.locator("#runs tbody tr [data-label=lr]")).to_have_text(["1", "2", "3"])
    page.click('#runs button[data-column="best val_loss"]')
    expect(page.locator("#runs tbody tr [data-label=lr]")).to_have_text(["3", "2", "1"])
    page.click('#runs button[data-column="lr"]')
    expect(page.locator("#runs tbody tr [data-label=lr]")).to_have_text(["1", "2", "3"])
    screenshot(page, "dashboard-sweep", record_property)
    page.set_viewport_size(PHONE)
    assert fits(page, "#runs td, #charts, #legend")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    screenshot(page, "dashboard-sweep-phone", record_property)
    page.set_viewport_size(DESKTOP)

    # A Keras progress bar's log reads as a terminal shows it, as `gpuhop logs` writes it.
    from gpuhop.cli.termtext import render

    page.goto(f"{origin}/ui/jobs/{keras.id}")
    expect(page.locator("#log")).to_contain_text("Epoch 2/2")
    assert page.locator("#log").text_content() == render(KERAS_LOG.read_bytes())

    # A sweep still running is cancelled whole from its page.
    with agent.client() as client:
        waiting = client.sweep("wait.py {i}", {"i": ["1", "2"]}, workdir=project({"wait.py": WAIT}))
        wait_until(lambda: all(r.refresh().state == JobState.running for r in waiting.runs))
    page.goto(f"{origin}/ui/sweeps/{waiting.id}")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-sweep")
    expect(page.locator("#runs [data-state]")).to_have_text(
        ["cancelled", "cancelled"], timeout=30_000
    )
    expect(page.locator("#cancel-sweep")).to_be_hidden()
    assert not errors, errors
    context.close()


def test_a_long_metric_name_wraps_on_a_phone(dashboard, browser, project):
    # A multi-output model's metric names run long, with no space to break at: its chart's
    # title pushed the job page out sideways (3,000 px wide for a phone's 390).
    agent, _, _ = dashboard
    name = "output_digits_sparse_categorical_crossentropy_with_label_smoothing"
    job_py = (
        "from gpuhop.runtime import log_metrics\n"
        "for epoch in (1, 2):\n"
        f"    log_metrics(epoch=epoch, {name}=1 / epoch, val_{name}=2 / epoch)\n"
    )
    with agent.client() as client:
        job = client.submit(["job.py"], workdir=project({"job.py": job_py}), name="long")
        assert job.wait(timeout=60).state.value == "succeeded"
    context, page, errors = signed_in(browser, dashboard, PHONE)
    try:
        page.click(f'tr[data-job="{job.id}"] a.jobid')
        chart = page.locator(f'[data-metric="{name}"]')
        sync_api.expect(chart).to_have_attribute("data-points", "4")
        sync_api.expect(chart.locator(".legend")).to_contain_text(f"val_{name}")
        assert fits(page, "#charts, .chart figcaption, .chart .legend")
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        assert errors == []
    finally:
        context.close()


# A sweep's run that logs its mean absolute percentage error each epoch, then, once, metrics
# named as what every JavaScript object has.
HOSTILE_NAMES = """
import sys
from gpuhop.runtime import log_metrics

k = float(sys.argv[1])
for epoch in (1, 2, 3):
    log_metrics(epoch=epoch, mape=10 * k / epoch)
log_metrics(epoch=3, constructor=k, toString=k, hasOwnProperty=k, **{"__proto__": k})
"""


@pytest.fixture(scope="module")
def names_sweep(dashboard, tmp_path_factory):
    """A finished sweep of two runs (k=1, k=2) that log mape, then the object's names."""
    agent, _, _ = dashboard
    work = Path(tmp_path_factory.mktemp("names-project"))
    (work / "names.py").write_text(HOSTILE_NAMES)
    with agent.client() as client:
        sweep = client.sweep("names.py {k}", {"k": ["1", "2"]}, name="names", workdir=work)
        for run in sweep.runs:
            assert run.wait(timeout=60).state == JobState.succeeded
    return sweep


def test_metrics_named_as_an_objects_own_are_drawn_as_logged(dashboard, browser, names_sweep):
    # A metric named "constructor" (or "toString", "__proto__") was found in every record, as
    # every object has one: its chart gained a point for each record, of no number.
    sweep = names_sweep
    origin = dashboard[2].split("/ui/")[0]
    context, page, errors = signed_in(browser, dashboard)
    try:
        expect = sync_api.expect
        page.goto(f"{origin}/ui/jobs/{sweep.runs[0].id}")
        expect(page.locator('[data-metric="mape"]')).to_have_attribute("data-points", "3")
        for name in ("constructor", "toString", "hasOwnProperty", "__proto__"):
            expect(page.locator(f'[data-metric="{name}"]')).to_have_attribute("data-points", "1")
        page.goto(f"{origin}/ui/sweeps/{sweep.id}")
        expect(page.locator("#runs tbody tr")).to_have_count(2)
        expect(page.locator('[data-metric="mape"]')).to_have_attribute("data-points", "6")
        for name in ("constructor", "toString", "hasOwnProperty", "__proto__"):
            expect(page.locator(f'[data-metric="{name}"]')).to_have_attribute("data-points", "2")
        page.select_option("#rank-by", "constructor")
        best = page.locator(f'#runs tr[data-job="{sweep.runs[0].id}"]')
        expect(best.locator(".best-mark")).to_be_visible()
        expect(best.locator('[data-label="best constructor"]')).to_have_text("1")
        assert errors == []
    finally:
        context.close()


def test_a_sweep_ranked_by_an_error_marks_its_lowest(dashboard, browser, names_sweep):
    # "mape" (Keras's mean absolute percentage error) was taken for mAP, a score: the page
    # marked the run with the largest error as the best.
    sweep = names_sweep
    origin = dashboard[2].split("/ui/")[0]
    context, page, errors = signed_in(browser, dashboard)
    try:
        expect = sync_api.expect
        page.goto(f"{origin}/ui/sweeps/{sweep.id}")
        page.select_option("#rank-by", "mape")
        expect(page.locator('#rank-by option[value="mape"]')).to_have_text("mape (lowest)")
        best = page.locator(f'#runs tr[data-job="{sweep.runs[0].id}"]')
        expect(best.locator(".best-mark")).to_be_visible()
        expect(best.locator('[data-label="best mape"]')).to_have_text("3.333")
        expect(page.locator("#legend span")).to_have_text(["k=1 ★", "k=2"])
        # The browser reads the agent's rule as Python does, name for name.
        names = [*LOWER, *HIGHER]
        higher = page.evaluate(
            """async (names) => {
                const { api } = await import("/ui/static/common.js");
                const rule = await api("/ui/api/metric-rule");
                const [lower, higher] = [new RegExp(rule.lower, "i"), new RegExp(rule.higher, "i")];
                return names.map((n) => !lower.test(n) && higher.test(n));
            }""",
            names,
        )
        assert dict(zip(names, higher, strict=True)) == {n: higher_is_better(n) for n in names}
        assert errors == []
    finally:
        context.close()


@contextmanager
def own_dashboard(agent: Agent, logs: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`gpuhop ui` for `agent` alone (a test that stops it or the agent leaves the module's
    as they were): (the process, its login link). What it logs goes to a file in `logs`."""
    with (logs / "ui.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuhop", "ui", "--no-browser", "--port", "0"],
            env=agent.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline().strip()
    finally:
        proc.send_signal(signal.SIGCONT)  # should a test have left it stopped
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def page_errors(errors: list[str]) -> list[str]:
    """The page's errors but the browser's own line for each request that failed (which a
    lost agent makes on purpose)."""
    return [e for e in errors if not e.startswith("Failed to load resource")]


LOST = re.compile(r"Lost contact with the agent since \d\d:\d\d:\d\d; retrying\.")
STALE = re.compile(r"(^|\s)stale(\s|$)")
TICK = """
import time
for i in range(1, 3000):
    print(f"tick {i}", flush=True)
    time.sleep(0.1)
"""


def test_a_page_that_gets_no_answer_says_so_and_carries_on_when_one_comes(
    make_agent, browser, project, tmp_path
):
    # The page went on showing a running job, and its last log lines, as if nothing were
    # wrong while its requests went unanswered (a dropped network, an SSH tunnel gone quiet).
    agent = make_agent()
    with agent.client() as client:
        job = client.submit(["tick.py"], workdir=project({"tick.py": TICK}), name="ticking")
    with own_dashboard(agent, tmp_path) as (proc, link):
        context, page, errors = signed_in(browser, (agent, proc, link))
        try:
            expect = sync_api.expect
            page.goto(f"{link.split('/ui/')[0]}/ui/jobs/{job.id}")
            expect(page.locator(".job-head [data-state]")).to_have_text("running")
            log = page.locator("#log")
            expect(log).to_contain_text("tick 3\n")
            banner = page.locator("#contact-lost")
            expect(banner).to_have_count(0)
            # `gpuhop ui` stops answering (SIGSTOP): the browser's requests wait, unanswered.
            proc.send_signal(signal.SIGSTOP)
            try:
                expect(banner).to_contain_text(LOST, timeout=120_000)
                expect(banner).to_contain_text("No answer within 20 s.")
                expect(page.locator("body")).to_have_class(STALE)
                expect(page.locator(".job-head [data-state]")).to_have_text("running")
                seen = [int(n) for n in re.findall(r"tick (\d+)", log.text_content() or "")]
            finally:
                proc.send_signal(signal.SIGCONT)
            # Its first answer takes the banner away, and the page carries on where it was:
            # the log from where it had read to, no line lost or twice.
            expect(banner).to_have_count(0, timeout=120_000)
            expect(page.locator("body")).not_to_have_class(STALE)
            page.wait_for_function(
                """n => +/tick (\\d+)$/.exec(document.querySelector('#log').textContent.trim())[1]
                    > n + 5""",
                arg=seen[-1],
            )
            ticks = [int(n) for n in re.findall(r"tick (\d+)", log.text_content() or "")]
            assert ticks[: len(seen)] == seen and ticks == list(range(ticks[0], ticks[-1] + 1))
            assert not page_errors(errors), errors
        finally:
            context.close()


def test_a_page_whose_agent_stops_says_so_and_asks_for_a_login_once_it_is_back(
    make_agent, browser, tmp_path, record_property
):
    agent = make_agent()
    with agent.client() as client:
        done = client.submit(["python3", "-c", "print('hi')"], name="quick")
        done.wait(timeout=60)
    with own_dashboard(agent, tmp_path) as (proc, link):
        context, page, errors = signed_in(browser, (agent, proc, link))
        try:
            expect = sync_api.expect
            row = page.locator(f'tr[data-job="{done.id}"]')
            expect(row).to_contain_text("quick")
            agent.shutdown()
            # `gpuhop ui` answers for the agent it cannot reach: the banner gives its words.
            banner = page.locator("#contact-lost")
            expect(banner).to_contain_text(LOST)
            expect(banner.locator("#contact-why")).to_contain_text("gpuhop ui:")
            expect(page.locator("body")).to_have_class(STALE)
            expect(row).to_contain_text("quick")  # still shown, greyed, as of then
            screenshot(page, "dashboard-contact-lost", record_property)
            # A restarted agent has logged every browser out (its sessions live in memory):
            # its first answer takes the banner away, and the page says how to log in again.
            agent.start()
            expect(page.locator("body")).to_contain_text("Run gpuhop ui")
            expect(banner).to_have_count(0)
            assert not page_errors(errors), errors
        finally:
            context.close()


def test_the_job_list_says_when_it_shows_only_the_newest_jobs(browser, tmp_path_factory):
    # It stopped at 200 jobs without a word: the 201st and older were simply not there.
    root = Path(tmp_path_factory.mktemp("long-history"))
    agent = Agent(root / "home", root / "cache", None)
    # A long history, written where the agent keeps it before it starts (running 205 jobs
    # would take minutes): each a job that ran and succeeded, a second apart.
    agent.home.mkdir(parents=True)
    store = JobStore(agent.paths.db)
    try:
        for i in range(205):
            made = store.create(
                ["true"], JobSpec(name=f"old-{i}"), owner=owner_login(), now=1e9 + i
            )
            assert store.transition(
                made.id, [JobState.queued], JobState.running, started_at=1e9 + i
            )
            assert store.transition(
                made.id, [JobState.running], JobState.succeeded, ended_at=1e9 + i + 1, exit_code=0
            )
    finally:
        store.close()
    agent.start()
    try:
        with own_dashboard(agent, root) as (proc, link):
            context, page, errors = signed_in(browser, (agent, proc, link))
            try:
                expect = sync_api.expect
                rows = page.locator("tr.job-row")
                expect(rows).to_have_count(200)
                expect(rows.first).to_contain_text("old-204")
                expect(page.locator(".toolbar")).to_contain_text("the newest 200 jobs")
                older = page.locator("#older")
                expect(older).to_contain_text("Showing the newest 200 jobs; there are older ones.")
                expect(older).to_contain_text("gpuhop ps --limit 2000")
                page.click("#show-more")
                expect(rows).to_have_count(205)
                expect(rows.last).to_contain_text("old-0")
                expect(older).to_be_hidden()
                expect(page.locator(".toolbar")).to_contain_text("205 jobs")
                # A state's list is its own newest 200 again.
                page.click('[data-filter="succeeded"]')
                expect(older).to_contain_text("Showing the newest 200 jobs")
                expect(rows).to_have_count(200)
                assert not errors, errors
            finally:
                context.close()
    finally:
        agent.shutdown()


# Last but one: the GPU stays quarantined for the rest of the module.
def test_a_diverged_loss_is_drawn_up_to_where_it_went_nan(dashboard, browser, project):
    # A loss gone to NaN came as null, and NaN or infinity as strings left the page's chart
    # and the job list without the metric: the list says "nan", the chart has a gap there.
    agent, _, _ = dashboard
    job_py = (
        "from gpuhop.runtime import log_metrics\n"
        "for epoch, loss in enumerate([1.0, 0.5, float('nan')], 1):\n"
        "    log_metrics(epoch=epoch, loss=loss, grad=float('inf'))\n"
    )
    with agent.client() as client:
        job = client.submit(["job.py"], workdir=project({"job.py": job_py}), name="diverged")
        assert job.wait(timeout=60).state.value == "succeeded"
    context, page, errors = signed_in(browser, dashboard)
    try:
        expect = sync_api.expect
        row = page.locator(f'tr[data-job="{job.id}"]')
        expect(row.locator('[data-label="Latest metrics"]')).to_contain_text("loss nan")
        expect(row.locator('[data-label="Latest metrics"]')).to_contain_text("grad inf")
        page.click(f'tr[data-job="{job.id}"] a.jobid')
        expect(page.locator('[data-metric="loss"]')).to_have_attribute("data-points", "3")
        expect(page.locator('[data-metric="loss"] svg path.line')).to_have_count(1)
        assert errors == []
    finally:
        context.close()


def test_the_gpu_page_says_why_a_gpu_is_quarantined(dashboard, browser):
    agent, _, _ = dashboard
    agent.paths.fake_gpus_seam.write_text('{"0": {"xid": 79}}')
    with agent.client() as client:
        wait_until(lambda: client.gpus()[0].quarantined)
    context, page, errors = signed_in(browser, dashboard)
    page.click("nav >> text=GPUs")
    note = page.locator('[data-gpu="0"] [data-quarantined="0"]')
    sync_api.expect(note).to_contain_text("Quarantined: XID 79 (GPU fell off the bus)")
    sync_api.expect(note).to_contain_text("gpuhop gpus --release 0")
    assert not errors, errors
    context.close()


def test_the_dashboard_stops_on_ctrl_c(dashboard):
    _, proc, _ = dashboard
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 0
    assert proc.stderr is not None and "stopped the dashboard" in proc.stderr.read()
