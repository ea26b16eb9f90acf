"""Runs in the agent: a user's secrets masked (`***`) in what the agent shows and keeps of
their jobs besides the log (which the job's leader masks as it is written: see
gpuhop.backends.local.mask): the metrics records a job writes, as answers carry them (`show`,
`ps`, the dashboard, `logs --metrics`) and as its metrics file is kept once an attempt ends,
and the payloads of its notifications.

A metrics file is JSON lines the job writes itself, so a secret can be anywhere in a record:
a string value, a key, a number spelled with its digits. A record is masked as the JSON
value it is: every string (keys too) with each value replaced, and a number whose JSON text
holds a value replaced by the string `***` (so no secret of digits survives as a number).
Values are masked whole, longest first, as the agent masks its other texts (a fetch's
error: `AgentContext.masked`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

MASK = "***"


def ordered(values: Iterable[str]) -> list[str]:
    """The values to mask, without empty ones (an empty value masks nothing), longest first
    (so a value inside a longer one does not break it)."""
    return sorted({v for v in values if v}, key=len, reverse=True)


def mask_text(text: str, values: list[str]) -> str:
    """`text` with each of `values` (as `ordered` gives them) shown as ***."""
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    return text


def mask_json(value: object, values: list[str]) -> object:
    """A JSON value (a metrics record, a notification's payload) with `values` masked in
    every string and key, and every number whose JSON text holds one shown as ***."""
    if not values:
        return value
    if isinstance(value, str):
        return mask_text(value, values)
    if isinstance(value, dict):
        return {
            mask_text(k, values) if isinstance(k, str) else k: mask_json(v, values)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [mask_json(v, values) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        text = json.dumps(value)
        return MASK if any(v in text for v in values) else value
    return value


def mask_records(records: list[dict[str, object]], values: list[str]) -> list[dict[str, object]]:
    """Metrics records with `values` masked (see `mask_json`)."""
    if not values:
        return records
    return [mask_json(r, values) for r in records]  # type: ignore[misc]


def _needles(values: list[str]) -> list[bytes]:
    """How each value may be spelled in a JSON line: as it is, and as JSON escapes it (with
    and without ASCII escapes)."""
    found = set()
    for value in values:
        found.add(value.encode("utf-8", "surrogateescape"))
        for ascii_only in (True, False):
            found.add(
                json.dumps(value, ensure_ascii=ascii_only)[1:-1].encode("utf-8", "surrogateescape")
            )
    return sorted(found, key=len, reverse=True)


def mask_line(line: bytes, values: list[str], needles: list[bytes]) -> bytes:
    """One line of a metrics file with `values` masked: a JSON record as `mask_json` masks
    it (written again as JSON), anything else with each value's bytes replaced."""
    if not any(n in line for n in needles):
        return line
    end = b"\n" if line.endswith(b"\n") else b""
    try:
        return json.dumps(mask_json(json.loads(line), values)).encode() + end
    except (ValueError, RecursionError):  # not JSON, or nested past the recursion limit
        for needle in needles:
            line = line.replace(needle, MASK.encode())
        return line


def mask_file(path: Path, values: Iterable[str]) -> bool:
    """Keep `path` (a job's metrics file, after an attempt) with `values` masked, where it
    holds any: written anew beside it, with its owner and mode, and renamed over it, so that
    a crash leaves the old file or the new one whole. True if it changed."""
    wanted = ordered(values)
    if not wanted:
        return False
    try:
        data = path.read_bytes()
        st = path.stat()
    except OSError:
        return False
    needles = _needles(wanted)
    if not any(n in data for n in needles):
        return False
    masked = b"".join(mask_line(line, wanted, needles) for line in data.splitlines(True))
    tmp = path.with_name(f".{path.name}.masking")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(masked)
            f.flush()
            os.fsync(f.fileno())
        if os.geteuid() == 0:  # a team job's file is its user's: the next attempt writes it
            os.chown(tmp, st.st_uid, st.st_gid)
        os.chmod(tmp, st.st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return True
