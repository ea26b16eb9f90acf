"""Every command the README shows in a shell block (```sh, ```bash, ```console: its `$ `
lines) either runs here as written or is skipped for a stated reason.

The rule, applied to each command in the README's order (`skip_reason`, first match wins):

- not `gpuhop` (make, ray), or a shorthand of several (`ls | rm ID`, `[--dry-run]`):
  not one command line;
- needs a remote (`--on`, `remote`), a GPU (`--gpus N`, `--gpu-memory`, a GPU's id),
  a Ray or Slurm cluster (or several workers), a bucket (`s3://`), the network or a browser,
  a live screen or a port (`ui`, `top`, `logs -f`, notebooks, serving, TensorBoard,
  webhooks), or TensorFlow itself (`doctor`: tests/e2e/test_doctor_cli.py runs it);
- names a job, file or data set the README does not make here (`3fa9`, `JOB`, `big`,
  `./mnist`, `token.txt`...), or a job (`--after prep`) before a line run here makes it.

Everything else runs, in order, as written, in a fresh agent's home, in a directory that
holds plain-Python stand-ins for the README's `train.py`, `prep.py` and `report.py` (the
user's own scripts), and must exit 0. A skipped `gpuhop` line must still be a command line
`gpuhop` takes: its words are parsed by the command it names (its options exist, their
values are of the right kind). A new README line is run, or skipped by one of `REASONS`.
"""

from __future__ import annotations

import re
import shlex
from itertools import pairwise
from pathlib import Path

import pytest

from tests.conftest import REPO

README = REPO / "README.md"
BLOCK = re.compile(r"^```(bash|sh|console)\n(.*?)^```", re.M | re.S)

NOT_ONE = "not one gpuhop command line"
REMOTE = "needs a remote"
GPU = "needs a GPU"
CLUSTER = "needs a Ray or Slurm cluster, or several workers"
BUCKET = "needs a bucket"
LIVE = "opens a browser, a port, a live screen or the network"
TENSORFLOW = "needs TensorFlow on the host (test_doctor_cli runs it)"
ELSEWHERE = "names a job, file or data set the README does not make here"
REGISTRY = "pulls a container image from a registry (test_image_job_pulls runs its own)"
REASONS = (NOT_ONE, REMOTE, GPU, CLUSTER, BUCKET, LIVE, TENSORFLOW, ELSEWHERE, REGISTRY)

# Words that name what a reader has and this test does not: a job id or name the README
# made in a skipped line, the user's files and data, a served model.
PLACEHOLDERS = {
    "3fa9", "3fa9c1d2", "7c21", "JOB", "ID", "big", "digits", "digits-demo", "mnist",
    "./mnist", "token.txt", "key.txt", "key-id.txt", "input.json", "analysis.ipynb",
    "requirements-gpu.txt", "shard.py", "lab", "HF_TOKEN",
    "/opt/conda/envs/tf/bin/python",
}  # fmt: skip
LIVE_COMMANDS = {"ui", "top", "notebook", "serve", "predict", "forward", "tensorboard",
                 "tf-server", "stacks"}  # fmt: skip
STAND_IN = "import sys\nprint('ran', *sys.argv[1:])\n"


def commands() -> list[str]:
    """The README's shell commands, in order: a block's lines (continuations joined,
    comments dropped), a console block's `$ ` lines only."""
    out: list[str] = []
    for kind, body in BLOCK.findall(README.read_text()):
        lines = body.replace("\\\n", " ").splitlines()
        if kind == "console":
            lines = [line[2:] for line in lines if line.startswith("$ ")]
        for line in lines:
            words = shlex.split(line.replace("<<<", "<"), comments=True)
            if words:
                out.append(shlex.join(words))
    return out


def skip_reason(command: str, made: set[str]) -> str | None:
    """Why `command` does not run here (one of `REASONS`), or None: it runs. `made`: the
    job names that lines run before it gave (`--name`)."""
    words = shlex.split(command)
    text = f" {command} "
    if words[0] != "gpuhop" or "|" in words or any(w.startswith("[") for w in words):
        return NOT_ONE
    if "--on" in words or words[1] == "remote":
        return REMOTE
    if re.search(r" (--gpus(-per-worker)? [1-9]|--gpu-memory|--mixed-gpus|--release) ", text):
        return GPU
    if words[1:2] == ["run"] and "nvidia-smi" in words:
        return GPU
    if re.search(r" (--backend|--workers|--pack|ray) ", text):
        return CLUSTER
    if "s3://" in command or "AWS_" in command:
        return BUCKET
    if "--image" in words or words[1:3] == ["images", "pull"]:
        return REGISTRY
    if words[1] in LIVE_COMMANDS or "-f" in words or "--notify" in words:
        return LIVE
    if words[1] == "doctor":
        return TENSORFLOW
    if any(w.split(":")[0] in PLACEHOLDERS or w.split("=")[0] in PLACEHOLDERS for w in words):
        return ELSEWHERE
    if "<" in words:  # a secret read from the user's own file
        return ELSEWHERE
    after = [w for i, w in enumerate(words) if words[i - 1] == "--after"]  # --after-any: a flag
    if any(name not in made for names in after for name in names.split(",")):
        return ELSEWHERE  # a job the README makes only in a later line
    return None


def reasons(listed: list[str]) -> list[tuple[str, str | None]]:
    """Each command, with why it is skipped (`skip_reason`) or None."""
    made: set[str] = set()
    out = []
    for command in listed:
        reason = skip_reason(command, made)
        words = shlex.split(command)
        if reason is None and "--name" in words:
            made.add(words[words.index("--name") + 1])
        out.append((command, reason))
    return out


def parses(command: str) -> None:
    """Parse `command`'s words as the `gpuhop` command it names would (no call)."""
    import click
    import typer.main

    from gpuhop.cli.main import build

    words = shlex.split(command)[1:]
    words = words[: words.index("<")] if "<" in words else words
    cmd: click.Command = typer.main.get_command(build(words))
    path = ["gpuhop"]
    while isinstance(cmd, click.Group) and words and words[0] in cmd.commands:
        path.append(words[0])
        cmd, words = cmd.commands[words[0]], words[1:]
    with cmd.make_context(" ".join(path), list(words)):
        pass


def test_every_readme_command_runs_or_is_skipped_for_a_reason(make_agent, tmp_path: Path):
    listed = commands()
    assert len(listed) > 80  # the blocks were found
    skips = reasons(listed)
    assert {reason for _, reason in skips} <= {*REASONS, None}
    ran = [command for command, reason in skips if reason is None]
    # A job that --after waits for is one a line names (--name), before it or after it:
    # `--after prep,train` once named a job "train" that no line made.
    named = {w[w.index("--name") + 1] for w in map(shlex.split, listed) if "--name" in w}
    for command in listed:
        for flag, value in pairwise(shlex.split(command)):
            if flag == "--after":
                assert set(value.split(",")) <= named, f"README: {command!r}: no line makes it"
    assert len(ran) >= 10, ran

    # A skipped gpuhop line is still one gpuhop takes as written.
    for command, reason in skips:
        if reason not in (None, NOT_ONE):
            try:
                parses(command)
            except Exception as e:
                pytest.fail(f"README: {command!r} does not parse: {e}")

    agent = make_agent()
    work = tmp_path / "project"
    work.mkdir()
    for script in ("train.py", "prep.py", "report.py"):
        (work / script).write_text(STAND_IN)
    for command in ran:
        done = agent.cli(*shlex.split(command)[1:], cwd=work)
        assert done.returncode == 0, f"README: {command!r} exited {done.returncode}:\n" + (
            done.stdout + done.stderr
        )
