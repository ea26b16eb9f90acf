"""A running job whose log alone grew gets its kept JSON with the new size's digits put in
(agent.services.listing._around): the same bytes as serialising the whole JobInfo again."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import TypeAdapter

from gpuhop.agent.services.listing import _PROBE, _around
from gpuhop.api import JobInfo, JobState

INFO = TypeAdapter(JobInfo)


def job(**more: object) -> JobInfo:
    return JobInfo(
        id="j1",
        name=None,
        state=JobState.running,
        command=["python", "train.py"],
        gpus=0,
        gpu_ids=[],
        env={"log_size": "1"},  # the field's name as a user's key: not taken for it
        priority=0,
        attempt=1,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        started_at=None,
        ended_at=None,
        exit_code=None,
        signal=None,
        reason=None,
        log_size=5,
        **more,  # type: ignore[arg-type]
    )


def test_the_new_size_in_the_kept_json_is_the_json_of_the_new_info() -> None:
    info = job(latest_metrics={"log_size": 5, "step": 3})
    before, after = _around(info)
    for size in (0, 7, 123_456_789_012):
        new = info.model_copy(update={"log_size": size})
        assert before + b"%d" % size + after == INFO.dump_json(new, by_alias=True)


def test_a_json_where_the_probe_shows_up_twice_is_made_again_instead() -> None:
    assert _around(job(latest_metrics={"log_size": _PROBE})) == ()
