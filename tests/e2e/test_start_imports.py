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
    "gpuhop.client.ssh",
    "gpuhop.client.tls",
    "numpy",
    "click",
)

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


def test_ps_show_logs_and_cancel_load_only_what_they_use(shared_agent, project, tmp_path):
    root = project({"hello.py": "print('hello')\n", "wait.py": "import time\ntime.sleep(600)\n"})
    with shared_agent.client() as client:
        done = client.submit(["hello.py"], workdir=root)
        done.wait(timeout=60)
        waiting = client.submit(["wait.py"], workdir=root)
        try:
            for args in (
                ("ps",),
                ("show", done.id),
                ("logs", done.id),
                ("cancel", waiting.id),
            ):
                loaded = modules_of(shared_agent, tmp_path, *args)
                assert "gpuhop.cli.main" in loaded  # the command ran in that interpreter
                heavy = [
                    m
                    for m in loaded
                    if m in NOT_ON_THESE_PATHS or m.split(".")[0] in NOT_ON_THESE_PATHS
                ]
                assert not heavy, f"gpuhop {args[0]} imported {heavy}"
        finally:
            if not waiting.refresh().state.finished:  # the test failed before its cancel
                waiting.cancel()


def test_run_loads_neither_httpx_nor_pydantic_typer_or_rich(shared_agent, project, tmp_path):
    root = project({"hello.py": "print('hello')\n"})
    loaded = modules_of(shared_agent, tmp_path, "run", "hello.py", cwd=root)
    assert "gpuhop.cli.main" in loaded
    assert not [m for m in loaded if m.split(".")[0] in ANYWHERE]


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
