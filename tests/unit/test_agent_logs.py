"""The agent's log: throttled lines, and a rotating file that stdout and stderr follow."""

from __future__ import annotations

import logging
import os

import pytest

from gpuhop.agent.server.logs import FollowingRotatingHandler, Throttle, ThrottleFilter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_throttle_lets_one_through_per_window_and_counts_the_rest():
    clock = Clock()
    throttle = Throttle(window=5.0, clock=clock)
    assert throttle.allow("10.0.0.1") == 0
    assert [throttle.allow("10.0.0.1") for _ in range(1000)] == [None] * 1000
    assert throttle.allow("10.0.0.2") == 0  # another address has its own window
    clock.now += 5
    assert throttle.allow("10.0.0.1") == 1000


def test_throttle_forgets_the_oldest_keys_past_its_size():
    throttle = Throttle(window=5.0, keys=3, clock=Clock())
    for n in range(10):
        throttle.allow(f"10.0.0.{n}")
    assert len(throttle._seen) == 3


def test_throttle_filter_keeps_a_repeated_message_to_one_line(caplog):
    logger = logging.getLogger("gpuhop.test.throttled")
    clock = Clock()
    logger.addFilter(ThrottleFilter(Throttle(window=5.0, clock=clock)))
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for _ in range(100):
            logger.warning("Invalid HTTP request received.")
        clock.now += 6
        logger.warning("Invalid HTTP request received.")
    assert [r.getMessage() for r in caplog.records] == [
        "Invalid HTTP request received.",
        "Invalid HTTP request received. (99 more like it not logged)",
    ]


def test_the_log_rotates_and_the_given_fds_follow_it(tmp_path):
    path = tmp_path / "agent.log"
    stand_in = os.open(tmp_path / "first", os.O_WRONLY | os.O_CREAT)  # stands for stderr
    handler = FollowingRotatingHandler(path, max_bytes=10_000, backups=2, fds=(stand_in,))
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("gpuhop.test.rotated")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        for n in range(2000):
            logger.warning("line %d of a long flood", n)
    finally:
        logger.removeHandler(handler)
        handler.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["agent.log", "agent.log.1", "agent.log.2", "first"]
    assert all((tmp_path / n).stat().st_size <= 10_000 for n in names)
    assert os.fstat(stand_in).st_ino == path.stat().st_ino  # stderr writes to the new file
    os.close(stand_in)


@pytest.fixture(autouse=True)
def _restore_loggers():
    yield
    for name in ("gpuhop.test.throttled", "gpuhop.test.rotated"):
        logging.getLogger(name).filters.clear()
