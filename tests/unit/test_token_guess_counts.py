"""Wrong tokens per client address (`TokenGuesses`), on a clock the test moves."""

from __future__ import annotations

from gpuhop.agent.server.guesses import TokenGuesses
from tests.unit.test_agent_logs import Clock


def test_an_address_is_held_for_a_window_after_its_limit_of_wrong_tokens():
    clock = Clock()
    guesses = TokenGuesses(limit=3, window=60.0, clock=clock)
    assert [guesses.wrong("10.0.0.1") for _ in range(2)] == [False, False]
    assert guesses.held("10.0.0.1") is None
    clock.now += 10
    assert guesses.wrong("10.0.0.1")  # the third within the window: held from now
    assert guesses.held("10.0.0.1") == 60.0
    assert guesses.held("10.0.0.2") is None  # another address is not
    clock.now += 59.5
    assert guesses.held("10.0.0.1") == 0.5
    clock.now += 0.5
    assert guesses.held("10.0.0.1") is None
    # Starting afresh: as many wrong tokens again before the next hold.
    assert [guesses.wrong("10.0.0.1") for _ in range(3)] == [False, False, True]


def test_wrong_tokens_of_a_past_window_are_forgotten():
    clock = Clock()
    guesses = TokenGuesses(limit=3, window=60.0, clock=clock)
    guesses.wrong("10.0.0.1")
    guesses.wrong("10.0.0.1")
    clock.now += 60
    assert [guesses.wrong("10.0.0.1") for _ in range(2)] == [False, False]
    assert guesses.held("10.0.0.1") is None


def test_many_addresses_keep_only_the_latest_few():
    guesses = TokenGuesses(limit=3, window=60.0, addresses=100, clock=Clock())
    for n in range(10_000):
        guesses.wrong(f"10.0.{n // 256}.{n % 256}")
    assert len(guesses._tallies) == 100
