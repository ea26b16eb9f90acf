"""Runs in the agent: whether a queued job's dependencies (`run --after`) let it start.

Pure: the caller passes the dependencies' states, so the rule is tested without an agent.
A dependency that ends in any way releases an `--after-any` job; an `--after-ok` job (the
default) starts only once all of them succeeded, and is cancelled, naming the first that did
not, as soon as one ends otherwise. A dependency queued again for a retry has not ended.
Only jobs that exist can be named at submit, and an existing job's dependencies never
change, so the dependencies form no cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuhop.api import JobState


@dataclass(frozen=True)
class Verdict:
    ready: bool  # every dependency let it start
    waiting_for: tuple[str, ...] = ()  # those that have not ended yet
    cancel_reason: str | None = None  # an after-ok job whose dependency did not succeed


def judge(
    after: Sequence[str],
    after_any: bool,
    states: Mapping[str, tuple[JobState, str | None]],
) -> Verdict:
    """`states`: each dependency's state and end class; one missing (removed) has ended."""
    waiting: list[str] = []
    for dep in after:
        state, end_class = states.get(dep, (JobState.lost, None))
        if not state.finished:
            waiting.append(dep)
        elif not after_any and state is not JobState.succeeded:
            how = end_class or state.value
            return Verdict(
                ready=False,
                cancel_reason=f"cancelled before it started: job {dep}, which it runs"
                f" after, {state.value} ({how})",
            )
    return Verdict(ready=not waiting, waiting_for=tuple(waiting))
