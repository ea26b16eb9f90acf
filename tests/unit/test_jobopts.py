"""A job's options, declared once (gpuhop.cli.jobopts): every command that queues a job takes
them from there, `spec_of` makes its JobSpec or fails naming the option, and `--time-limit`
keeps `--timeout` as its other name in both parsers."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from gpuhop.api.spec import JobSpec, Mount
from gpuhop.cli import jobopts, params
from gpuhop.cli.main import fast_command

# Each command that queues a job, as its module and function.
JOB_COMMANDS = [
    ("jobs", "run"),
    ("sweep", "sweep"),
    ("notebook", "notebook"),
    ("tfserver", "start"),
]


@pytest.mark.parametrize(("module", "command"), JOB_COMMANDS)
def test_a_commands_job_options_are_the_shared_declarations(module, command) -> None:
    fn = getattr(importlib.import_module(f"gpuhop.cli.{module}"), command)
    taken = {
        name: default
        for name, default in params.parameters(fn)
        if name in jobopts.OPTIONS and isinstance(default, params.Param)
    }
    assert {"gpus", "gpu_memory"} <= set(taken)
    for name, option in taken.items():
        shared = jobopts.OPTIONS[name]
        # Only the words may differ ("Whole GPUs for each run."): never what is parsed.
        assert (option.default, option.decls) == (shared.default, shared.decls), name
        parsed = {k: v for k, v in option.kw.items() if k not in params.HELP_ONLY}
        assert parsed == {k: v for k, v in shared.kw.items() if k not in params.HELP_ONLY}


def test_no_command_imports_another_commands_private_names() -> None:
    cli = Path(jobopts.__file__).parent
    for path in cli.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpuhop.cli"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"


@pytest.mark.parametrize("flag", ["--time-limit", "--timeout"])
def test_the_time_limit_has_two_names_in_both_parsers(flag) -> None:
    from tests.unit.test_cli_params import typer_kwargs

    args = [flag, "90m", "x.py"]
    fast = fast_command(["run", *args])
    assert fast is not None
    assert fast[1]["time_limit"] == "90m" == typer_kwargs("run", args)["time_limit"]
    assert fast[1] == typer_kwargs("run", args)


def test_run_help_shows_both_names(capsys) -> None:
    import typer.main

    from gpuhop.cli.main import build

    with pytest.raises(SystemExit):
        typer.main.get_command(build(["run"])).main(["run", "--help"], prog_name="gpuhop")
    out = capsys.readouterr().out
    assert "--time-limit, --timeout DURATION" in out


def values(**given: object) -> dict[str, object]:
    """`run`'s option values: each at its default, but those `given`."""
    defaults = {name: option.default for name, option in jobopts.OPTIONS.items()}
    return {**defaults, "env": [], "data": [], "notify": [], **given}


def test_a_spec_is_made_of_the_option_values(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("numpy\n")
    spec = jobopts.spec_of(
        values(
            gpu_memory="6GiB",
            env=["A=1", "B=x=y"],
            no_auto=True,
            keras=jobopts.KerasChoice.keras3,
            data=["mnist:v2=data", "raw=in"],
            after=["a,b", " c "],
            time_limit="90m",
            notify=["https://example.com/hook", "desktop"],
            retry_on="any",
            priority=-5,
            workdir=tmp_path,
        )
    )
    assert spec == JobSpec(
        gpu_memory_mb=6144,
        env={"A": "1", "B": "x=y", "GPUHOP_AUTO": "0", "GPUHOP_KERAS": "keras3"},
        data=(Mount("mnist", 2, "data"), Mount("raw", None, "in")),
        after=("a", "b", "c"),
        time_limit=5400.0,
        notify=("https://example.com/hook",),  # desktop is this terminal's, never sent
        retry_on="any",
        priority=-5,
        requirements="numpy\n",
    )
    assert jobopts.spec_of(values(workdir=tmp_path, no_requirements=True)).requirements is None
    # A command without the requirements options runs with the host's packages.
    assert jobopts.spec_of({"gpus": 1, "gpu_memory": None}) == JobSpec(gpus=1)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"env": ["NOEQUALS"]}, "--env takes KEY=VALUE, got 'NOEQUALS'"),
        ({"gpu_memory": "6XB"}, "--gpu-memory: cannot read '6XB' as a size"),
        ({"time_limit": "soon"}, "--time-limit: 'soon' is not a duration"),
        ({"data": ["mnist"]}, "--data takes NAME[:VERSION]=MOUNT, got 'mnist'"),
        ({"data": ["mnist:x=d"]}, "--data mnist:x=d: the version must be a number"),
        ({"retry_on": "bugs"}, "--retry-on takes infra or any, got 'bugs'"),
        ({"after_any": True}, "--after-any says how to wait for --after jobs"),
        ({"workers": 2, "gpus": 1}, "a multi-worker job takes --gpus-per-worker, not --gpus"),
        ({"gpus_per_worker": 1}, "--gpus-per-worker is for multi-worker jobs (--workers N)"),
        (
            {"gpus": 2, "gpu_memory": "1G"},
            "--gpu-memory gives the job a share of one GPU; it cannot be combined with"
            " --gpus 2 (use --gpus 2 alone for whole GPUs)",
        ),
        ({"max_parallel": 2}, "--max-parallel limits the runs of a sweep"),
        ({"requirements": Path("nope.txt")}, "cannot read the requirements file nope.txt"),
    ],
)
def test_a_bad_option_fails_naming_it(given, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit:
        jobopts.spec_of(values(**given))
    assert exit.value.code == 2
    assert message in " ".join(capsys.readouterr().err.split())


def test_a_sweeps_runs_take_max_parallel() -> None:
    assert jobopts.spec_of(values(max_parallel=2), sweep=True).max_parallel == 2
