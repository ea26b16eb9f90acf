"""What a person at a terminal sees: the live status line under `run` and `logs -f`,
transfer progress bars, `ps --watch` and `top`. The CLI runs in a real pseudo-terminal."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Agent, wait_until
from tests.terminal import Terminal

pytestmark = pytest.mark.timeout(180)

TRAIN = """\
import os, sys, time
from gpuhop.runtime import log_metrics

for epoch in range(1, 4):
    for i in range(3):
        print(f"line {epoch}.{i}", flush=True)
        time.sleep(0.25)
    log_metrics(step=epoch * 3, epoch=epoch, epochs=3, loss=1.0 / epoch, accuracy=0.5)
    time.sleep(0.8)
if sys.argv[1:] == ["gated"]:  # until the test has seen the last epoch's status line
    gate = os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "go")
    while not os.path.exists(gate):
        time.sleep(0.05)
print("all done", flush=True)
"""
LINES = [f"line {e}.{i}" for e in range(1, 4) for i in range(3)] + ["all done"]


def _each_once_in_order(text: str, lines: list[str]) -> None:
    positions = [text.find(line) for line in lines]
    assert all(p >= 0 for p in positions), text
    assert positions == sorted(positions), text
    for line in lines:
        assert text.count(line) == 1, f"{line!r} shown {text.count(line)} times:\n{text}"


def test_run_on_a_terminal_shows_a_status_line_under_the_log(make_agent, project):
    agent = make_agent()
    work = project({"train.py": TRAIN})
    term = Terminal(["run", "--name", "gated", "train.py", "gated"], agent.env, cwd=work)
    _let_go(agent, "gated", term, "epoch 3/3")
    assert term.finish() == 0
    text = term.text
    _each_once_in_order(text, LINES)
    # The status line: state, elapsed time, epoch of total, step and the latest metrics.
    assert "running" in text
    assert "epoch 2/3" in text or "epoch 3/3" in text, text
    assert "step " in text and "loss " in text and "accuracy 0.5" in text
    assert "succeeded: exited with code 0" in text


def test_logs_follow_shows_the_status_line_and_no_progress_turns_it_off(make_agent, project):
    agent = make_agent()
    work = project({"train.py": TRAIN})
    job_id = agent.cli("run", "--detach", "train.py", "gated", cwd=work).stdout.strip()
    term = Terminal(["logs", "-f", job_id], agent.env, cwd=work)
    _let_go(agent, job_id, term, "loss ")
    assert term.finish() == 0
    _each_once_in_order(term.text, LINES)
    assert "loss " in term.text

    quiet = Terminal(["logs", "-f", "--no-progress", job_id], agent.env, cwd=work)
    assert quiet.finish() == 0
    _each_once_in_order(quiet.text, LINES)
    assert "loss " not in quiet.text and "epoch 3/3" not in quiet.text


def _let_go(agent: Agent, job: str, term: Terminal, shown: str) -> None:
    """Once the terminal shows `shown` (or not: whatever happens, the job is let go), tell
    the gated job to finish."""
    try:
        term.wait_for_screen(shown, timeout=120)
    finally:
        _open_gate(agent, job, "go")


def _open_gate(agent: Agent, job: str, gate: str) -> None:
    """Make the file `gate` in the artifacts dir of `job` (id or name), which it waits for."""
    job_id = json.loads(agent.cli("show", "--json", job).stdout)["id"]
    (agent.home / "jobs" / job_id / "artifacts" / gate).touch()


def test_output_to_a_pipe_is_the_jobs_own_bytes(make_agent, project):
    agent = make_agent()
    work = project({"train.py": TRAIN})
    run = agent.cli("run", "train.py", cwd=work)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "".join(f"{line}\n" for line in LINES)
    assert "\x1b" not in run.stdout + run.stderr


def test_uploads_and_pulls_show_progress_bars(make_agent, project):
    agent = make_agent()
    work = project(
        {
            "train.py": "import os\nfrom gpuhop.runtime import artifacts_dir\n"
            "(artifacts_dir() / 'weights.bin').write_bytes(os.urandom(3 << 20))\n"
        }
    )
    (work / "data.bin").write_bytes(os.urandom(3 << 20))
    out = work.parent / "pulled"
    term = Terminal(["run", "--pull", str(out), "train.py"], agent.env, cwd=work)
    assert term.finish() == 0
    assert "uploading" in term.text and "MiB" in term.text, term.text
    assert "pulling job" in term.text, term.text
    assert (out / "weights.bin").stat().st_size == 3 << 20
    # An unchanged tree uploads nothing, so no bar is drawn.
    again = Terminal(["run", "train.py"], agent.env, cwd=work)
    assert again.finish() == 0
    assert "uploading" not in again.text


def test_top_shows_each_gpu_and_the_job_holding_it(make_agent, project):
    agent = make_agent(fake_gpus=2)
    work = project({"hold.py": "import time\ntime.sleep(120)\n"})
    job_id = agent.cli("run", "--detach", "--gpus", "1", "--name", "holder", "hold.py", cwd=work)
    job_id = job_id.stdout.strip()
    wait_until(lambda: json.loads(agent.cli("show", "--json", job_id).stdout)["state"] == "running")
    term = Terminal(["top", "--every", "0.5"], agent.env, cwd=work)
    try:
        text = term.wait_for("holder")
        assert "UTIL" in text and "MEMORY" in text  # the GPU panel
        term.wait_for(job_id)
    finally:
        term.interrupt()
    assert term.finish() == 0
    gpu_rows = [line for line in term.text.splitlines() if line.lstrip().startswith(("0 ", "1 "))]
    assert any(job_id in row for row in gpu_rows), term.text
    agent.cli("cancel", job_id)


def test_ps_watch_redraws_until_interrupted_and_refuses_json(make_agent, project):
    agent = make_agent()
    work = project({"train.py": "print('hi')\n"})
    assert agent.cli("run", "--name", "first", "train.py", cwd=work).returncode == 0
    term = Terminal(["ps", "--watch", "--every", "0.3"], agent.env, cwd=work)
    try:
        term.wait_for("first")
        assert agent.cli("run", "--name", "second", "train.py", cwd=work).returncode == 0
        term.wait_for("second")  # drawn by a later refresh
    finally:
        term.interrupt()
    assert term.finish() == 0

    both = agent.cli("ps", "--watch", "--json")
    assert both.returncode == 2
    assert "cannot be combined with --json" in both.stderr


PROGRAM = "import time\nprint('two lines')\ntime.sleep(0.01)"


def test_ps_and_top_fit_the_screen_with_ids_and_states_whole(make_agent, project):
    agent = make_agent(fake_gpus=2)
    work = project({"hold.py": "import time\ntime.sleep(120)\n"})
    with agent.client() as client:
        holder = client.submit(["hold.py"], workdir=work, gpus=1, name="holder")
        done = [client.submit(["python3", "-c", PROGRAM], name=f"done{n}") for n in range(40)]
        for job in done:
            job.wait(timeout=60)
        wait_until(lambda: holder.refresh().state == "running")
    for size in ((80, 24), (120, 40)):
        _ps_and_top_fit(agent, work, size, holder.id, [job.id for job in done])
    agent.cli("cancel", holder.id)


def _ps_and_top_fit(agent, work, size, holder: str, done: list[str]) -> None:
    columns, _ = size
    ps = Terminal(["ps", "--limit", "12"], agent.env, cwd=work, size=size)
    assert ps.finish() == 0
    screen = ps.screen()
    header = next(line for line in screen if line.startswith("ID "))
    assert header.split()[:3] == ["ID", "NAME", "STATE"], header
    assert {"GPUS", "AGE", "METRICS"} <= set(header.split()), header
    row = next(line for line in screen if line.startswith(done[-1]))
    assert f"{done[-1]}  done39" in row and "succeeded" in row, screen
    # The multi-line program is one row, its quoting kept, its line breaks shown as ⏎.
    if columns >= 120:
        assert "python3 -c 'import time⏎print" in row, row
    assert not any(line.startswith(("print(", "time.sleep")) for line in screen), screen

    top = Terminal(["top", "--every", "0.3", "--limit", "50"], agent.env, cwd=work, size=size)
    try:
        top.wait_for_screen(holder, "UTIL", "more not shown")
        # A second draw over the first: the header is still the top line.
        drawn = len(top.raw)
        wait_until(lambda: len(top.raw) > drawn)
        shown = top.wait_for_screen(holder, "UTIL", "more not shown")
    finally:
        top.interrupt()
        assert top.finish() == 0
    assert shown[0].startswith("gpuhop "), "\n".join(shown)
    gpu_rows = [line for line in shown if line.startswith(("0 ", "1 "))]
    job_rows = [line for line in shown if line.startswith(holder)]
    # The GPU panel and the job table name the job by the same id; the table says its state.
    assert any(holder in row for row in gpu_rows), shown
    assert len(job_rows) == 1 and "running" in job_rows[0], shown
    # Active jobs first: the running holder is the table's first row, above the finished.
    table = [line for line in shown if line.startswith(("ID ", holder, *done))]
    assert table[0].startswith("ID ") and table[1].startswith(holder), shown


KERAS_FIT = """\
import os, time
import numpy as np, keras

x = np.random.rand(80, 4).astype("float32")
y = (x.sum(1) > 2).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
model.compile("adam", "binary_crossentropy")
epoch = [0]


def pace(batch, logs):
    # Mid-epoch, each epoch waits until the test has seen it on the status line (the file
    # go-EPOCH): a status line polled each second sees a short epoch only by luck.
    time.sleep(0.05)
    if batch == 7:
        gate = os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], f"go-{epoch[0]}")
        while not os.path.exists(gate):
            time.sleep(0.05)


count = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: epoch.__setitem__(0, e + 1))
slow = keras.callbacks.LambdaCallback(on_train_batch_end=pace)
model.fit(x, y, epochs=2, batch_size=4, validation_split=0.25, callbacks=[count, slow])
"""


@pytest.mark.tf
def test_an_unmodified_keras_fit_shows_the_running_epoch_its_step_and_eta(shared_agent, project):
    work = project({"fit.py": KERAS_FIT})
    name = f"fit-{os.getpid()}-{work.name}"
    term = Terminal(["run", "--name", name, "fit.py"], shared_agent.env, cwd=work, size=(80, 24))
    opened = False
    try:
        for epoch, shows in ((1, ("epoch 1/2 · ",)), (2, ("epoch 2/2 · ", "ETA"))):
            term.wait_for_screen(*shows, timeout=120)
            _open_gate(shared_agent, name, f"go-{epoch}")
            opened = True
    finally:
        if opened:  # a failed wait leaves no job waiting for its gate
            for epoch in (1, 2):
                _open_gate(shared_agent, name, f"go-{epoch}")
        code = term.finish()
    assert code == 0, term.text
    text = term.text
    assert "starting up" in text, text  # the seconds TensorFlow takes to import
    # The epoch running (2/2 while the second runs, not the first that ended), the step in
    # it, the time left at the pace of the first; loss first, at 80 columns.
    assert re.search(r"epoch 1/2 · \d+/15", text), text
    assert re.search(r"epoch 2/2 · \d+/15 · ETA \d:\d\d · loss \d\S* · val_loss \d", text), text


@pytest.fixture(scope="module")
def one_gpu_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """An agent with one (fake) GPU, for this module's tests that queue jobs behind it."""
    root = Path(tmp_path_factory.mktemp("one-gpu-agent"))
    agent = Agent(root / "home", root / "cache", 1).start()
    yield agent
    agent.shutdown()


def test_a_queued_job_says_why_it_waits_in_run_show_and_ps(one_gpu_agent, project):
    agent = one_gpu_agent
    work = project({"hold.py": "import time\ntime.sleep(120)\n", "train.py": "print('trained')\n"})
    run = ("run", "--detach", "--gpus", "1", "--name")
    hog = agent.cli(*run, "hog", "hold.py", cwd=work).stdout.strip()
    wait_until(lambda: json.loads(agent.cli("show", "--json", hog).stdout)["state"] == "running")
    ahead = agent.cli(*run, "ahead", "train.py", cwd=work).stdout.strip()
    term = Terminal(
        ["run", "--gpus", "1", "--name", "behind", "train.py"], agent.env, cwd=work, size=(80, 24)
    )
    try:
        # The status line, at 80 columns: its place in line, what it needs, who holds it.
        term.wait_for_screen("queued 0:", "· 2nd in line; waits for 1 GPU; held by hog")
        shown = agent.cli("show", "behind", cwd=work)
        assert "waiting  2nd in line; waits for 1 GPU; held by hog" in shown.stdout, shown.stdout
        ps = Terminal(["ps"], agent.env, cwd=work, size=(80, 24))
        assert ps.finish() == 0
        screen = ps.screen()
        header = next(line for line in screen if line.startswith("ID "))
        assert header.split()[:3] == ["ID", "NAME", "STATE"] and "WAITING" in header, screen
        rows = {
            line.split()[1]: line for line in screen if line.split()[1:2] in (["ahead"], ["behind"])
        }
        assert "queued" in rows["ahead"] and "1st in line" in rows["ahead"], screen
        assert "queued" in rows["behind"] and "2nd in line" in rows["behind"], screen
    finally:
        agent.cli("cancel", hog)
    # The holder gone, both start in their turn; `run` follows its job to the end.
    assert term.finish() == 0, term.text
    assert "trained" in term.text
    assert json.loads(agent.cli("show", "--json", ahead).stdout)["state"] == "succeeded"


FIT = """\
import sys
from gpuhop.runtime import log_metrics

lr, batch = float(sys.argv[1]), int(sys.argv[2])
log_metrics(step=10, epoch=1, loss=lr * 2, val_loss=lr + batch / 1000, accuracy=0.9,
            val_accuracy=0.85, learning_rate_in_use=lr, examples_per_second=1234.5)
"""


def test_a_sweep_fits_the_screen_labelled_by_the_values_that_differ(one_gpu_agent, project):
    agent = one_gpu_agent
    work = project({"fit.py": FIT})
    lrs = ["0.1", "0.05", "0.01", "0.005", "0.001", "0.0005", "0.0001"]
    args = ["sweep", "-m", "val_loss", "-p", f"lr={','.join(lrs)}", "-p", "batch=32,64,128"]
    term = Terminal([*args, "fit.py", "{lr}", "{batch}"], agent.env, cwd=work, size=(80, 24))
    assert term.finish() == 0, term.text
    screen = term.screen()
    # 21 runs on 24 lines: the header still at the top of the table, the rest counted.
    header = next((line for line in screen if line.startswith("RUN ")), None)
    assert header is not None, "\n".join(screen)
    assert header.split()[:4] == ["RUN", "JOB", "STATE", "VAL_LOSS"], header
    assert any("more not shown (gpuhop sweep show lists them)" in line for line in screen)
    assert any("21 succeeded" in line for line in screen), "\n".join(screen)
    # Each run by the values that differ (both do), its chosen metric in its own column.
    row = next(line for line in screen if line.startswith("lr=0.1 batch=32 "))
    assert re.search(r"succeeded\s+0\.132\b", row), row
    sweep_id = re.search(r"sweep (sweep-[0-9a-f]{6})", term.text).group(1)
    # To a pipe, `sweep show` is whole: no line cut or wrapped at 80 columns.
    shown = agent.cli("sweep", "show", sweep_id, "-m", "val_loss")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert len(lines) == 22 and max(map(len, lines)) > 80, shown.stdout
    assert lines[1].startswith("lr=0.0001 batch=32 ") and "examples_per_second" in lines[0].lower()
    assert "…" not in shown.stdout


LAST = """\
import sys
from gpuhop.runtime import log_metrics

log_metrics(step=1, loss=0.5)
log_metrics(step=2, loss=float(sys.argv[1]))  # the last, and the job ends at once
"""


def test_a_job_that_ends_right_after_its_last_metric_shows_it_every_time(one_gpu_agent, project):
    agent = one_gpu_agent
    work = project({"last.py": LAST})
    for n in range(3):
        # On a terminal: the status line's poller runs beside the follow until the end.
        term = Terminal(["run", "last.py", f"0.{n}25"], agent.env, cwd=work, size=(80, 24))
        assert term.finish() == 0, term.text
        assert f"last metrics: step=2 loss=0.{n}25" in term.text, term.text
        job_id = re.search(r"job ([0-9a-f]{8}) succeeded", term.text).group(1)
        shown = json.loads(agent.cli("show", "--json", job_id).stdout)["latest_metrics"]
        assert (shown["step"], shown["loss"]) == (2, float(f"0.{n}25")), shown
