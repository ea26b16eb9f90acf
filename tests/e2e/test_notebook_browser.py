"""`gpuhop notebook` in a real browser (Debian's chromium, driven by Playwright): the URL it
prints opens JupyterLab through the forward, logged in by its token, with the job's synced
work dir in the file browser. Without the token, the server lets nobody in. A screenshot is
kept in test-output/."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, Agent, missing
from tests.e2e.test_notebook_cli import Cli

CHROMIUM = os.environ.get("GPUHOP_TEST_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = REPO / "test-output"

if importlib.util.find_spec("playwright") is None:
    missing("needs playwright (pip: playwright)")
if not os.access(CHROMIUM, os.X_OK):
    missing(f"needs Debian's chromium at {CHROMIUM} (scripts/setup-system installs it)")
from playwright import sync_api  # noqa: E402

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield chromium
        finally:
            chromium.close()


def test_jupyterlab_opens_through_the_forward_with_the_work_dir(
    make_agent, browser, tmp_path: Path, record_property
):
    agent: Agent = make_agent(fake_gpus=1)
    (tmp_path / "results-notes.txt").write_text("synced from the laptop\n")
    cli = Cli(agent, tmp_path, "notebook", "--gpus", "1", "--no-browser")
    try:
        url = cli.url()
        base = url.split("/lab?")[0]
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        expect = sync_api.expect
        page.goto(url)
        listing = page.locator(".jp-DirListing-item", has_text="results-notes.txt")
        expect(listing).to_be_visible(timeout=60_000)
        shot = tmp_path / "notebook-lab.png"
        page.screenshot(path=str(shot))
        SCREENSHOTS.mkdir(exist_ok=True)
        record_property("screenshot", str(shutil.copyfile(shot, SCREENSHOTS / "notebook-lab.png")))
        context.close()

        # A browser without the token gets Jupyter's login page and no files.
        stranger = browser.new_context()
        other = stranger.new_page()
        other.goto(f"{base}/lab")
        expect(other.locator("body")).to_contain_text("token", ignore_case=True)
        expect(other.locator(".jp-DirListing-item")).to_have_count(0)
        response = other.goto(f"{base}/api/contents")
        assert response is not None and response.status == 403
        stranger.close()
        assert cli.stop() == 0
    finally:
        cli.finish()
        with agent.client() as client:
            nb = client.notebook()
            if nb is not None:
                nb.job.cancel(grace=5)
                nb.job.wait(timeout=60)
