"""The README cites only files that exist: a link, or a source path in backticks (relative
to the repository or to the package, as the README writes them), is there to be read."""

from __future__ import annotations

import re

from tests.conftest import REPO

# Written by a run of `make bench`, not kept in the repository.
MADE_BY_RUNS = ("bench/results/",)


def test_every_file_the_readme_cites_exists() -> None:
    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)\)", text)
    paths = re.findall(r"`([\w./-]+/[\w.-]+\.(?:py|md|toml|json|txt|ipynb))`", text)
    cited = {p for p in [*links, *paths] if "://" not in p and not p.startswith(MADE_BY_RUNS)}
    assert cited, "the README cites no file: the patterns are stale"
    missing = [
        p
        for p in sorted(cited)
        if not any((root / p).exists() for root in (REPO, REPO / "src/gpuhop"))
    ]
    assert missing == []
