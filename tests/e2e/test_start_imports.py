"""What the everyday commands import: `ps`, `show`, `logs`, `cancel` and `run` against a real
agent load only what they use (issue 17: a command starts in a tenth of a second). Each runs
as a user runs it, in its own interpreter, which writes the names of its modules at exit.
Their output goes to a pipe, as in a script: nothing is drawn, so rich stays out too."""

from __future__ import annotations

import json
import subprocess
import sys

# Loaded by other commands only: the tree scanner's pattern library (a sync), the datasets
# module (`--data`, `data`, `env`), the SSH and TLS ways to a remote, numpy (the chunker),
# httpx (TLS remotes only: a Unix socket is spoken to with the standard library); and on any
# of them, pydantic (the SDK reads the agent's JSON; the agent validates what it is sent),
# typer (gpuhop.cli.params parses a plain command line) and rich (only to draw).
ANYWHERE = ("pydantic", "pydantic_core", "typer", "rich", "httpx", "httpcore", "h11")
NOT_ON_THESE_PATHS = (
    *ANYWHERE,
    "pathspec",
    "gpuhop.client.data",
    "gpuhop.api.data",
    "gpuhop.client.transport.ssh",
    "gpuhop.client.transport.tls",
    "numpy",
    "click",
)
# The standard library's heavier modules, which none of these commands loads on its way (a
# few ms each): http.client with email (the agent is spoken to on a plain socket), ssl
# (TLS remotes only), dataclasses with inspect (the records on the path are plain classes),
# concurrent.futures with logging (hashing many files only), subprocess and tempfile
# (starting an agent or an ssh only), and platformdirs (the XDG dirs are read on Linux).
STDLIB_NOT_ON_THESE_PATHS = (
    "http",
    "email",
    "ssl",
    "dataclasses",
    "inspect",
    "concurrent",
    "logging",
    "subprocess",
    "tempfile",
    *(("platformdirs",) if sys.platform.startswith("linux") else ()),
)


def loaded_of(loaded: list[str], names: tuple[str, ...]) -> list[str]:
    return [m for m in loaded if m in names or m.split(".")[0] in names]


RECORD_MODULES = """
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
from gpuhop.cli.main import main
sys.argv[0] = "gpuhop"
main()
"""


def modules_of(agent, tmp_path, *args: str, cwd=None) -> list[str]:
    record = tmp_path / f"modules-{args[0]}.json"
    proc = subprocess.run(
        [sys.executable, "-c", RECORD_MODULES, str(record), *args],
        env=agent.env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(record.read_text())


def test_ps_show_logs_and_cancel_load_only_what_they_use(make_agent, project, tmp_path):
    # An agent of its own: what `ps` lists is this test's jobs, not whatever other tests of
    # this process left on a shared one.
    agent = make_agent()
    root = project({"hello.py": "print('hello')\n", "wait.py": "import time\ntime.sleep(600)\n"})
    with agent.client() as client:
        done = client.submit(["hello.py"], workdir=root)
        done.wait(timeout=60)
        # A multi-line `-c` program with a non-ASCII word: `ps` writes it without rich too.
        client.submit(["python3", "-c", "import sys\nprint('naïve')"], workdir=root).wait(60)
        waiting = client.submit(["wait.py"], workdir=root)
        try:
            for args in (
                ("ps",),
                ("show", done.id),
                ("logs", done.id),
                ("logs", "--tail", "1", done.id),
                ("wait", done.id),
                ("cancel", waiting.id),
            ):
                loaded = modules_of(agent, tmp_path, *args)
                assert "gpuhop.cli.main" in loaded  # the command ran in that interpreter
                heavy = loaded_of(loaded, NOT_ON_THESE_PATHS + STDLIB_NOT_ON_THESE_PATHS)
                assert not heavy, f"gpuhop {args[0]} imported {heavy}"
        finally:
            if not waiting.refresh().state.finished:  # the test failed before its cancel
                waiting.cancel()


def test_run_loads_neither_httpx_nor_pydantic_typer_or_rich(shared_agent, project, tmp_path):
    """Nor pathspec: a work dir without ignore files is matched against the defaults
    without it (tests/unit/test_sync.py checks the re-run of an unchanged one)."""
    root = project({"hello.py": "print('hello')\n"})
    loaded = modules_of(shared_agent, tmp_path, "run", "hello.py", cwd=root)
    assert "gpuhop.cli.main" in loaded
    assert not loaded_of(loaded, (*ANYWHERE, *STDLIB_NOT_ON_THESE_PATHS, "pathspec"))


def test_a_mistake_is_still_typers_to_explain(shared_agent, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gpuhop", "ps", "--limit", "0"],
        env=shared_agent.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Invalid value for '--limit'" in proc.stderr
