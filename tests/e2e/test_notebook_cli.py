"""`gpuhop notebook` and `gpuhop run NOTEBOOK.ipynb` as a user runs them, against a real
agent with a fake GPU: a real JupyterLab server job reached through the forward, a kernel
driven over Jupyter's own REST and WebSocket API, idle culling, and notebooks run as jobs
with nbclient."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import nbformat
import pytest
from websockets.sync.client import connect

from tests.conftest import Agent, wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    root = Path(tmp_path_factory.mktemp("notebook-agent"))
    agent = Agent(root / "home", root / "cache", 1)
    try:
        yield agent.start()
    finally:
        agent.shutdown()


class Cli:
    """`gpuhop ARGS...` in the background; its stdout and stderr collected line by line."""

    def __init__(self, agent: Agent, cwd: Path, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuhop", *args],
            cwd=cwd,
            env=agent.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out)),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err)),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def url(self) -> str:
        """The URL (with the token) it prints once the server answers here."""

        def printed() -> str | None:
            if self.proc.poll() is not None and not self.out:
                pytest.fail(f"gpuhop notebook exited {self.proc.returncode}: {''.join(self.err)}")
            return self.out[0].strip() if self.out else None

        return wait_until(printed, timeout=120)

    def stop(self) -> int:
        """Ctrl-C, as a user presses it; its exit code."""
        self.proc.send_signal(signal.SIGINT)
        return self.finish()

    def finish(self, timeout: float = 30) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for reader in self._readers:
                reader.join()
            for stream in (self.proc.stdout, self.proc.stderr):
                assert stream is not None
                stream.close()
        return code


class Jupyter:
    """A Jupyter client over the server's REST and kernel WebSocket API."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.token = parse_qs(parts.query)["token"][0]
        self.http = httpx.Client(base_url=self.base, params={"token": self.token}, timeout=60)

    def close(self) -> None:
        self.http.close()

    def start_kernel(self) -> str:
        response = self.http.post("/api/kernels", json={"name": "python3"})
        response.raise_for_status()
        return str(response.json()["id"])

    def execute(self, kernel: str, code: str) -> str | None:
        """Run `code` in `kernel`; the text of its result (None if it has none)."""
        ws_url = self.base.replace("http", "ws", 1)
        session, msg_id = uuid.uuid4().hex, uuid.uuid4().hex
        request = {
            "header": {
                "msg_id": msg_id,
                "session": session,
                "username": "test",
                "msg_type": "execute_request",
                "version": "5.3",
            },
            "parent_header": {},
            "metadata": {},
            "content": {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
            "channel": "shell",
            "buffers": [],
        }
        result = None
        # The handshake waits for Jupyter to open the kernel's channels, seconds on a loaded
        # host: websockets' own 10 s failed a whole run beside other work.
        url = f"{ws_url}/api/kernels/{kernel}/channels?token={self.token}"
        with connect(url, open_timeout=60) as ws:
            ws.send(json.dumps(request))
            while True:
                msg = json.loads(ws.recv(timeout=60))
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "error":
                    pytest.fail(f"{code!r} raised {content['ename']}: {content['evalue']}")
                if kind == "execute_result":
                    result = content["data"]["text/plain"]
                if kind == "status" and content["execution_state"] == "idle":
                    return result


def test_kernel_state_outlives_the_cli_that_started_the_notebook(agent: Agent, tmp_path: Path):
    (tmp_path / "hello.txt").write_text("synced\n")
    first = Cli(agent, tmp_path, "notebook", "--gpus", "1", "--no-browser", "--name", "lab")
    job_id = None
    try:
        url = first.url()
        assert "/lab?token=" in url and url.startswith("http://127.0.0.1:")
        with agent.client() as client:
            nb = client.notebook("lab")
            assert nb is not None
            job_id = nb.job.id
            assert nb.job.info.gpu_ids == [0]  # holds its GPU like any job
        jupyter = Jupyter(url)
        try:
            # The server runs in the job's synced work dir.
            listing = jupyter.http.get("/api/contents").json()["content"]
            assert "hello.txt" in {item["name"] for item in listing}
            kernel = jupyter.start_kernel()
            assert jupyter.execute(kernel, "x = 41") is None
        finally:
            jupyter.close()
        assert first.stop() == 0, "".join(first.err)
        assert "keeps running" in "".join(first.err)

        # A new `gpuhop notebook` (no name) finds the running one; a new connection, the
        # same kernel, its state intact.
        second = Cli(agent, tmp_path, "notebook", "--url")
        try:
            again = second.url()
            assert "re-attaching to notebook job" in "".join(second.err)
            assert "apply to a new notebook" not in "".join(second.err)
            jupyter = Jupyter(again)
            try:
                assert jupyter.token in url
                assert jupyter.execute(kernel, "x + 1") == "42"
            finally:
                jupyter.close()
        finally:
            assert second.stop() == 0, "".join(second.err)
        # Options only a new notebook takes are named as not applied, --idle and -C too.
        for option in (["--idle", "30m"], ["-C", str(tmp_path.parent)]):
            third = Cli(agent, tmp_path, "notebook", "--url", *option)
            try:
                third.url()
            finally:
                assert third.stop() == 0, "".join(third.err)
            said = "".join(third.err)
            assert "--idle, -C and queue options apply to a new notebook" in said, option
        with agent.client() as client:
            log = b"".join(client.job(job_id).logs()).decode()
        assert jupyter.token not in log  # never in the job's log
        assert "JupyterLab on 127.0.0.1:" in log
    finally:
        first.finish()
        if job_id is not None:
            with agent.client() as client:
                job = client.job(job_id)
                if not job.state.finished:
                    job.cancel(grace=5)
                    job.wait(timeout=60)


GATED_CELL = """\
import os, pathlib, time
out = pathlib.Path(os.environ['GPUHOP_ARTIFACTS_DIR'])
(out / 'by-kernel.txt').write_text('kept')
while not (out / 'go').exists():
    time.sleep(0.05)
(out / 'go').unlink()
"""


def test_an_idle_notebook_ends_and_frees_its_gpu(agent: Agent, tmp_path: Path):
    cli = Cli(agent, tmp_path, "notebook", "--gpus", "1", "--no-browser", "--idle", "5s", "--new")
    job_id = None
    try:
        jupyter = Jupyter(cli.url())
        try:
            kernel = jupyter.start_kernel()  # while it lives, the server does not stop
            # At once, a cell that keeps the kernel busy (never culled) until the test has
            # looked: a kernel left idle while the test's requests took 5 s on a busy machine
            # would be culled before its cell ran.
            cell = threading.Thread(target=jupyter.execute, args=(kernel, GATED_CELL))
            cell.start()
            try:
                with agent.client() as client:
                    nb = client.notebook()
                    assert nb is not None
                    job_id = nb.job.id
                    artifacts = agent.home / "jobs" / job_id / "artifacts"
                    wait_until(lambda: (artifacts / "by-kernel.txt").exists(), timeout=90)
                    assert client.gpus()[0].job_ids == [job_id]  # held while the server runs
                    waiting = client.submit(
                        ["python3", "-c", "print('got it')"], workdir=tmp_path, gpus=1
                    )
                    assert waiting.state.value == "queued"
            finally:
                if job_id is not None:
                    (agent.home / "jobs" / job_id / "artifacts" / "go").touch()
                cell.join(timeout=90)
        finally:
            jupyter.close()
        with agent.client() as client:
            # The kernel is culled once idle, then the server stops: the job ends, and the
            # job that waited for its GPU gets it.
            nb, waiting = client.notebook(job_id), client.job(waiting.id)
            assert nb is not None
            info = nb.job.wait(timeout=120)
            assert info.state.value == "succeeded", info.reason
            assert waiting.wait(timeout=60).state.value == "succeeded"
            log = b"".join(nb.job.logs()).decode()
            pulled = nb.job.pull(tmp_path / "out")  # what the kernel wrote is kept
            assert [f.read_text() for f in pulled] == ["kept"]
        assert "Culling kernel" in log or "culling" in log.lower()
        assert "shutting down" in log
        # The forward noticed the end and the CLI returned by itself.
        assert cli.finish() == 0, "".join(cli.err)
        assert f"notebook job {job_id} succeeded" in "".join(cli.err)
    finally:
        cli.finish()
        if job_id is not None:
            with agent.client() as client:
                job = client.job(job_id)
                if not job.state.finished:
                    job.cancel(grace=5)
                    job.wait(timeout=60)


def _notebook(path: Path, *cells: str, parameters: str | None = None) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell("# a notebook"))
    if parameters is not None:
        nb.cells.append(nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    nb.cells.extend(nbformat.v4.new_code_cell(c) for c in cells)
    nbformat.write(nb, path)


def test_run_a_parameterised_notebook_and_pull_the_executed_one(agent: Agent, tmp_path: Path):
    _notebook(
        tmp_path / "train.ipynb",
        "print(f'training with lr={lr} for {epochs} epochs')",
        "lr * 100",
        parameters="lr = 0.1\nepochs = 3",
    )
    # As the README writes it: gpuhop's options after the notebook's parameters.
    done = agent.cli(
        "run", "train.ipynb", "-p", "lr=0.01", "-p", "epochs=2", "--pull", "out",
        "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "training with lr=0.01 for 2 epochs" in done.stdout  # live in the job's log
    executed = nbformat.read(tmp_path / "out" / "train.ipynb", as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert code[1].metadata["tags"] == ["injected-parameters"]
    assert code[1].source.splitlines()[1:] == ["lr = 0.01", "epochs = 2"]
    assert code[2].outputs[0]["text"] == "training with lr=0.01 for 2 epochs\n"
    assert code[3].outputs[0]["data"]["text/plain"] == "1.0"


def test_a_failing_cell_fails_the_job_naming_the_cell(agent: Agent, tmp_path: Path):
    _notebook(tmp_path / "bad.ipynb", "print('before')", "1 / 0", "print('never')")
    done = agent.cli("run", "--no-progress", "--pull", "out", "bad.ipynb", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    said = done.stdout + done.stderr
    assert "cell 3 raised ZeroDivisionError: division by zero" in said
    assert "before" in said and "never" not in said
    executed = nbformat.read(tmp_path / "out" / "bad.ipynb", as_version=4)
    assert executed.cells[2].outputs[0]["ename"] == "ZeroDivisionError"  # kept to look at


# A tutorial-shaped notebook written for tf-keras: its export cell fails under Keras 3, deep
# inside Keras, called through a helper of the notebook's own.
KERAS2_EXPORT = (
    "import tensorflow as tf\n"
    "model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(units)])",
    "def export(model, path):\n    tf.keras.models.save_model(model, path, save_format='tf')",
    "print('exporting', flush=True)\nexport(model, 'exported')",
    "print('never')",
)


@pytest.mark.tf
def test_a_failing_cell_in_a_log_file_is_short_plain_text(agent: Agent, tmp_path: Path):
    _notebook(tmp_path / "export.ipynb", *KERAS2_EXPORT, parameters="units = 1")
    log_file = tmp_path / "run.log"
    with open(log_file, "w") as out:  # the CLI's output piped to a file, as in a batch script
        done = subprocess.run(
            [sys.executable, "-m", "gpuhop", "run", "--no-progress", "--name", "nb-fails",
             "export.ipynb", "-p", "units=2"],
            cwd=tmp_path, env=agent.env, stdout=out, stderr=subprocess.STDOUT, timeout=170,
        )  # fmt: skip
    assert done.returncode == 1, log_file.read_text()
    with agent.client() as client:
        log = b"".join(client.job("nb-fails").logs()).decode()
    assert "\x1b" not in log and "\x1b" not in log_file.read_text()  # no terminal escapes
    gpuhop = [line for line in log.splitlines() if line.startswith("gpuhop: ")]
    assert gpuhop[:5] == [
        "gpuhop: cell 2 of 6 (parameters)",
        "gpuhop: the -p parameters (units), after cell 2",
        "gpuhop: cell 3 of 6",
        "gpuhop: cell 4 of 6",
        "gpuhop: cell 5 of 6",
    ]
    failed = log[log.index("gpuhop: cell 5 raised ValueError: The `save_format` argument") :]
    lines = failed.splitlines()
    assert lines[1:6] == [
        "Traceback (your code; most recent call last):",
        "  cell 5, line 2",
        "    export(model, 'exported')",
        "  cell 4, line 2, in export",
        "    tf.keras.models.save_model(model, path, save_format='tf')",
    ]
    # Keras's own frames are one line, saying where the error was raised; then the error.
    assert re.fullmatch(
        r"  \.\.\. \d+ frames? in keras, raised in keras/src/\S+:\d+, in \S+", lines[6]
    )
    assert lines[7].startswith("ValueError: The `save_format` argument is deprecated in Keras 3")
    # tf-keras is installed in the job's Python: the fix is said, in the log and the end line.
    assert "gpuhop: this looks like tf-keras-era code under Keras 3" in failed
    assert "rerun with -e TF_USE_LEGACY_KERAS=1" in log_file.read_text().splitlines()[-1]
    assert len(failed.splitlines()) < 15 and "never" not in log
    # The executed notebook keeps the kernel's whole traceback, to look at.
    assert "with the kernel's whole traceback" in log


def test_bad_notebook_runs_are_refused_before_anything_is_queued(agent: Agent, tmp_path: Path):
    _notebook(tmp_path / "nb.ipynb", "1")
    missing = agent.cli("run", "nope.ipynb", cwd=tmp_path)
    assert missing.returncode == 2 and "no such notebook: nope.ipynb" in missing.stderr
    stray = agent.cli("run", "nb.ipynb", "--lr", "0.1", cwd=tmp_path)
    assert stray.returncode == 2
    assert re.search(r"own options and parameters: -p NAME=VALUE .*'--lr 0\.1'", stray.stderr)
    bad_idle = agent.cli("notebook", "--idle", "soon", cwd=tmp_path)
    assert bad_idle.returncode == 2 and "--idle takes a duration" in bad_idle.stderr


def test_the_kernel_runs_in_the_jobs_own_python(agent: Agent, tmp_path: Path):
    """With a requirements.txt the job has a venv of its own: the notebook's kernel runs
    there (and still sees the host's packages), not in the agent's Python."""
    _notebook(tmp_path / "which.ipynb", "import sys, nbclient\nprint('prefix', sys.prefix)")
    (tmp_path / "requirements.txt").write_text("# the host's packages are all it needs\n")
    done = agent.cli(
        "run", "--no-progress", "-e", "PIP_NO_INDEX=1", "which.ipynb", cwd=tmp_path, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    prefix = re.search(r"^prefix (.+)$", done.stdout, re.M)
    assert prefix is not None, done.stdout
    assert Path(prefix.group(1)).parent == agent.home / "envs"
