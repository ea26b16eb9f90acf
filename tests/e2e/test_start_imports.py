"""What the everyday commands import: `ps`, `show`, `logs` and `cancel` against a real agent
load only what they use (issue 17: a command starts in a tenth of a second). Each runs as a
user runs it, in its own interpreter, which writes the names of its modules at exit."""

from __future__ import annotations

import json
import subprocess
import sys

# Loaded by other commands only: the tree scanner's pattern library (a sync), the datasets
# module (`--data`, `data`, `env`), the SSH and TLS ways to a remote, numpy (the chunker),
# httpx (TLS remotes only: a Unix socket is spoken to with the standard library).
NOT_ON_THESE_PATHS = (
    "pathspec",
    "gpuhop.client.data",
    "gpuhop.api.data",
    "gpuhop.client.ssh",
    "gpuhop.client.tls",
    "numpy",
    "click",
    "httpx",
    "httpcore",
    "h11",
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


def test_run_speaks_to_the_local_agent_without_httpx(shared_agent, project, tmp_path):
    root = project({"hello.py": "print('hello')\n"})
    loaded = modules_of(shared_agent, tmp_path, "run", "hello.py", cwd=root)
    assert "gpuhop.cli.main" in loaded
    assert not [m for m in loaded if m.split(".")[0] in ("httpx", "httpcore", "h11")]
