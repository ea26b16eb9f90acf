"""A team agent for the tests: a TLS listener on loopback beside the owner's socket, and
tokens for two users (alice, bob) and an admin (carol)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import Agent


@contextmanager
def team_agent(root: Path, gpus: int, *args: str, config: str | None = None) -> Iterator[Agent]:
    """A started agent with a TLS listener on 127.0.0.1 (any port), stopped on the way out;
    `config` is written as its agent.toml."""
    if config is not None:
        (root / "home").mkdir(parents=True, exist_ok=True)
        (root / "home" / "agent.toml").write_text(config)
    agent = Agent(root / "home", root / "cache", gpus, args=("--listen", "127.0.0.1:0", *args))
    try:
        yield agent.start()
    finally:
        agent.shutdown()


def team_tokens(agent: Agent) -> dict[str, str]:
    """Tokens for alice and bob (users) and carol (an admin), made by the owner."""
    with agent.client() as owner:
        return {
            "alice": owner.create_token("alice").token,
            "bob": owner.create_token("bob").token,
            "carol": owner.create_token("carol", admin=True).token,
        }
