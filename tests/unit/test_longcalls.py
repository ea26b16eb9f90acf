"""The bound on requests that hold a server thread for long (gpuhop.agent.services.longcalls)."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from gpuhop.agent.errors import ApiError
from gpuhop.agent.services.longcalls import LongCalls


def test_a_user_past_their_share_and_everyone_past_the_total_are_refused_until_one_ends():
    calls = LongCalls(per_user=2, total=3)
    with ExitStack() as held:
        held.enter_context(calls.held("alice", "a profile"))
        held.enter_context(calls.held("alice", "a profile"))
        with pytest.raises(ApiError) as alice, calls.held("alice", "an image pull"):
            pass
        assert alice.value.status == 429
        assert alice.value.message.startswith("alice has 2 long requests under way")
        assert "ask for an image pull again once one has ended" in alice.value.message
        held.enter_context(calls.held("bob", "a stack dump"))
        with pytest.raises(ApiError) as carol, calls.held("carol", "a stack dump"):
            pass
        assert carol.value.status == 429
        assert carol.value.message.startswith("the agent has 3 long requests under way")
    # All ended: each may ask again, and a call that fails gives its place back too.
    with pytest.raises(RuntimeError), calls.held("carol", "a profile"):
        raise RuntimeError("py-spy failed")
    with calls.held("carol", "a profile"), calls.held("carol", "a profile"):
        pass
