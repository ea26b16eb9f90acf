"""Wrong tokens sent to a team agent's TLS listener, a real agent on loopback: an address that
sends too many is answered 429 (Retry-After) for a while, where its request has no valid
token; a valid token from it still gets in; other addresses and the owner's Unix socket are
not affected; and the agent logs it once, not once a token.

Clients come from loopback addresses of their own (127.0.0.x), as clients on other hosts would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from gpuhop.client.transport.tls import fetch_certificate, pinned_context
from tests.conftest import Agent, wait_until
from tests.team import team_agent, team_tokens

HELD = "wrong tokens from {} within"


def client(agent: Agent, source: str, token: str | None) -> httpx.Client:
    """An HTTPS client of `agent` from the loopback address `source`, pinning its certificate."""
    pem, _ = fetch_certificate(agent.listener.url)
    transport = httpx.HTTPTransport(local_address=source, verify=pinned_context(pem))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(
        base_url=agent.listener.url, transport=transport, headers=headers, timeout=60
    )


def held_lines(agent: Agent, source: str) -> list[str]:
    text = agent.paths.logfile.read_text(errors="replace")
    return [line for line in text.splitlines() if HELD.format(source) in line]


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Agent, dict[str, str]]]:
    """A team agent that holds an address back after 3 wrong tokens, for the default minute."""
    root = Path(tmp_path_factory.mktemp("guesses"))
    with team_agent(root, 0, config="auth_fail_limit = 3\n") as agent:
        yield agent, team_tokens(agent)


def test_an_address_that_sent_too_many_wrong_tokens_is_held_but_a_valid_one_gets_in(strict):
    agent, tokens = strict
    with client(agent, "127.0.0.4", tokens["alice"]) as alice:
        assert alice.get("/v1/agent").status_code == 200
        for n in range(3):
            wrong = alice.get("/v1/jobs", headers={"Authorization": f"Bearer gpuhop_guess{n}"})
            assert wrong.status_code == 401, wrong.text
        for headers in ({"Authorization": "Bearer gpuhop_guess3"}, {"Authorization": ""}):
            held = alice.get("/v1/agent", headers=headers)
            assert held.status_code == 429, held.text
            assert 1 <= int(held.headers["retry-after"]) <= 60
            assert held.json()["code"] == "too_many"
            assert held.json()["message"].startswith(
                "too many requests with a wrong token came from this address: the agent"
                " refuses its requests without a valid token for "
            )
        # A valid token from the held address (a NAT's, say: another user's) still gets in.
        assert alice.get("/v1/agent").json()["user"] == "alice"
    # Said once in the agent's log, for the address, not once a request.
    # A WebSocket's handshake without a valid token too (a forwarded port's).
    pem, _ = fetch_certificate(agent.listener.url)
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(
            agent.listener.url.replace("https://", "wss://") + "/v1/jobs/x/ports/8888",
            ssl=pinned_context(pem),
            additional_headers={"Authorization": "Bearer gpuhop_guess4"},
            source_address=("127.0.0.4", 0),
            open_timeout=10,
        )
    assert refused.value.response.status_code == 429
    [line] = held_lines(agent, "127.0.0.4")
    assert "3 wrong tokens from 127.0.0.4 within 60s: its requests without a valid" in line
    # Another address, with its own count of wrong tokens, and the owner's socket answer.
    with client(agent, "127.0.0.5", tokens["bob"]) as bob:
        assert bob.get("/v1/agent").json()["user"] == "bob"
        assert bob.get("/v1/jobs", headers={"Authorization": "Bearer gpuhop_x"}).status_code == 401
        assert bob.get("/v1/agent").status_code == 200
    with agent.client() as owner:
        assert owner.info().admin


def test_an_address_is_let_in_again_once_its_window_is_over(tmp_path):
    """A window of a second: wrong tokens are sent until the address is held (however slowly
    they go); once the window is over, a wrong token is a 401 again, not a 429."""
    config = "auth_fail_limit = 2\nauth_fail_window_seconds = 1\n"
    with team_agent(tmp_path, 0, config=config) as agent:
        token = team_tokens(agent)["alice"]
        with client(agent, "127.0.0.6", token) as alice:
            answers = []

            def held() -> bool:
                bad = {"Authorization": "Bearer gpuhop_guess"}
                answers.append(alice.get("/v1/agent", headers=bad).status_code)
                return answers[-1] == 429

            wait_until(held, timeout=60, interval=0)
            assert set(answers) == {401, 429}, answers
            wait_until(lambda: not held() and answers[-1] == 401, timeout=60)
            assert alice.get("/v1/agent").json()["user"] == "alice"
        assert held_lines(agent, "127.0.0.6")
