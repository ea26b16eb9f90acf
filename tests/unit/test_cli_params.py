"""The everyday commands' own parser (gpuhop.cli.params) against typer's: for a plain, valid
command line both call the command with the same arguments, and whatever the parser does
not take as surely valid it leaves to typer (None), which says what is wrong."""

from __future__ import annotations

import functools
import importlib
from typing import Any

import pytest
import typer.main

from gpuhop.cli import params
from gpuhop.cli.main import COMMANDS, FAST, build, fast_command

VALID = [
    ("ps", []),
    ("ps", ["--state", "running", "-s", "queued", "--limit", "5"]),
    ("ps", ["--json", "--on", "lab"]),
    ("ps", ["--watch", "--every", "1.5", "--on=lab"]),
    ("show", ["abc"]),
    ("show", ["--json", "abc"]),
    ("logs", ["abc", "-f"]),
    ("logs", ["abc", "--worker", "2", "--no-progress"]),
    ("cancel", ["abc", "--grace", "3", "--no-wait"]),
    ("cancel", ["--wait", "abc"]),
    ("cancel", ["abc", "def", "--no-wait"]),
    ("logs", ["abc", "--tail", "3", "-f"]),
    ("wait", ["abc", "def", "--on", "lab"]),
    ("run", ["hello.py"]),
    ("run", ["hello.py", "--epochs", "3", "-x", "--help"]),  # the script's own options
    ("run", ["-g", "1", "--name", "n", "-e", "A=1", "-e", "B=2", "train.py", "--lr", "0.1"]),
    ("run", ["--gpu-memory", "6GiB", "--keras", "tf-keras", "--after", "a,b", "--after-any",
             "--timeout", "6h", "--retry-on", "any", "--priority", "-5", "x.py"]),
    ("run", ["--workdir", "/tmp", "-r", "req.txt", "--pull", "out", "-d", "-q", "-n5", "x.py"]),
    ("run", ["--workers", "2", "--gpus-per-worker=1", "--pack", "--", "x.py", "--on", "y"]),
]  # fmt: skip

LEFT_TO_TYPER = [
    ("ps", ["--help"]),
    ("ps", ["--limit", "0"]),  # below its minimum
    ("ps", ["--limit", "many"]),
    ("ps", ["--state", "sleeping"]),
    ("ps", ["--bogus"]),
    ("ps", ["--limit"]),  # no value
    ("ps", ["extra"]),
    ("show", []),  # the job is missing
    ("run", ["-qd", "x.py"]),  # short flags run together
    ("run", ["--unknown", "x.py"]),
    ("run", []),
    ("cancel", ["abc", "--wait=yes"]),
    ("wait", []),
    ("logs", ["abc", "--tail", "-1"]),
]


def typer_kwargs(command: str, args: list[str]) -> dict[str, Any]:
    """What typer calls `command`'s function with for `args`: the app is built with a
    stand-in of the same signature in its place, which keeps what it is called with."""
    module = importlib.import_module(f"gpuhop.cli.{COMMANDS[command]}")
    fn, seen = getattr(module, command), {}

    @functools.wraps(fn)
    def stand_in(**kwargs: Any) -> None:
        seen.update(kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, command, stand_in)
        app = build([command])
    typer.main.get_command(app).main([command, *args], standalone_mode=False)
    return seen


@pytest.mark.parametrize(("command", "args"), VALID)
def test_a_valid_command_line_gets_what_typer_gives(command, args, monkeypatch) -> None:
    monkeypatch.delenv("GPUHOP_REMOTE", raising=False)
    fast = fast_command([command, *args])
    assert fast is not None, "left to typer"
    fn, kwargs = fast
    assert fn.__name__ == command
    assert kwargs == typer_kwargs(command, args)


def test_the_remote_comes_from_the_environment_as_in_typer(monkeypatch) -> None:
    monkeypatch.setenv("GPUHOP_REMOTE", "lab")
    fast = fast_command(["ps"])
    assert fast is not None
    assert fast[1]["on"] == "lab" == typer_kwargs("ps", [])["on"]
    assert fast_command(["ps", "--on", "local"])[1]["on"] == "local"  # type: ignore[index]


@pytest.mark.parametrize(("command", "args"), LEFT_TO_TYPER)
def test_anything_unsure_is_left_to_typer(command, args) -> None:
    assert fast_command([command, *args]) is None


def test_only_the_everyday_commands_and_only_after_the_root() -> None:
    assert {"run", "ps", "show", "logs", "cancel", "wait"} == FAST
    assert fast_command(["gpus"]) is None
    assert fast_command(["--version"]) is None
    assert fast_command(["--on", "lab", "ps"]) is None  # typer: no such root option


def test_typer_reads_the_same_declarations() -> None:
    def command(
        name: str = params.Argument(..., metavar="NAME", help="Who."),
        times: int = params.Option(1, "--times", "-t", min=1, help="How often."),
    ) -> None:
        pass

    made = params.for_typer(command)
    assert made is not command and made.__name__ == "command"
    app = typer.Typer()
    app.command()(made)
    app.command("other")(lambda: None)
    ctx = typer.main.get_command(app).commands["command"].make_context("command", ["x", "-t3"])  # type: ignore[attr-defined]
    assert ctx.params == {"name": "x", "times": 3}
    assert params.parse(command, ["x", "-t3"]) == {"name": "x", "times": 3}
    assert params.parse(command, ["x", "-t0"]) is None  # typer says why


def _plain(a, b=1, *, c, d="x"):
    pass


def _star(*args):
    pass


@pytest.mark.parametrize("command", sorted(FAST))
def test_parameters_are_read_as_inspect_reads_them(command):
    import inspect

    fn = getattr(importlib.import_module(f"gpuhop.cli.{COMMANDS[command]}"), command)
    for f in (fn, _plain):
        expected = [
            (p.name, params._NO_DEFAULT if p.default is inspect.Parameter.empty else p.default)
            for p in inspect.signature(f).parameters.values()
        ]
        assert params.parameters(f) == expected


def test_a_function_with_star_args_or_a_wrapper_is_left_to_typer():
    for fn in (_star, functools.wraps(_plain)(lambda *a, **k: None), print):
        with pytest.raises(params.Unsure):
            params.parameters(fn)
