"""The agent's tree reader (gpuhop.agent.storage.treefile) reads what json.loads reads, one
entry at a time, whatever the spacing, escapes and read boundaries; and refuses what is not
a tree, saying where."""

from __future__ import annotations

import io
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhop.agent.storage import treefile
from gpuhop.agent.storage.treefile import TreeFileError, read_entries

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
ENTRIES = st.lists(VALUES, max_size=12)


@settings(max_examples=200)
@given(
    entries=ENTRIES,
    indent=st.sampled_from([None, 0, 2]),
    ascii_only=st.booleans(),
    read=st.integers(1, 64),
)
def test_entries_read_in_pieces_are_what_json_loads_reads(entries, indent, ascii_only, read):
    raw = json.dumps({"entries": entries}, indent=indent, ensure_ascii=ascii_only).encode()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(treefile, "READ", read)
        got = list(read_entries(io.BytesIO(raw)))
    assert got == json.loads(raw)["entries"]


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"", "expected a JSON object, found the end"),
        (b"[]", "expected a JSON object, found '['"),
        (b'{"entries": [1 2]}', "',' or ']' after an entry"),
        (b'{"entries": [1], "other": 2}', "other: a tree has no such field"),
        (b'{"entries": [{"a": 1}', "',' or ']' after an entry, found the end"),
        (b'{"entries": [{"a": tru}]}', "entries.0 is not valid JSON"),
        (b'{"entries": []}}', "more follows its end"),
        (b'{"entries": ["\xff"]}', "not valid UTF-8"),
    ],
)
def test_what_is_not_a_tree_is_refused_saying_where(raw, words):
    with pytest.raises(TreeFileError, match=re.escape(words)):
        list(read_entries(io.BytesIO(raw)))


def test_an_entry_longer_than_any_real_one_is_refused_without_reading_on(monkeypatch):
    monkeypatch.setattr(treefile, "READ", 1024)
    raw = b'{"entries": [{"path": "' + b"a" * (treefile.MAX_ENTRY_CHARS + 10) + b'", ...'
    f = io.BytesIO(raw + b" " * (10 << 20))
    with pytest.raises(TreeFileError, match=r"entries\.0 is not valid JSON"):
        list(read_entries(f))
    assert f.tell() <= treefile.MAX_ENTRY_CHARS + 3 * 1024
