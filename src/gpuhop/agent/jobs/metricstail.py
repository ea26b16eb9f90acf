"""Runs in the agent: the latest metrics of a job's metrics file (its answers, notifications),
of each source they came from, and the device memory the job last reported."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

METRICS_TAIL_BYTES = 16 * 1024
# Keys of a record that only reports device memory (the start-up hook's, at the job's exit).
MEMORY_ONLY = {"time", "memory_mb", "memory_peak_mb"}
# The key that marks where a fit is within its epoch (gpuhop.runtime.callbacks.Progress): no
# metrics of its own, for the status line under `gpuhop run`.
PROGRESS = "progress"
# The key that names a record's source (gpuhop.runtime.summaries.SOURCE_KEY).
SOURCE = "source"
# A record nested deeper than this is not a metrics record (those are flat: `{step, epoch,
# name: value}`) and is skipped: one nested near the interpreter's recursion limit would fail
# each later step that walks it (masking, storing, answering).
MAX_RECORD_DEPTH = 32


def tail_records(path: Path) -> list[dict[str, object]]:
    """The complete JSON records at the end of a job's metrics file, newest first."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - METRICS_TAIL_BYTES))
            tail = f.read()
    except OSError:
        return []
    return parse_records(reversed(tail.splitlines()))


def parse_records(lines: Iterable[bytes]) -> list[dict[str, object]]:
    """The JSON objects among metrics-file lines, in order; anything else is skipped (a job
    may write what it likes to its metrics file, a line nested past the interpreter's
    recursion limit too)."""
    records = []
    for line in lines:
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict) and _shallow(value):
            records.append(value)
    return records


def _shallow(record: dict[str, object]) -> bool:
    """Whether `record` is nested at most MAX_RECORD_DEPTH deep (walked without recursion)."""
    stack: list[tuple[object, int]] = [(record, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_RECORD_DEPTH:
            return False
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return True


def latest_metrics(path: Path) -> dict[str, object] | None:
    """The last complete JSON line of a job's metrics file that has metrics of its own (a
    record of device memory alone does not replace them)."""
    return latest_of(tail_records(path))


def latest_of(records: list[dict[str, object]]) -> dict[str, object] | None:
    """`latest_metrics` of records read by `tail_records` (newest first). A record that
    names its source (a Keras fit's, a tf.summary writer's: see gpuhop.runtime.summaries)
    is shown with the records just before it of the same source and step: a program writes
    each tf.summary scalar on its own, one step's together."""
    latest: dict[str, object] | None = None
    for record in records:
        if set(record) <= MEMORY_ONLY or PROGRESS in record:
            continue
        if latest is None:
            latest = dict(record)
            if SOURCE not in record:
                break
            continue
        if (record.get(SOURCE), record.get("step")) != (latest[SOURCE], latest.get("step")):
            break
        latest = {**record, **latest}
    return latest


def by_source(records: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    """The latest metrics (as `latest_of` gives them) of each source the records name,
    newest first: what a program that fits, then trains on in a custom loop, did in each."""
    sources = dict.fromkeys(r[SOURCE] for r in records if isinstance(r.get(SOURCE), str))
    out = {}
    for source in sources:
        latest = latest_of([r for r in records if r.get(SOURCE) == source])
        if latest is not None:
            out[str(source)] = latest
    return out


def memory_peak_of(records: list[dict[str, object]]) -> float | None:
    """The most device memory the job's framework has had in use, in MB, as the job last
    reported it (a framework's peak only grows), or None if it reported none; of records
    read by `tail_records`."""
    for record in records:
        peak = record.get("memory_peak_mb")
        if isinstance(peak, (int, float)) and not isinstance(peak, bool):
            return float(peak)
    return None
