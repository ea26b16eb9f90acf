"""A request body kept as the pieces that arrived (agent.server.protocol._Pieces): uvicorn
reads it as bytes(body) and len(body)."""

from __future__ import annotations

from gpuhop.agent.server.protocol import _Pieces


def test_one_piece_is_handed_on_without_a_copy_and_several_are_joined() -> None:
    body = _Pieces()
    assert bytes(body) == b"" and len(body) == 0
    piece = b"x" * 100_000
    body.add(piece)
    assert bytes(body) is piece  # no copy of an upload's bytes on the event loop
    body.add(b"yz")
    assert bytes(body) == piece + b"yz" and len(body) == 100_002
