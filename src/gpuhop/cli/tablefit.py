"""Runs on the user's machine: which columns of a table a terminal's width shows, and how
wide each is, as `docker ps` and `kubectl get` do it: the identifying columns stay whole,
optional ones go when room is short, and the free-text ones (metrics, a command) are cut last.

rich's own squeezing cuts every column in proportion (an 8-character job id to 3 characters
beside 80 of metrics); `fit` decides first, and the table is drawn with these widths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

GAP = 2  # columns between two columns, as rich's Table(box=None, pad_edge=False) draws them


class Column:
    """A column as `fit` treats it: `kind` is "fixed" (always whole), "optional" (dropped
    when the width is short, those with the lowest `rank` first) or "flex" (takes what
    is left, at least `least`; cut, then dropped, those with the lowest `rank` first).
    `most`: a fixed column's cap (a long name is cut there)."""

    __slots__ = ("kind", "least", "most", "name", "rank")

    def __init__(
        self, name: str, kind: str = "fixed", rank: int = 0, least: int = 0, most: int = 0
    ) -> None:
        self.name, self.kind, self.rank, self.least, self.most = name, kind, rank, least, most


def cut(text: str, width: int) -> str:
    """`text` in `width` characters, ending in an ellipsis where it was cut."""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + "…" if width > 0 else ""


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> dict[int, int]:
    """Column index -> its width on a screen `width` columns wide, for the columns shown."""
    natural = [max([len(c.name), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]
    for i, c in enumerate(columns):
        if c.most:
            natural[i] = min(natural[i], max(c.most, len(c.name)))
    shown = set(range(len(columns)))

    def needed() -> int:
        least = sum(
            min(natural[i], columns[i].least) if columns[i].kind == "flex" else natural[i]
            for i in shown
        )
        return least + GAP * (len(shown) - 1)

    # Optional columns first, then flex ones, each lowest rank first, until the rest fits.
    droppable = sorted(
        (i for i, c in enumerate(columns) if c.kind != "fixed"),
        key=lambda i: (columns[i].kind == "flex", columns[i].rank),
    )
    for i in droppable:
        if needed() <= width:
            break
        shown.discard(i)
    widths = {i: natural[i] for i in sorted(shown)}
    flex = sorted((i for i in shown if columns[i].kind == "flex"), key=lambda i: -columns[i].rank)
    room = width - sum(natural[i] for i in shown if i not in flex) - GAP * (len(shown) - 1)
    # Each flex column its floor; then the rest to the highest rank first.
    for i in flex:
        widths[i] = min(natural[i], columns[i].least)
    room -= sum(widths[i] for i in flex)
    for i in flex:
        more = max(0, min(natural[i] - widths[i], room))
        widths[i] += more
        room -= more
    return widths


def draw(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    width: int,
    styled: int | None = None,
    style: Callable[[str], str] | None = None,
) -> Table:
    """The rich table of `rows` at `width` columns, as `fit` shapes it, each cell cut to its
    column's width; the cells of column `styled` in `style(cell)` (a state's colour)."""
    from rich.table import Table
    from rich.text import Text

    widths = fit(columns, rows, width)
    table = Table(box=None, header_style="bold", pad_edge=False)
    for n, w in widths.items():
        table.add_column(columns[n].name, width=w, no_wrap=True, overflow="ellipsis")
    for row in rows:
        cells = {n: Text(cut(row[n], w)) for n, w in widths.items()}
        if styled is not None and style is not None and styled in cells:
            cells[styled].stylize(style(row[styled]))
        table.add_row(*cells.values())
    return table
