"""Why a queued GPU job waits (`gpuhop.agent.jobs.waits`): its place in line, what it needs,
who holds it, and only its owner's own jobs named."""

from __future__ import annotations

from gpuhop.agent.jobs.placement import Holding, Placement, plan
from gpuhop.agent.jobs.waits import ordinal, said
from tests.placing import queued

TWO = {0: 8192, 1: 8192}


def test_each_waiting_job_gets_its_place_in_line_what_it_needs_and_the_holders():
    held = [Holding("h1", (0,), name="live2"), Holding("h2", (1,), name=None)]
    pending = [
        queued("late", 1, created_at=3.0),
        queued("first", 2, created_at=1.0),
        queued("cpu", 0, created_at=2.0),
        queued("urgent", 1, priority=5, created_at=9.0),
    ]
    placed = plan(pending, TWO, held)
    assert placed == [Placement("cpu", ())]
    words = said(pending, placed, held, TWO, {})
    # Priority first, then age; the CPU job started and takes no place.
    assert words == {
        "urgent": "1st in line; waits for 1 GPU; held by live2, h2",
        "first": "2nd in line; waits for 2 GPUs; held by live2, h2",
        "late": "3rd in line; waits for 1 GPU; held by live2, h2",
    }


def test_a_job_placed_in_the_same_pass_holds_its_gpu_and_a_share_names_only_its_gpus():
    gpus = {0: 8192, 1: 2048}
    pending = [
        queued("big", 1, created_at=1.0, name="trainer"),
        queued("share", created_at=2.0, gpu_memory_mb=4096),
    ]
    held = [Holding("small", (1,), 1024, name="notebook")]
    placed = plan(pending, gpus, held)
    assert placed == [Placement("big", (0,))]
    # GPU 1 is too small for the share: its holder is not what the share waits for.
    assert said(pending, placed, held, gpus, {}) == {
        "share": "1st in line; waits for a 4 GiB share of a GPU; held by trainer"
    }


def test_other_users_jobs_are_counted_never_named_and_limits_keep_their_own_words():
    held = [
        Holding("a1", (0,), owner="alice", name="alice-run"),
        Holding("b1", (1,), owner="bob", name="secret-project"),
    ]
    pending = [
        queued("a2", 1, created_at=1.0, owner="alice"),
        queued("b2", 1, created_at=2.0, owner="bob"),
        queued("a3", 1, created_at=3.0, owner="alice"),
    ]
    limited = {"a2": "alice holds 1 GPU(s) ...; the agent's limit is 1 per user at once"}
    words = said(pending, [], held, TWO, limited)
    assert "a2" not in words  # the scheduler serves the limit's reason for it
    assert words["b2"] == "1st in line; waits for 1 GPU; held by secret-project, another user's job"
    assert words["a3"] == "2nd in line; waits for 1 GPU; held by alice-run, another user's job"
    assert "secret-project" not in words["a3"]
    many = [Holding(f"x{n}", (0,), owner="bob") for n in range(2)] + [
        Holding(f"y{n}", (1,), owner="alice", name=f"mine{n}") for n in range(5)
    ]
    assert said([pending[2]], [], many, TWO, {})["a3"].endswith(
        "held by mine0, mine1, mine2, +2 more, 2 jobs of other users"
    )


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "101st",
        "111th",
    ]
