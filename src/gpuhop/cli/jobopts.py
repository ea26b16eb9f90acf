"""Runs on the user's machine: the options of a job, declared once for every command that
queues one (`run`, `sweep`, `notebook`, `serve`, `tf-server start`), and `spec_of`, which makes the
job's `JobSpec` of a command's values or fails saying which option is wrong.

A command takes the subset it needs, each as a parameter of the name it has in `OPTIONS`
and with its declaration there for a default (`worded` gives one another help text: "for
each run"); `spec_of` reads the values by those names, as the command's `locals()` hand
them over on its first line. The declarations are `gpuhop.cli.params`' own, so `run` stays
parsed without typer; this module loads neither typer nor the spec's dataclasses until a
spec is made (`logs` and `cancel` live beside `run`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuhop.api.queue import parse_duration
from gpuhop.api.sizes import parse_mb
from gpuhop.api.states import RetryOn
from gpuhop.cli import params
from gpuhop.cli.output import fail

if TYPE_CHECKING:
    from gpuhop.api.spec import JobSpec

# `--notify desktop`: this terminal tells of the job's end (`gpuhop run` waits for it); it
# is no webhook, and never sent.
DESKTOP = "desktop"


class KerasChoice(StrEnum):
    tf_keras = "tf-keras"
    keras3 = "keras3"


# -- what the job runs with ------------------------------------------------------------------

GPUS = params.Option(0, "--gpus", "-g", min=0, help="Whole GPUs to give the job.")
GPU_MEMORY = params.Option(
    None,
    "--gpu-memory",
    metavar="SIZE",
    help="Instead of whole GPUs: a share of one GPU (6GiB, 6G, 6144M, or MB), which the"
    " job may share with other such jobs. TensorFlow, JAX and PyTorch in the job are"
    " capped at it.",
)
NAME = params.Option(None, "--name", "-n", help="A name to find the job by.")
ENV = params.Option(
    [], "--env", "-e", metavar="KEY=VALUE", help="Set an environment variable (repeatable)."
)
WORKERS = params.Option(
    1,
    "--workers",
    "-w",
    min=1,
    max=64,
    help="Run N worker processes: tf-keras under MultiWorkerMirroredStrategy (TF_CONFIG"
    " made for you), or Keras 3 on JAX with keras.distribution (-e KERAS_BACKEND=jax).",
)
KERAS = params.Option(
    None,
    "--keras",
    help="Which Keras the workers of a --workers job use (default: from KERAS_BACKEND and"
    " TF_USE_LEGACY_KERAS, then what the host has). keras3 takes its backend from"
    " KERAS_BACKEND; only jax runs across processes.",
)
GPUS_PER_WORKER = params.Option(
    0, "--gpus-per-worker", min=0, help="Whole GPUs for each worker of a multi-worker job."
)
WORKER_TIMEOUT = params.Option(
    300,
    "--worker-timeout",
    min=5,
    metavar="SECONDS",
    help="How long a worker waits for its peers to join before the job fails.",
)
PACK = params.Option(
    False,
    "--pack",
    help="On an agent with the Ray or Slurm backend: put the workers on as few nodes as"
    " possible (default: spread across nodes; on Slurm, one worker per node).",
)
NO_AUTO = params.Option(
    False,
    "--no-auto",
    help="Leave Keras's fit as it is: no metrics callback (and, with --retries, no"
    " BackupAndRestore) added for you. Same as -e GPUHOP_AUTO=0.",
)
WORKDIR = params.Option(
    Path("."), "--workdir", "-C", help="The directory to sync (default: this one)."
)
DATA = params.Option(
    [],
    "--data",
    metavar="NAME[:VERSION]=MOUNT|s3://BUCKET/PREFIX[:NAME]",
    help="Mount a dataset read-only at MOUNT in the work dir (repeatable; latest version"
    " unless pinned, e.g. mnist:2=data). Or a bucket's prefix, fetched onto the GPU host"
    " with your AWS_* secrets while the job waits, and read-only at $GPUHOP_DATA/NAME"
    " (default NAME: the prefix's last part).",
)
SECRET = params.Option(
    [],
    "--secret",
    metavar="NAME[=ENVVAR]",
    help="Give the job your secret NAME (gpuhop secret set NAME) as the environment variable"
    " NAME, or ENVVAR (repeatable). Only its name travels; its value is masked (***) in the"
    " job's log and everywhere gpuhop shows the job.",
)
REQUIREMENTS = params.Option(
    None,
    "--requirements",
    "-r",
    metavar="FILE",
    help="Packages for the job's venv, built once per set on the host and reused; the"
    " host's TensorFlow stays visible. Default: requirements.txt here, if any.",
)
NO_REQUIREMENTS = params.Option(
    False, "--no-requirements", help="Ignore requirements.txt: run with the host's packages."
)
PYTHON = params.Option(
    None, "--python", metavar="PATH", help="Run with this interpreter on the host."
)
IMAGE = params.Option(
    None,
    "--image",
    metavar="REF",
    help="Run the job inside this container image on the GPU host (Podman; pulled there"
    " from its registry while the job waits, where the host lacks it), with the image's own"
    " python3. requirements.txt is then not sent; --requirements FILE installs FILE on top"
    " of the image with its pip (built once per image and file, then reused).",
)
NO_IMAGE = params.Option(
    False,
    "--no-image",
    help="Run with the host's Python, not in a container image: also where the agent runs"
    " every job in a default image (agent.toml `image`).",
)
IMAGE_SECRET = params.Option(
    None,
    "--image-secret",
    metavar="NAME",
    help="Pull --image with your secret NAME (gpuhop secret set NAME), holding the"
    " registry's user:password (a token goes where the password does).",
)
MIXED_GPUS = params.Option(
    False,
    "--mixed-gpus",
    help="Several GPUs may be of different models (default: the job waits for GPUs of"
    " one model and topology group).",
)

# -- its place in the queue, and what ends or repeats it --------------------------------------

RETRIES = params.Option(
    0,
    "--retries",
    min=0,
    max=100,
    help="Run a failed attempt again up to N times (see --retry-on);"
    " $GPUHOP_CHECKPOINT_DIR is kept.",
)
RETRY_ON = params.Option(
    RetryOn.infra.value,
    "--retry-on",
    metavar="infra|any",
    help="Which failures --retries runs again: infra (default: lost, oom-host, killed,"
    " gpu-fault, none of them the code's fault) or any (also app-error and oom-gpu).",
)
PRIORITY = params.Option(
    0,
    "--priority",
    min=-100,
    max=100,
    help="Higher starts first (-100..100; ties by age). On a team agent only an admin may go"
    " above 0.",
)
AFTER = params.Option(
    None,
    "--after",
    metavar="JOB[,JOB...]",
    help="Wait in the queue until these jobs end (ids, prefixes or names; repeatable).",
)
AFTER_ANY = params.Option(
    False,
    "--after-any/--after-ok",
    help="--after-ok (default): run only if every --after job succeeded, else be cancelled"
    " saying which did not. --after-any: run however they ended.",
)
# --timeout is what it was first called, and stays: --time-limit says which timeout it is.
TIME_LIMIT = params.Option(
    None,
    "--time-limit",
    "--timeout",
    metavar="DURATION",
    help="A time limit (6h, 90m, 30s, or seconds): SIGTERM when it passes, SIGKILL 10s later;"
    " the job ends with class timeout and is not retried.",
)
NOTIFY = params.Option(
    [],
    "--notify",
    metavar="URL|desktop",
    help="POST the job's start and end (JSON) to this webhook; a Slack incoming webhook"
    " works as is (repeatable). 'desktop': a desktop notification here when it ends.",
)
MAX_PARALLEL = params.Option(
    None, "--max-parallel", min=1, metavar="K", help="At most K runs at once (the agent's)."
)

# Each option by the name of the command parameter that takes it.
OPTIONS: dict[str, Any] = {
    "gpus": GPUS,
    "gpu_memory": GPU_MEMORY,
    "name": NAME,
    "env": ENV,
    "workers": WORKERS,
    "keras": KERAS,
    "gpus_per_worker": GPUS_PER_WORKER,
    "worker_timeout": WORKER_TIMEOUT,
    "pack": PACK,
    "no_auto": NO_AUTO,
    "workdir": WORKDIR,
    "data": DATA,
    "secret": SECRET,
    "requirements": REQUIREMENTS,
    "no_requirements": NO_REQUIREMENTS,
    "python": PYTHON,
    "image": IMAGE,
    "no_image": NO_IMAGE,
    "image_secret": IMAGE_SECRET,
    "mixed_gpus": MIXED_GPUS,
    "retries": RETRIES,
    "retry_on": RETRY_ON,
    "priority": PRIORITY,
    "after": AFTER,
    "after_any": AFTER_ANY,
    "time_limit": TIME_LIMIT,
    "notify": NOTIFY,
    "max_parallel": MAX_PARALLEL,
}
# The spec's field each option sets where the parameter has another name.
FIELDS = {"gpu_memory": "gpu_memory_mb", "secret": "secrets"}
# The option that sets each field, as `JobSpec.problems` names it: "--gpu-memory".
OPTION_NAMES = {
    FIELDS.get(name, name): option.decls[0].partition("/")[0] for name, option in OPTIONS.items()
}
OPTION_NAMES["data_sources"] = OPTION_NAMES["data"]  # --data s3://...


def script_command() -> type:
    """typer's command class for a command that runs a script (`run`, `sweep`), whose context
    settings leave unknown options to the script, which starts at the first argument: an
    unknown option before the script is then named as every command names one ("No such
    option: --gpu (Possible options: --gpus, ...)", exit 2), not taken for the program to
    run or a sweep with no -p."""
    import difflib

    from typer import _click  # typer's own click, whose errors its commands print
    from typer.core import TyperCommand

    class ScriptCommand(TyperCommand):
        def parse_args(self, ctx: _click.Context, args: list[str]) -> list[str]:
            rest = super().parse_args(ctx, args)
            first = (ctx.params.get("command") or [""])[0]
            if first.startswith("-") and first != "-":
                names = [n for p in self.params for n in (*p.opts, *p.secondary_opts)]
                # Closer than click's 0.6: a script's --epochs is no gpuhop --detach.
                close = difflib.get_close_matches(first.partition("=")[0], names, cutoff=0.75)
                error = _click.exceptions.NoSuchOption(first, possibilities=close, ctx=ctx)
                if not close:
                    error.message += (
                        f" (the script's own options go after it: {ctx.command_path}"
                        " [OPTIONS] SCRIPT.py ARGS...)"
                    )
                raise error
            return rest

    return ScriptCommand


def worded(option: Any, help: str, **kw: Any) -> Any:
    """`option` with another help text (and metavar, ...) for a command whose job reads it
    otherwise ("Whole GPUs for each run."): the same option, told in its words."""
    return option._replace(kw={**option.kw, "help": help, **kw})


def spec_of(values: Mapping[str, Any], *, sweep: bool = False) -> JobSpec:
    """The job a command's option values ask for (`values`: by parameter name, those of
    `OPTIONS` read, the rest left alone); a malformed value or a clash between options
    fails, naming them. A `sweep`'s spec is that of each of its runs (--max-parallel is
    theirs)."""
    from gpuhop.api.spec import DataSource, JobSpec, Mount, SecretUse, split_data

    fields: dict[str, Any] = {}
    for name in OPTIONS.keys() & values.keys() - _MADE:
        fields[FIELDS.get(name, name)] = values[name]
    if values.get("gpu_memory") is not None:
        try:
            fields["gpu_memory_mb"] = parse_mb(values["gpu_memory"])
        except ValueError as e:
            fail(f"--gpu-memory: {e}")
    if values.get("time_limit") is not None:
        try:
            fields["time_limit"] = parse_duration(values["time_limit"])
        except ValueError as e:
            fail(f"{OPTION_NAMES['time_limit']}: {e}")
    if "env" in values:
        fields["env"] = _env(values)
    if "data" in values:
        try:
            datasets, buckets = split_data(values["data"])
            fields["data"] = tuple(Mount.parse(m) for m in datasets)
            fields["data_sources"] = tuple(DataSource.parse(b) for b in buckets)
        except ValueError as e:
            fail(f"--data {e}")
    if "secret" in values:
        try:
            fields["secrets"] = tuple(SecretUse.parse(s) for s in values["secret"])
        except ValueError as e:
            fail(f"--secret {e}")
    if "after" in values:
        refs = values["after"] or ()
        fields["after"] = tuple(r.strip() for rs in refs for r in rs.split(",") if r.strip())
    if "notify" in values:
        fields["notify"] = tuple(url for url in values["notify"] if url != DESKTOP)
    if values.get("image") is not None:
        from gpuhop.api.spec import check_image

        try:
            check_image(values["image"])
        except ValueError as e:
            fail(f"--image: {e}")
        if values.get("requirements") is not None:  # only when asked: not requirements.txt
            fields["requirements"] = _requirements(values)
    elif "requirements" in values or "no_requirements" in values:
        # An image job has the image's packages: the work dir's requirements.txt is not sent.
        fields["requirements"] = _requirements(values)
    spec = JobSpec(**fields)
    problems = (spec.replace(sweep="") if sweep else spec).problems(OPTION_NAMES)
    if problems:
        fail("; ".join(problems))
    return spec


# The options `spec_of` makes a field of, each its own way.
_MADE = frozenset(
    {"gpu_memory", "time_limit", "env", "keras", "no_auto", "data", "secret", "after", "notify"}
    | {"requirements", "no_requirements", "workdir"}
)


def _env(values: Mapping[str, Any]) -> dict[str, str]:
    env = {}
    for pair in values["env"]:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--env takes KEY=VALUE, got {pair!r}")
        env[key] = value
    if values.get("no_auto"):
        env["GPUHOP_AUTO"] = "0"
    if values.get("keras") is not None:
        env["GPUHOP_KERAS"] = KerasChoice(values["keras"]).value
    return env


def _requirements(values: Mapping[str, Any]) -> str | None:
    """The requirements text the options ask for: --requirements FILE's, else the work
    dir's requirements.txt if any (none with --no-requirements)."""
    from gpuhop.client import GpuhopError
    from gpuhop.client.submitted import requirements_text

    given = False if values.get("no_requirements") else values.get("requirements")
    try:
        return requirements_text(given, Path(values.get("workdir", ".")).absolute())
    except GpuhopError as e:
        fail(e.message)
