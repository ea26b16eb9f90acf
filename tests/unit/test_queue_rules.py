"""The queue's pure rules: dependencies' verdicts, end classes, retry policy, time limits."""

from __future__ import annotations

import signal

import pytest

from gpuhop.agent.jobs.after import judge
from gpuhop.agent.jobs.endings import classify
from gpuhop.api import EndClass, JobState, RetryOn, format_seconds, parse_duration

Q, R, S, F, C = (JobState.queued, JobState.running, JobState.succeeded, JobState.failed,
                 JobState.cancelled)  # fmt: skip


def test_an_after_ok_job_waits_for_all_and_is_cancelled_by_the_first_that_did_not_succeed():
    assert judge(["a", "b"], False, {"a": (S, "succeeded"), "b": (R, None)}).waiting_for == ("b",)
    assert judge(["a", "b"], False, {"a": (S, "succeeded"), "b": (S, "succeeded")}).ready
    bad = judge(["a", "b"], False, {"a": (R, None), "b": (F, "oom-gpu")})
    assert not bad.ready
    assert bad.cancel_reason == (
        "cancelled before it started: job b, which it runs after, failed (oom-gpu)"
    )
    # A dependency queued again for a retry has not ended yet.
    assert judge(["a"], False, {"a": (Q, None)}).waiting_for == ("a",)


def test_an_after_any_job_runs_however_they_ended():
    assert judge(["a", "b"], True, {"a": (F, "app-error"), "b": (C, "cancelled")}).ready
    assert not judge(["a", "b"], True, {"a": (F, "app-error"), "b": (R, None)}).ready


@pytest.mark.parametrize(
    ("state", "exit_code", "sig", "log", "expected"),
    [
        (S, 0, None, "", EndClass.succeeded),
        (F, 3, None, "Traceback ... ValueError", EndClass.app_error),
        (F, 1, None, "torch.OutOfMemoryError: CUDA out of memory.", EndClass.oom_gpu),
        (F, 1, None, "ResourceExhaustedError: OOM when allocating tensor", EndClass.oom_gpu),
        (F, 1, None, "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED", EndClass.oom_gpu),
        (F, None, signal.SIGKILL, "", EndClass.killed),
        (F, None, signal.SIGTERM, "", EndClass.killed),
        (F, None, signal.SIGSEGV, "", EndClass.app_error),  # its own crash
        (C, None, signal.SIGTERM, "", EndClass.cancelled),
        (JobState.lost, None, None, "", EndClass.lost),
    ],
)
def test_classes(tmp_path, state, exit_code, sig, log, expected):
    (tmp_path / "log").write_text(log)
    assert classify(state, exit_code=exit_code, sig=sig, log=tmp_path / "log") == expected


def test_a_sigkill_is_oom_host_only_when_the_cgroup_counted_one(tmp_path):
    log = tmp_path / "log"
    kill = signal.SIGKILL
    assert classify(F, exit_code=None, sig=kill, log=log, oom_killed=True) == EndClass.oom_host
    assert classify(F, exit_code=None, sig=kill, log=log, stopped_class="timeout") == (
        EndClass.timeout
    )


def test_retry_on():
    infra = {e for e in EndClass if RetryOn.infra.retries(e)}
    assert infra == {EndClass.lost, EndClass.oom_host, EndClass.killed, EndClass.gpu_fault}
    anything = {e for e in EndClass if RetryOn.any.retries(e)}
    assert anything == infra | {EndClass.app_error, EndClass.oom_gpu}


@pytest.mark.parametrize(
    ("text", "seconds", "shown"),
    [("6h", 21600, "6h"), ("90m", 5400, "1h30m"), ("30s", 30, "30s"), ("45", 45, "45s"),
     ("2d", 172800, "48h"), ("1.5h", 5400, "1h30m"), ("61s", 61, "61s")],
)  # fmt: skip
def test_durations(text, seconds, shown):
    assert parse_duration(text) == seconds
    assert format_seconds(seconds) == shown


@pytest.mark.parametrize("text", ["", "soon", "-5m", "0", "8d", "5 hours"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration(text)
