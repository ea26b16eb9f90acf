"""The `gpuhop` entry point: each command loads only its own module, and the table that says
which module that is matches what the modules register."""

from __future__ import annotations

import subprocess
import sys

import typer.main

from gpuhop.cli.main import COMMANDS, build, command_of


def names(app: typer.Typer) -> list[str]:
    group = typer.main.get_group(app)
    return list(group.commands)


def test_the_table_lists_every_command_the_modules_register() -> None:
    assert sorted(names(build())) == sorted(COMMANDS)


def test_each_command_registers_its_own_module_only() -> None:
    for name, module in COMMANDS.items():
        registered = names(build([name, "--help"]))
        assert name in registered
        assert {COMMANDS[n] for n in registered} == {module}


def test_the_command_is_the_first_argument_that_is_no_flag() -> None:
    assert command_of(["--version"]) is None
    assert command_of(["-h"]) is None
    assert command_of(["ps", "-a"]) == "ps"
    assert command_of(["run", "train.py", "logs"]) == "run"


def test_no_command_or_an_unknown_one_registers_them_all() -> None:
    assert sorted(names(build([]))) == sorted(COMMANDS)
    assert sorted(names(build(["--help"]))) == sorted(COMMANDS)
    assert sorted(names(build(["pss"]))) == sorted(COMMANDS)


def test_ps_loads_neither_other_commands_nor_httpx_cli() -> None:
    code = (
        "import sys\n"
        "from gpuhop.cli.main import build\n"
        "build(['ps'])\n"
        "prefixes = ('gpuhop.cli.', 'httpx._main', 'click', 'pygments')\n"
        "print(sorted(m for m, v in sys.modules.items() if v and m.startswith(prefixes)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = eval(out.stdout)  # a printed list of names
    assert "gpuhop.cli.agent" not in loaded
    assert "gpuhop.cli.notebook" not in loaded
    assert not [m for m in loaded if m.startswith(("httpx._main", "click", "pygments"))]


def test_a_short_option_means_one_thing_in_every_command() -> None:
    meanings: dict[str, dict[str, list[str]]] = {}  # -n -> {--name: [commands]}

    def walk(command: object, path: str) -> None:
        for param in getattr(command, "params", []):
            shorts = [o for o in param.opts if len(o) == 2 and o != "-h"]
            longs = [o for o in param.opts if o.startswith("--")]
            for short in shorts:
                meanings.setdefault(short, {}).setdefault(longs[0], []).append(path)
            if "--timeout" in longs:  # a job's time limit only, never a wait
                meanings.setdefault("--timeout", {}).setdefault("--time-limit", [])
                meanings["--timeout"][longs[0]] = [path]
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(build()), "")
    assert meanings["-n"].keys() == {"--name"}
    shared = {flag: list(by_long) for flag, by_long in meanings.items() if len(by_long) > 1}
    assert shared == {}


def test_every_usage_line_brackets_an_optional_argument_once() -> None:
    # forward's read "gpuhop forward [OPTIONS] {JOB} [[REMOTE_PORT]]": its metavar had
    # brackets of its own, and click adds them to an optional argument.
    from typer import _click

    def usages(command: _click.Command, parent: _click.Context | None, name: str) -> list[str]:
        ctx = _click.Context(command, info_name=name, parent=parent)
        found = [command.get_usage(ctx)]
        for sub_name, sub in getattr(command, "commands", {}).items():  # a group's
            found += usages(sub, ctx, sub_name)
        return found

    lines = usages(typer.main.get_group(build()), None, "gpuhop")
    assert any(line.startswith("Usage: gpuhop forward [OPTIONS]") for line in lines)
    assert [line for line in lines if "[[" in line or "]]" in line] == []
