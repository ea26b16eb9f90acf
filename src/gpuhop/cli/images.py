"""Runs on the user's machine: `gpuhop images` (the GPU host's container images: reference,
size, last use) and `gpuhop images pull REF` (bring one onto the host)."""

from __future__ import annotations

import typer

from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import ago, fail, human_bytes, print_json, print_table, say
from gpuhop.client import GpuhopError

app = typer.Typer(
    help="The GPU host's container images: what it holds (reference, size, last use), and"
    " pulling one. A user of a team agent sees the images their own pulls and jobs used; an"
    " admin every one. `gpuhop gc` removes those unused for long.",
    invoke_without_command=True,
)


@app.callback()
def images(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """List the host's container images: reference, size, last use by a gpuhop job or pull."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        with client_for(on) as client:
            found = client.images()
    except GpuhopError as e:
        fail(e.message)
    if json_out:
        print_json([i.model_dump(mode="json") for i in found])
        return
    if not found:
        say("no images on the host that you may see")
        return
    rows: list[tuple[str, ...]] = [
        (
            ", ".join(i.references) or f"<none> {i.id[:12]}",
            human_bytes(i.size),
            ago(i.last_used) if i.last_used else "never",
            ", ".join(i.jobs) or "-",
        )
        for i in found
    ]
    print_table(("REFERENCE", "SIZE", "LAST USE", "JOBS"), rows)


@app.command("pull")
def pull(
    reference: str = typer.Argument(
        ..., help="The image, e.g. nvcr.io/nvidia/tensorflow:24.03-tf2-py3."
    ),
    secret: str | None = typer.Option(
        None,
        "--secret",
        metavar="NAME",
        help="Your secret (gpuhop secret set NAME) holding the registry's user:password.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """Pull an image onto the GPU host now (a job that names one not there pulls it too)."""
    try:
        with client_for(on) as client:
            info = client.pull_image(reference, secret)
    except GpuhopError as e:
        fail(e.message)
    if json_out:
        print_json(info.model_dump(mode="json"))
        return
    say(f"pulled {reference} ({human_bytes(info.size)}, id {info.id[:12]})")


def register(main: typer.Typer) -> None:
    main.add_typer(app, name="images")
