"""Output to a pipe without rich (gpuhop.cli.plain) is what rich itself writes there: the same
text for a message's markup, the same escaping, the same columns for a table."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.markup import escape as rich_escape
from rich.table import Table
from rich.text import Text

from gpuhop.cli import plain

MESSAGES = [
    "[dim]gpuhop:[/dim] synced 3 files (all unchanged) in 0.01s; job 1a2b3c4d queued",
    "[bold red]gpuhop: error:[/bold red] no job matches 'x'",
    "job 1a2b [green]succeeded[/]: exited with code 0\n  last metrics: loss=0.1",
    "a literal \\[bracket] and a [b]tag[/b]",
    "two backslashes \\\\[bold]then a tag[/bold]",
    "[x=1] is no tag; nor is [ this ] or [1]",
    "a bell\a, a carriage\r return, a form\x0cfeed",
    "",
]
TEXTS = [
    "a path/[with]/[/brackets]",
    "ends in a backslash\\",
    "\\[already escaped]",
    "fingerprint 3a:cd:ef [#fff]",
    "nothing to escape",
]


def rich_writes(markup: str) -> str:
    out = io.StringIO()
    Console(file=out, highlight=False, emoji=False).print(markup, soft_wrap=True)
    return out.getvalue()


@pytest.mark.parametrize("markup", MESSAGES)
def test_a_message_is_written_as_rich_writes_it(markup: str) -> None:
    assert plain.plain(markup) + "\n" == rich_writes(markup)


@pytest.mark.parametrize("text", TEXTS)
def test_escaping_is_richs(text: str) -> None:
    assert plain.escape(text) == rich_escape(text)
    message = f"[bold]gpuhop: error:[/bold] {plain.escape(text)}"  # as `fail` writes it
    assert plain.plain(message) + "\n" == rich_writes(message)


def rich_table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """The table as rich writes it at 400 columns, set up as the CLI sets its tables up."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in columns:
        table.add_column(col, no_wrap=col != columns[-1], overflow="ellipsis")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    out = io.StringIO()
    Console(file=out, highlight=False, emoji=False, width=400).print(table)
    return out.getvalue()


def test_a_table_is_written_as_rich_writes_it() -> None:
    columns = ("ID", "NAME", "STATE", "COMMAND")
    rows = [
        ("1a2b3c4d", "sweep[lr=0.1]", "running", "train.py --lr 0.1"),
        ("9f", "-", "queued", "x"),
        ("77", "a-much-longer-name", "succeeded", ""),
    ]
    assert plain.table(columns, rows, 400) == rich_table(columns, rows)


def test_narrow_characters_are_one_column_wide_as_rich_counts_them() -> None:
    from rich.cells import cell_len

    accepted = [chr(c) for c in range(0x80, 0x30000) if plain.narrow(chr(c))]
    assert len(accepted) > 5000  # Latin, Greek, Cyrillic, ..., punctuation, arrows
    assert [c for c in accepted if cell_len(c) != 1] == []
    assert all(plain.narrow(c) for c in "⏎·…éñ→")
    assert not any(plain.narrow(c) for c in ("日", "\u0301", "\u200b", "\U0001f600", "\t"))


def test_a_table_with_narrow_characters_is_written_as_rich_writes_it() -> None:
    columns = ("ID", "COMMAND")
    rows = [("1a", "python -c 'import os⏎print(1)'"), ("2b", "naïve · café")]
    assert plain.table(columns, rows, 400) == rich_table(columns, rows)


def test_what_only_rich_can_lay_out_is_left_to_it() -> None:
    assert plain.table(("A",), [("日本語",)], 400) is None  # its width on screen: rich's call
    assert plain.table(("A",), [("tab\there",)], 400) is None
    assert plain.table(("A", "B"), [("x" * 300, "y" * 200)], 400) is None  # squeezed by rich
