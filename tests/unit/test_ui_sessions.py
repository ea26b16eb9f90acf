"""The dashboard's login codes and sessions, and the GPU history, with the clock as a parameter."""

from __future__ import annotations

from gpuhop.agent.callers import Caller
from gpuhop.agent.host.gpuhistory import GpuHistory
from gpuhop.agent.ui.sessions import (
    CODE_TTL,
    MAX_CODES_PER_USER,
    MAX_SESSIONS_PER_USER,
    SESSION_TTL,
    UiSessions,
)
from gpuhop.backends.base import Usage

ALICE = Caller("alice", admin=False)
BOB = Caller("bob", admin=False)
OWNER = Caller("root", admin=True)


def test_a_code_logs_in_once_and_only_its_own_caller():
    sessions = UiSessions()
    code, expires = sessions.mint_code(ALICE, now=100.0)
    assert expires == 100.0 + CODE_TTL
    assert len(code) >= 43  # 32 random bytes, base64: 256 bits
    cookie = sessions.redeem(code, ALICE, now=101.0)
    assert cookie is not None and cookie != code
    assert sessions.check(cookie, now=102.0) == ALICE
    assert sessions.redeem(code, ALICE, now=102.0) is None  # spent

    other, _ = sessions.mint_code(ALICE, now=100.0)
    # Presented with someone else's credentials: refused, and spent all the same.
    assert sessions.redeem(other, OWNER, now=101.0) is None
    assert sessions.redeem(other, ALICE, now=101.0) is None


def test_codes_and_sessions_expire():
    sessions = UiSessions()
    code, expires = sessions.mint_code(ALICE, now=0.0)
    assert sessions.redeem(code, ALICE, now=expires) is None
    code, _ = sessions.mint_code(ALICE, now=0.0)
    cookie = sessions.redeem(code, ALICE, now=1.0)
    assert cookie is not None
    assert sessions.check(cookie, now=SESSION_TTL) == ALICE
    assert sessions.check(cookie, now=1.0 + SESSION_TTL) is None
    assert sessions.check("made-up", now=2.0) is None


def test_logging_out_ends_a_session():
    sessions = UiSessions()
    code, _ = sessions.mint_code(OWNER, now=0.0)
    cookie = sessions.redeem(code, OWNER, now=0.0)
    assert cookie is not None
    sessions.end(cookie)
    assert sessions.check(cookie, now=1.0) is None


def test_only_digests_are_kept_and_outstanding_codes_are_bounded():
    sessions = UiSessions()
    codes = [sessions.mint_code(ALICE, now=i / 10)[0] for i in range(MAX_CODES_PER_USER + 10)]
    held = repr(sessions.__dict__)
    assert not any(code in held for code in codes)
    assert len(sessions._codes) == MAX_CODES_PER_USER
    assert sessions.redeem(codes[0], ALICE, now=20.0) is None  # the oldest made room
    assert sessions.redeem(codes[-1], ALICE, now=20.0) is not None


def test_one_users_churn_evicts_only_their_own_codes_and_sessions():
    sessions = UiSessions()
    alices_code, _ = sessions.mint_code(ALICE, now=0.0)
    alices_cookie = sessions.redeem(sessions.mint_code(ALICE, now=0.0)[0], ALICE, now=0.0)
    bobs = []
    for i in range(MAX_SESSIONS_PER_USER * 5):  # far past the caps, all in a second
        code, _ = sessions.mint_code(BOB, now=1 + i / 1000)
        sessions.mint_code(BOB, now=1 + i / 1000)  # and a pending code left each time
        bobs.append(sessions.redeem(code, BOB, now=1 + i / 1000))
    assert len(sessions._sessions) == MAX_SESSIONS_PER_USER + 1
    assert len(sessions._codes) <= MAX_CODES_PER_USER + 1
    assert alices_cookie is not None and sessions.check(alices_cookie, now=2.0) == ALICE
    assert sessions.redeem(alices_code, ALICE, now=2.0) is not None
    assert sessions.check(bobs[0] or "", now=2.0) is None  # Bob's oldest made room
    assert sessions.check(bobs[-1] or "", now=2.0) == BOB


def test_gpu_history_keeps_the_last_hour_per_gpu():
    history = GpuHistory(every=5.0, keep=15.0)
    for t in range(5):
        history.record(float(t), {0: Usage(t * 100, t), 1: Usage(None, None)})
    series = history.series()
    assert series[0] == {
        "t": [2.0, 3.0, 4.0],
        "memory_used_mb": [200, 300, 400],
        "utilization": [2, 3, 4],
    }
    assert series[1]["memory_used_mb"] == [None, None, None]
