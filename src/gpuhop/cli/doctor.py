"""Runs on the user's machine: `gpuhop doctor`, the GPU host's preflight, as a checklist."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from gpuhop.api import CheckStatus, DoctorCheck
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import fail, print_json
from gpuhop.client import Client, GpuhopError

if TYPE_CHECKING:
    from rich.console import Console

MARKS = {
    CheckStatus.passed: "[green]✓[/green]",
    CheckStatus.warning: "[yellow]![/yellow]",
    CheckStatus.failed: "[bold red]✗[/bold red]",
    CheckStatus.skipped: "[dim]-[/dim]",
}


def doctor(
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    fresh: bool = typer.Option(
        False, "--fresh", help="Probe TensorFlow again now (admins; else reused for a minute)."
    ),
    on: str | None = OnOption,
) -> None:
    """Check the GPU host for TensorFlow jobs: driver, CUDA, TensorFlow's build, the GPUs
    it sees, tf-keras, free disk; and which credentials a bucket's fetch (--data s3://...)
    would use for you. Prints a fix for each problem; exits 1 if a check failed."""
    try:
        with client_for(on) as client:
            if json_out:
                checks = client.doctor(fresh=fresh)
                print_json([c.model_dump(mode="json") for c in checks])
            else:
                checks = _shown_as_they_come(client, fresh)
    except GpuhopError as e:
        fail(e.message)
    raise typer.Exit(exit_code(checks))


def _shown_as_they_come(client: Client, fresh: bool) -> list[DoctorCheck]:
    """The checks, each printed once known: the host's own at once, then TensorFlow's,
    whose probe (a fresh Python importing TensorFlow) takes seconds. Returns them all."""
    from rich.console import Console

    out = Console(highlight=False, emoji=False)
    quick = client.doctor(probe=False)
    for check in quick:
        _print(out, check)
    shown = {c.name for c in quick}
    if out.is_terminal:
        with out.status("probing TensorFlow on the GPU host (a fresh Python imports it)…"):
            checks = client.doctor(fresh=fresh)
    else:
        checks = client.doctor(fresh=fresh)
    for check in checks:
        if check.name not in shown:
            _print(out, check)
    _summary(out, checks)
    return checks


def exit_code(checks: list[DoctorCheck]) -> int:
    """1 if any check failed; warnings and skipped checks leave it at 0."""
    return 0 if all(c.ok for c in checks) else 1


def _print(out: Console, c: DoctorCheck) -> None:
    from rich.markup import escape

    text = f"{MARKS[c.status]} [bold]{escape(c.name)}[/bold]: {escape(c.detail)}"
    if c.status == CheckStatus.skipped:
        text += " [dim](skipped)[/dim]"
    out.print(text, soft_wrap=True)
    if c.fix and c.status in (CheckStatus.failed, CheckStatus.warning):
        out.print(f"    fix: {escape(c.fix)}", soft_wrap=True)


def _summary(out: Console, checks: list[DoctorCheck]) -> None:
    failed = [c.name for c in checks if not c.ok]
    warned = [c.name for c in checks if c.status == CheckStatus.warning]
    if failed:
        out.print(f"[bold red]{len(failed)} check(s) failed:[/bold red] {', '.join(failed)}")
    elif warned:
        out.print(f"all checks passed, {len(warned)} with a warning")
    else:
        out.print("all checks passed")


def register(app: typer.Typer) -> None:
    app.command()(doctor)
