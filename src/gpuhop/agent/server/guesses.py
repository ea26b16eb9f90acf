"""Runs in the agent: which client addresses of the TCP listener sent too many wrong tokens
lately, and are held back (429) for a while.

A token is 256 random bits, so guessing one is hopeless; what a client that sends wrong
tokens as fast as the agent answers costs is a lookup and a log line each, and what the
operator should hear of is one line, not thousands. So an address that sent `limit` wrong
tokens within `window` seconds is answered 429 (Retry-After) for `window` seconds from then,
unlogged, for every request of it without a valid token; then it starts afresh. A valid token
still gets in: one address may be a NAT's or a reverse proxy's, shared by users whom one
client's stale token must not lock out (and guessing is hopeless anyway). Other addresses are
not affected, nor is the Unix socket (the owner), which has no tokens.

The addresses are kept in an LRU of `addresses` entries, so that many addresses cannot grow
it without bound (one that falls out starts afresh).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

ADDRESSES = 4096


@dataclass
class _Tally:
    since: float  # the first wrong token of this window
    wrong: int = 0
    held_until: float = 0.0  # while the clock is before it, the address is refused


class TokenGuesses:
    """Wrong tokens per client address, and the addresses held back for sending too many."""

    def __init__(
        self,
        limit: int,
        window: float,
        addresses: int = ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limit = limit
        self.window = window
        self.addresses = addresses
        self.clock = clock
        self._tallies: OrderedDict[str, _Tally] = OrderedDict()

    def held(self, address: str) -> float | None:
        """The seconds `address` is still refused for, or None if it is not."""
        tally = self._tallies.get(address)
        if tally is None:
            return None
        left = tally.held_until - self.clock()
        return left if left > 0 else None

    def wrong(self, address: str) -> bool:
        """Count a wrong token from `address`; True if that makes it held back (once a
        window, the moment to tell the operator)."""
        now = self.clock()
        tally = self._tallies.get(address)
        # A hold lasts a window from the last wrong token counted, so once it is over the
        # window it was counted in is over too.
        if tally is None or now - tally.since >= self.window:
            tally = self._tallies[address] = _Tally(since=now)
        self._tallies.move_to_end(address)
        while len(self._tallies) > self.addresses:
            self._tallies.popitem(last=False)
        tally.wrong += 1
        if tally.wrong < self.limit:
            return False
        tally.held_until = now + self.window
        return True
