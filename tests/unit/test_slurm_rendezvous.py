"""How a Slurm gang's ports are chosen from what each node says (the nodes' answers are the
seam: the real ones come from an `srun` step, tests/slurm_backend/test_slurm_gang.py)."""

from __future__ import annotations

import socket

import pytest

from gpuhop.backends.slurm import rendezvous
from gpuhop.backends.slurm.rendezvous import RendezvousError, answer, base_port, choose

RANGE = (30000, 30999)


def nodes(busy: dict[str, set[int]], unresolved: dict[str, dict[str, str]] | None = None):
    """A probe: each node of `busy` answers that all the asked ports but its own are free."""
    asked: list[list[int]] = []

    def probe(check):
        asked.append(check["ports"])
        return [
            {
                "node": node,
                "free": [p for p in check["ports"] if p not in taken],
                "unresolved": (unresolved or {}).get(node, {}),
            }
            for node, taken in busy.items()
        ]

    return probe, asked


def test_the_first_choice_when_it_is_free_everywhere():
    probe, asked = nodes({"n1": set(), "n2": set()})
    start = base_port("812", RANGE)
    assert choose("812", 2, ["10.0.0.1", "10.0.0.2"], RANGE, probe) == ([start, start + 1], [])
    assert len(asked) == 1


def test_a_port_taken_on_one_node_is_avoided_on_all():
    start = base_port("812", RANGE)
    probe, _ = nodes({"n1": set(), "n2": {start + 1}})
    ports, avoided = choose("812", 2, ["a", "b"], RANGE, probe)
    assert ports == [start, start + 2]
    assert avoided == [f"{start + 1} on n2"]


def test_a_window_with_too_few_free_ports_is_followed_by_the_next():
    start = base_port("9", RANGE)
    window = set(rendezvous.candidates(start, rendezvous.WINDOW, RANGE))
    probe, asked = nodes({"n1": window - {start + 3}, "n2": set()})
    ports, _ = choose("9", 2, ["a"], RANGE, probe)
    assert len(asked) == 2 and not set(ports) & window


def test_none_free_anywhere_says_what_to_do():
    probe, asked = nodes({"n1": set(range(RANGE[0], RANGE[1] + 1))})
    with pytest.raises(RendezvousError, match=r"no 2 ports of 30000-30999 are free on every node"):
        choose("9", 2, ["a"], RANGE, probe)
    assert len(asked) == rendezvous.ROUNDS
    with pytest.raises(RendezvousError, match="3 workers need 3 ports; the range 30000-30001"):
        choose("9", 3, ["a"], (30000, 30001), probe)


def test_a_peer_address_a_node_cannot_resolve_is_named():
    probe, _ = nodes({"n1": set(), "n2": set()}, {"n2": {"n1": "Name or service not known"}})
    with pytest.raises(RendezvousError, match="node n2 cannot resolve its peer's address n1"):
        choose("9", 2, ["n1", "n2"], RANGE, probe)


def test_a_node_answers_what_it_can_bind_and_resolve():
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        got = answer({"ports": [taken], "peers": ["127.0.0.1", "no-such-host.invalid"]})
    assert got["free"] == []
    assert list(got["unresolved"]) == ["no-such-host.invalid"]
