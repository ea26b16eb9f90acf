"""Runs on the user's machine: `gpuhop serve` (a model server job) and `gpuhop predict`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from gpuhop.api import JobState
from gpuhop.cli import jobopts
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.forward import TF_SERVING_REST_PORT, hold
from gpuhop.cli.output import fail, print_json, say
from gpuhop.client import Client, GpuhopError


def serve(  # noqa: PLR0913 (a command: each parameter is one of its options)
    source: str = typer.Argument(
        ...,
        metavar="JOB[:PATH] | SAVEDMODEL_DIR",
        help="A finished job whose artifacts hold the SavedModel (PATH inside them; default:"
        " the only one there), or a local SavedModel directory (uploaded).",
    ),
    name: str = typer.Option(
        ..., "--name", "-n", help="The model name in URLs; also the serving job's name."
    ),
    gpus: int = jobopts.worded(jobopts.GPUS, "Whole GPUs for the server."),
    gpu_memory: str | None = jobopts.GPU_MEMORY,
    env: list[str] = jobopts.ENV,
    priority: int = jobopts.PRIORITY,
    image: str | None = jobopts.worded(
        jobopts.IMAGE,
        "Run the server inside this container image on the GPU host (Podman; pulled there"
        " from its registry while the job waits, where the host lacks it) with the image's"
        " own python3, which must have TensorFlow, starlette and uvicorn; gpuhop's serving"
        " code is mounted in read-only.",
    ),
    no_image: bool = jobopts.worded(
        jobopts.NO_IMAGE,
        "Run the server with the agent's own Python (the host's TensorFlow), not in a"
        " container image: also where the agent runs every job in a default image"
        " (agent.toml `image`).",
    ),
    image_secret: str | None = jobopts.IMAGE_SECRET,
    max_batch_size: int = typer.Option(
        32, "--max-batch-size", min=1, help="Rows per model call; 1 turns batching off."
    ),
    batch_timeout_ms: float = typer.Option(
        2.0,
        "--batch-timeout-ms",
        min=0,
        help="How long a request waits for others to fill its batch.",
    ),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="Print the job id and return without waiting."
    ),
    replace: bool = typer.Option(
        False,
        "--replace",
        help="Once this server answers, cancel your model servers of the same name from"
        " before it (a new version in place of the old: requests by the name go to the old"
        " one until then, and the old one finishes what it is answering).",
    ),
    port_here: int | None = typer.Option(
        None,
        "--port-here",
        min=0,
        max=65535,
        help="Once ready, forward this port here to the server (8501: TF Serving's), as"
        " `gpuhop forward` does, until Ctrl-C; the server keeps running.",
    ),
    on: str | None = OnOption,
) -> None:
    """Serve a SavedModel on the GPU host with TensorFlow Serving's REST API.

    The server runs as a job (see `gpuhop ps`, `logs`, `cancel`) in a private network on
    the GPU host, which no other job reaches.
    Reach it with `gpuhop predict NAME input.json`, through the agent with your
    credentials, or forward its port with `gpuhop forward` for any TF Serving client.

    With --image (or the agent's default image: agent.toml `image`) the server runs in that
    container image with the image's own python3 and packages; the image must have
    TensorFlow, starlette and uvicorn (a server whose image lacks one fails at once,
    saying what to install there). --no-image runs it with the agent's own Python instead.

    A job's SavedModel is not copied: the server sees it read-only, and the job's files
    stay while the server is queued or running.

    A server under a name that one of yours already serves is a new version: requests by
    the name reach the one before until the new one answers, then the new one. --replace
    then cancels the one before; without it, both keep running (and their GPUs).

    Example: gpuhop serve digits-demo --name digits
    """
    if replace and detach:
        fail(
            "--replace waits for the new server to answer before it cancels the one before:"
            " leave out --detach"
        )
    spec = jobopts.spec_of(
        {
            "gpus": gpus,
            "gpu_memory": gpu_memory,
            "priority": priority,
            "env": env,
            "image": image,
            "no_image": no_image,
            "image_secret": image_secret,
        }
    )
    with client_for(on) as client:
        try:
            if name is not None:
                _warn_of_namesakes(client, name, replace)
            model = client.serve(
                Path(source) if Path(source).is_dir() else source,
                name=name,
                gpus=spec.gpus,
                gpu_memory_mb=spec.gpu_memory_mb,
                priority=spec.priority,
                env=dict(spec.env),
                image=spec.image,
                no_image=spec.no_image,
                image_secret=spec.image_secret,
                max_batch_size=max_batch_size,
                batch_timeout_ms=batch_timeout_ms,
                wait=False,
            )
            if detach:
                say(f"model server job {model.info.job} queued ({model.info.source})")
                sys.stdout.write(model.info.job + "\n")
                return
            say(f"model server job {model.info.job} started; loading {model.info.source}")
            info = model.wait_ready()
            if replace:
                for job_id in model.replace_namesakes():
                    say(f"cancelled job {job_id}, the model server before this one under {name}")
        except GpuhopError as e:
            fail(e.message, code=1 if e.code == "conflict" else 2)
        except KeyboardInterrupt:
            say("stopped waiting; the model server job keeps starting")
            raise typer.Exit(130) from None
    base = f"/v1/models/{info.name}"
    say(
        f"model {info.name} ready in job {info.job} (port {info.port} in its private"
        f" network on the GPU host)\n"
        f"  predict:  gpuhop predict {info.name} input.json\n"
        f"  REST:     gpuhop forward {info.job}, then POST"
        f" http://127.0.0.1:{TF_SERVING_REST_PORT}{base}:predict\n"
        f"  stop:     gpuhop cancel {info.job}"
    )
    sys.stdout.write(info.job + "\n")
    if port_here is not None and info.port is not None:
        sys.stdout.flush()
        with client_for(on) as client:
            hold(client, client.job(info.job), info.port, port_here, "127.0.0.1")


def _warn_of_namesakes(client: Client, name: str, replace: bool) -> None:
    """Say so where a job of that name runs or waits already (a model server of that name,
    most likely): `predict NAME` reaches the one before until the new one is ready (as TF
    Serving keeps a version until the next has loaded), `cancel NAME` the new one."""
    alive = [JobState.queued, JobState.starting, JobState.running]
    same = [
        j["id"] for j in client.jobs_json(alive, fields=["id", "name"]) if j.get("name") == name
    ]
    if same and replace:
        say(
            f"job {', '.join(same)} is named {name} too: `predict {name}` reaches the model"
            " server before this one until this one answers; then --replace cancels it"
        )
    elif same:
        say(
            f"[yellow]job {', '.join(same)} is named {name} too and has not ended; `predict"
            f" {name}` reaches the newest that answers (a model server before this one until"
            f" this one is ready) and `cancel {name}` the newest: cancel the other by its id"
            " once this one answers[/yellow]"
        )


def predict(
    name: str = typer.Argument(..., metavar="NAME", help="The model name (or its job id)."),
    input_file: str = typer.Argument(
        ...,
        metavar="INPUT.json",
        help='A TF Serving request body: {"instances": [...]} or {"inputs": ...}; - for stdin.',
    ),
    signature: str | None = typer.Option(
        None, "--signature", help="The signature to call (default: serving_default)."
    ),
    on: str | None = OnOption,
) -> None:
    """Send a predict request to a served model, through the agent, and print the answer."""
    try:
        text = sys.stdin.read() if input_file == "-" else Path(input_file).read_text()
    except OSError as e:
        fail(f"cannot read {input_file}: {e.strerror or e}")
    try:
        body = json.loads(text)
    except ValueError as e:
        fail(f"{input_file} is not valid JSON: {e}")
    if not isinstance(body, dict):
        fail(f'{input_file} must hold a JSON object: {{"instances": [...]}} or {{"inputs": ...}}')
    with client_for(on) as client:
        try:
            answer = client.model(name).predict(body, signature=signature)
        except GpuhopError as e:
            fail(e.message)
    print_json(answer)


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command()(predict)
