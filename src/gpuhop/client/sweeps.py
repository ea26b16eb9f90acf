"""Runs on the user's machine: a sweep (or array) is one job per combination of parameter
values, all in one synced tree, queued with one sweep id so that the agent runs at most
`max_parallel` of them at once. `Client.sweep` says what each argument means."""

from __future__ import annotations

import itertools
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import gpuhop.client.jobs as jobs
from gpuhop.client.errors import GpuhopError
from gpuhop.client.job import Job
from gpuhop.client.session import Session

if TYPE_CHECKING:
    from gpuhop.api.spec import JobSpec
    from gpuhop.client.sync.upload import Progress, UploadProgress

MAX_RUNS = 1000
ARRAY_KEY = "index"
ARRAY_ENV = "GPUHOP_ARRAY_INDEX"
_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# A value goes into the run's name (`NAME[lr=0.1]`), so it takes that name's characters,
# less the ones that separate its parts.
_VALUE_RE = re.compile(r"[A-Za-z0-9._+-]{1,40}\Z")
_SWEEP_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}\Z")


@dataclass
class Sweep:
    """A queued sweep: its id (what `gpuhop sweep show` takes) and its runs, in order."""

    id: str
    name: str
    runs: list[Job]


def parse_param(text: str) -> tuple[str, list[str]]:
    """`-p lr=0.1,0.01` -> ("lr", ["0.1", "0.01"]). Raises GpuhopError naming the problem."""
    key, sep, values = text.partition("=")
    if not sep or not _KEY_RE.match(key):
        raise GpuhopError(
            f"-p {text!r}: give NAME=V1,V2,... with NAME a letter or '_' then letters, digits"
            " or '_'",
            code="bad_request",
        )
    return key, values.split(",")


# What a parameter takes from Python: its values (text, or numbers written as Python writes
# them: 0.001, 1e-05, 32), or a single one.
Values = Sequence[str | float] | str | float


def _texts(key: str, values: Values) -> list[str]:
    """A parameter's values as text. One str is one value: the characters of "0.1" would
    be three runs, with `lr` 0, . and 1."""
    items = [values] if isinstance(values, str | int | float) else list(values)
    for value in items:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise GpuhopError(
                f"{key}={value!r}: a parameter's values are text or numbers",
                code="bad_request",
            )
    return [str(value) for value in items]


def combinations(params: Mapping[str, Values], array: int | None = None) -> list[dict[str, str]]:
    """Every combination of the values (the first parameter varies slowest); an array of N
    adds `index` = 0..N-1. Raises GpuhopError for a bad value or too many runs."""
    grid = {k: _texts(k, v) for k, v in params.items()}
    if array is not None:
        if array < 1:
            raise GpuhopError("--array N needs N of 1 or more", code="bad_request")
        if ARRAY_KEY in grid:
            raise GpuhopError(f"-p {ARRAY_KEY}=... clashes with --array", code="bad_request")
        grid[ARRAY_KEY] = [str(i) for i in range(array)]
    if not grid:
        raise GpuhopError("a sweep needs -p NAME=V1,V2,... or --array N", code="bad_request")
    for key, values in grid.items():
        if not _KEY_RE.match(key):
            raise GpuhopError(f"parameter name {key!r} is not valid", code="bad_request")
        for value in values:
            if not _VALUE_RE.match(value):
                raise GpuhopError(
                    f"{key}={value!r}: a value is 1-40 letters, digits or . _ + -",
                    code="bad_request",
                )
        if len(set(values)) != len(values):
            raise GpuhopError(f"{key} lists a value twice", code="bad_request")
    total = 1
    for values in grid.values():
        total *= len(values)
    if total > MAX_RUNS:
        raise GpuhopError(f"the sweep has {total} runs; at most {MAX_RUNS}", code="bad_request")
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def fill(argv: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """`argv` with each `{key}` replaced by its value; other braces are left alone."""
    out = []
    for arg in argv:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out


def run_name(name: str, values: Mapping[str, str]) -> str:
    text = f"{name}[{','.join(f'{k}={v}' for k, v in values.items())}]"
    from gpuhop.api.models import JOB_NAME_RE

    if not JOB_NAME_RE.match(text):
        raise GpuhopError(
            f"the run name {text!r} is too long (at most 128 characters): use a shorter"
            " --name or fewer parameters",
            code="bad_request",
        )
    return text


_PLACE_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def unfilled(argv: Sequence[str], keys: Iterable[str]) -> list[str]:
    """The `{NAME}`s in `argv` that no parameter of `keys` fills: passed to every run as
    written, most often a name mistyped (`ckpt-{epoch}.keras` may be meant)."""
    known = set(keys)
    seen = dict.fromkeys(m for arg in argv for m in _PLACE_RE.findall(arg) if m not in known)
    return list(seen)


def run_values(name: str | None) -> dict[str, str]:
    """The parameter values a run's name carries (`run_name`'s `NAME[lr=0.1,batch=32]`), in
    order; {} for a name that is not a run's. A sweep's name has no `[` and a value no `,`
    or `]`, so the name parses back whole."""
    if not name or not name.endswith("]") or "[" not in name:
        return {}
    pairs = [p.partition("=") for p in name[name.index("[") + 1 : -1].split(",")]
    if any(not sep or not key for key, sep, _ in pairs):
        return {}
    return {key: value for key, _, value in pairs}


def submit(
    session: Session,
    command: jobs.Command,
    params: Mapping[str, Values],
    spec: JobSpec,
    *,
    array: int | None,
    workdir: str | os.PathLike[str],
    on_hash: Progress | None = None,
    on_upload: UploadProgress | None = None,
) -> Sweep:
    """Queue a run of `spec` per combination (see `Client.sweep`); `spec.name` names the
    sweep, and each run is named after it."""
    argv = jobs.argv_of(command)
    runs = combinations(params, array)
    for key in params:
        if not any("{" + key + "}" in arg for arg in argv):
            raise GpuhopError(
                f"parameter {key} is not used in the command: write {{{key}}} where its value"
                " goes, e.g. train.py --" + key + " {" + key + "}",
                code="bad_request",
            )
    name = spec.name
    if name is not None and not _SWEEP_NAME_RE.match(name):
        raise GpuhopError(
            f"--name {name!r}: 1-41 letters, digits, '.', '_' or '-', starting with a letter"
            " or digit",
            code="bad_request",
        )
    label = name or "sweep"
    sweep_id = f"{label}-{secrets.token_hex(3)}"
    names = [run_name(label, values) for values in runs]
    spec = spec.replace(sweep=sweep_id)
    jobs.check(spec)  # before the work dir is scanned
    root = Path(workdir).absolute()
    synced = jobs.scan_workdir(session, root, on_hash)
    queued: list[Job] = []
    for values, run in zip(runs, names, strict=True):
        env = dict(spec.env)
        if array is not None:
            env[ARRAY_ENV] = values[ARRAY_KEY]
        try:
            job = jobs.submit(
                session,
                fill(argv, values),
                spec.replace(name=run, env=env),
                workdir=root,
                on_upload=on_upload,
                synced=synced,
            )
        except GpuhopError as e:
            if not queued:
                raise
            # The runs queued before it go on: say so, with how to reach them (a user's
            # user_max_queued, say, refuses a sweep's later runs only).
            raise GpuhopError(
                f"{e.message}; {len(queued)} of the sweep's {len(runs)} runs were queued"
                f" before it (sweep {sweep_id}): `gpuhop sweep show {sweep_id}` lists them,"
                f" `gpuhop sweep cancel {sweep_id}` cancels them",
                code=e.code,
                status=e.status,
                detail={**e.detail, "sweep": sweep_id, "queued_runs": [j.id for j in queued]},
            ) from None
        queued.append(job)
    return Sweep(sweep_id, label, queued)
