"""Runs in the agent: tells webhooks that a job started or ended, in the background.

A job's start or end is put on a bounded queue and the caller goes on at once: neither the
supervisor nor the scheduler ever waits for a webhook. Sender threads (as many as there is
work for, up to `senders`) POST each notification; one that fails (no answer within
`timeout`, a refused connection, a 5xx) is tried again after 1, 2, 4 ... seconds, up to
`tries` times, then dropped with a warning. When `max_pending` notifications are waiting (a
webhook down for long), new ones are dropped and logged rather than held without bound; and
one user's jobs may have at most `owner_pending` of them waiting (a quarter of the queue), so
that a user with many jobs and webhooks that never answer cannot fill the queue and have
everyone else's notifications dropped: their new ones are, with one line in the log when
that starts and one when it ends.

A webhook that accepts the connection and never answers holds a sender for `timeout` on
each try: so at most `per_host` notifications go to one host (and port) at once, and at most
`per_owner` of one user's jobs. The others wait in their lanes while the senders serve
everyone else's.

Which hosts a notification may reach is `HostRule`'s call: on a team agent a user must not
be able to make the agent POST to its own listener or to loopback services of other users
of the host (SSRF). See `HostRule` and the README's security section.
"""

from __future__ import annotations

import heapq
import ipaddress
import itertools
import logging
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gpuhop.agent.jobs.records import JobRecord
from gpuhop.api.queue import shown_webhook

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("gpuhop.agent")

SLACK_HOST = "hooks.slack.com"
# Discord's webhooks (https://discord.com/api/webhooks/ID/TOKEN) want `content`, at most
# 2,000 characters; `allowed_mentions` empty: a reason or a name such as "@everyone" pings
# nobody.
DISCORD_HOSTS = frozenset(
    {"discord.com", "discordapp.com", "ptb.discord.com", "canary.discord.com"}
)
DISCORD_MAX = 2000
# Keys of a metrics record that describe it rather than measure the model (when it was
# written, the planned epochs, progress and memory), left out of a notification's text as
# `gpuhop run` leaves them out of its "last metrics" line.
NOT_IN_TEXT = frozenset(
    {"time", "epochs", "memory_mb", "memory_peak_mb", "source", "progress", "epoch_step"}
    | {"epoch_steps", "eta"}
)
# The names of metrics the text shows (Keras's "val_loss", a tf.summary tag "train/loss"). A
# job writes its metrics file as it likes, and the text goes to chat channels (an agent's
# `notify` to the admin's, told of every user's jobs), where a name such as "<!channel>",
# "@all" or a link would ping everyone there or pass for the agent's words. Other names stay
# in the payload's `metrics`, as data.
SHOWN_METRIC_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,63}\Z")


class HostRule:
    """Which hosts notifications may go to.

    With `allowed` (agent.toml's `notify_allowed_hosts`): only those, each `HOST`,
    `HOST:PORT` or `*.DOMAIN`; an admin who lists a loopback or private host allows it.
    Without: any host whose every address is public (not loopback, private, link-local or
    otherwise reserved), checked when the notification is sent, so a name that resolves to
    127.0.0.1 is refused too.
    """

    def __init__(self, allowed: Iterable[str] = ()):
        self.allowed = tuple(a.lower() for a in allowed)

    def listed(self, host: str, port: int) -> bool:
        for entry in self.allowed:
            if entry.startswith("*.") and host.endswith(entry[1:]):
                return True
            # An IPv6 address is listed as in a URL, "[::1]:8080" or "[::1]" (or bare).
            if entry in (host, bracketed(host), f"{bracketed(host)}:{port}"):
                return True
        return False

    def refusal(self, url: str, resolve: bool) -> str | None:
        """Why `url` may not be notified, or None. `resolve`: look the name up as well (a
        sender thread does; a submit checks only what the URL itself says)."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if self.allowed:
            if self.listed(host, port):
                return None
            return (
                f"{bracketed(host)}:{port} is not among the hosts this agent notifies"
                f" (notify_allowed_hosts in its agent.toml: {', '.join(self.allowed)})"
            )
        if host == "localhost" or host.endswith(".localhost"):
            return f"{host} is this host; only an admin can allow it (notify_allowed_hosts)"
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            if not resolve:
                return None
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as e:
                return f"{host} cannot be resolved ({e})"
            addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
        for address in addresses:
            if not address.is_global:
                return (
                    f"{host} is at {address}, a loopback, private or reserved address; only"
                    " an admin can allow it (notify_allowed_hosts in agent.toml)"
                )
        return None


def host_port(url: str) -> str:
    """The host and port `url` goes to, "hooks.slack.com:443"."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{bracketed((parts.hostname or '').lower())}:{port}"


def bracketed(host: str) -> str:
    """`host` as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def payload(
    job: JobRecord, event: str, url: str, metrics: Mapping[str, object] | None
) -> dict[str, Any]:
    """What a webhook is sent of `event` ("started", or the state a job ended in): the
    job's facts as they are now, and a one-line `text`; Slack gets only the text, Discord
    it as its `content`."""
    duration = None
    if job.started_at is not None:
        duration = round((job.ended_at or time.time()) - job.started_at, 3)
    name = f" ({job.spec.name})" if job.spec.name else ""
    text = f"gpuhop: job {job.id}{name} of {job.owner or 'the owner'} {event}"
    if event != "started" and job.reason:
        text += f": {job.reason}"
    if metrics:
        shown = {
            k: v
            for k, v in metrics.items()
            if k not in NOT_IN_TEXT
            and SHOWN_METRIC_RE.match(k)
            and isinstance(v, int | float)
            and not isinstance(v, bool)
        }
        if shown:
            text += "; " + ", ".join(f"{k}={v:.4g}" for k, v in list(shown.items())[:6])
    parts = urlsplit(url)
    if parts.hostname == SLACK_HOST:
        # Slack reads &, < and > as markup (links, mentions): escaped as its docs ask.
        return {"text": text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")}
    if parts.hostname in DISCORD_HOSTS and parts.path.startswith("/api/webhooks/"):
        return {"content": text[:DISCORD_MAX], "allowed_mentions": {"parse": []}}
    return {
        "event": event,
        "text": text,
        "job": {
            "id": job.id,
            "name": job.spec.name,
            "owner": job.owner,
            "state": job.state.value,
            "end_class": job.end_class,  # None for jobs an older agent finished
            "exit_code": job.exit_code,
            "signal": job.signal,
            "reason": job.reason,
            "attempt": job.attempt,
            "duration_s": duration,
            "sweep": job.spec.sweep,
            "metrics": dict(metrics) if metrics else None,
        },
    }


@dataclass(order=True)
class _Delivery:
    due: float
    seq: int
    url: str = field(compare=False)
    body: dict[str, Any] = field(compare=False)
    # Deliveries of one key (a job, to one URL) go one after another, in order.
    key: tuple[str, str] = field(compare=False, default=("", ""))
    # Its lanes ("host", HOST:PORT) and ("owner", USER): each lets only so many deliveries be
    # sent at once.
    lanes: tuple[tuple[str, str], ...] = field(compare=False, default=())
    owner: str = field(compare=False, default="")
    tries: int = field(default=0, compare=False)


class Notifier:
    """The background senders. `send` never blocks; `close` stops the threads."""

    def __init__(
        self,
        rule: HostRule,
        *,
        senders: int = 16,
        per_host: int = 2,
        per_owner: int = 4,
        max_pending: int = 1000,
        timeout: float = 5.0,
        tries: int = 5,
        first_delay: float = 1.0,
    ):
        self.rule = rule
        self.max_pending = max_pending
        # One user's share of the queue, a quarter: four users flooding it leave none for a
        # fifth, but one or two leave most of it.
        self.owner_pending = max(1, max_pending // 4)
        self.timeout = timeout
        self.tries = tries
        self.first_delay = first_delay
        self.dropped = 0
        self._heap: list[_Delivery] = []
        self._pending = 0  # waiting in the heap or behind another, or being sent
        self._owned: dict[str, int] = {}  # an owner -> their part of `_pending`
        # An owner whose notifications are being dropped (past `owner_pending`) -> how many.
        self._over: dict[str, int] = {}
        # A key with a delivery in the heap or being sent -> those queued behind it.
        self._behind: dict[tuple[str, str], deque[_Delivery]] = {}
        self._caps = {"host": per_host, "owner": per_owner}
        self._busy: dict[tuple[str, str], int] = {}  # a lane -> its deliveries being sent
        # A full lane -> the deliveries that were due and wait for it (a heap, by due).
        self._parked: dict[tuple[str, str], list[_Delivery]] = {}
        self._idle = 0  # senders waiting for work
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._senders = senders
        self._http: httpx.Client | None = None  # made by _start
        self._threads: list[threading.Thread] = []

    def _start(self) -> None:
        """The senders' HTTP client, made at the first notification (most agents notify
        nobody). Called with the lock held. httpx is imported here, not with the agent: its
        package loads its command line (click, rich, pygments), a tenth of the agent's
        start-up imports, for agents that mostly never notify."""
        import httpx

        self._http = httpx.Client(timeout=self.timeout, follow_redirects=False, trust_env=False)

    def send(self, url: str, body: dict[str, Any], key: str = "", owner: str = "") -> bool:
        """Queue one notification of `owner`'s job; False (and logged) if too many are
        waiting, or too many of `owner`'s. Those of one `key` (a job's) to one URL arrive in
        the order sent: a job's end never overtakes its start, even while the start is being
        retried."""
        with self._cond:
            if self._closed:
                return False
            if self._http is None:
                self._start()
            owned, pending = self._owned.get(owner, 0), self._pending
            if owned < self.owner_pending and pending < self.max_pending:
                self._queue(url, body, key, owner)
                return True
            self.dropped += 1
            theirs = owned >= self.owner_pending
            first = theirs and owner not in self._over
            if theirs:
                self._over[owner] = self._over.get(owner, 0) + 1
        if not theirs:
            log.warning(
                "notification to %s dropped: %d already waiting", shown_webhook(url), pending
            )
        elif first:  # the others are counted, and the count logged when theirs go again
            log.warning(
                "notifications of %s's jobs are dropped from now on: %d of theirs are waiting"
                " already, a user's share of the queue (webhooks that do not answer?)",
                owner or "the owner",
                owned,
            )
        return False

    def _queue(self, url: str, body: dict[str, Any], key: str, owner: str) -> None:
        """One more notification waits: due now, or behind the last of its key. Called with
        the lock held."""
        self._pending += 1
        self._owned[owner] = self._owned.get(owner, 0) + 1
        lanes = (("host", host_port(url)), ("owner", owner))
        item = _Delivery(time.monotonic(), next(self._seq), url, body, (url, key), lanes, owner)
        if item.key in self._behind:
            self._behind[item.key].append(item)
        else:
            self._behind[item.key] = deque()
            self._ready(item)

    def _ready(self, item: _Delivery) -> None:
        """`item` may be sent once it is due. Called with the lock held."""
        heapq.heappush(self._heap, item)
        self._wake()

    def _wake(self) -> None:
        """A sender for work that is waiting: an idle one, else a new one while there are
        fewer than `senders`. Called with the lock held."""
        if self._idle == 0 and len(self._threads) < self._senders:
            t = threading.Thread(target=self._run, name=f"notify-{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()
        else:
            self._cond.notify()

    def _take(self) -> _Delivery | None:
        """The first due delivery whose lanes have room; those due whose lane is full wait
        in it (`_parked`). Called with the lock held."""
        now = time.monotonic()
        while self._heap and self._heap[0].due <= now:
            item = heapq.heappop(self._heap)
            full = [lane for lane in item.lanes if self._busy.get(lane, 0) >= self._caps[lane[0]]]
            if not full:
                for lane in item.lanes:
                    self._busy[lane] = self._busy.get(lane, 0) + 1
                return item
            heapq.heappush(self._parked.setdefault(full[0], []), item)
        return None

    def _free(self, item: _Delivery) -> None:
        """`item` is no longer being sent: what waited for its lanes may go (each is taken
        again in turn, and waits again where another of its lanes is full)."""
        for lane in item.lanes:
            self._busy[lane] -= 1
            if not self._busy[lane]:
                del self._busy[lane]
            for parked in self._parked.pop(lane, []):
                heapq.heappush(self._heap, parked)

    def _run(self) -> None:
        while True:
            with self._cond:
                item = None
                while not self._closed and (item := self._take()) is None:
                    wait = self._heap[0].due - time.monotonic() if self._heap else None
                    self._idle += 1
                    self._cond.wait(wait)
                    self._idle -= 1
                if item is None:  # closed
                    return
                if self._heap and self._heap[0].due <= time.monotonic():
                    self._wake()  # more is due: another sender takes it
            try:
                error = self._deliver(item)
            except Exception as e:  # a bug here must not end the sender
                error = f"{type(e).__name__}: {e}"
            with self._cond:
                self._free(item)
                item.tries += 1
                if error is not None and item.tries < self.tries and not self._closed:
                    item.due = time.monotonic() + self.first_delay * 2 ** (item.tries - 1)
                    self._ready(item)
                    continue
                self._pending -= 1
                resumed = self._left(item.owner)
                self._next_of(item.key)
            if resumed:
                log.warning(
                    "notifications of %s's jobs are queued again; %d were dropped",
                    item.owner or "the owner",
                    resumed,
                )
            if error is not None:
                log.warning(
                    "notification to %s failed %d times: %s",
                    shown_webhook(item.url),
                    item.tries,
                    error,
                )

    def _left(self, owner: str) -> int:
        """One of `owner`'s notifications has left the queue: how many of theirs were
        dropped, if that ends their dropping (0 if none were, or it goes on)."""
        owned = self._owned[owner] - 1
        if owned:
            self._owned[owner] = owned
        else:
            del self._owned[owner]
        if owned < self.owner_pending:
            return self._over.pop(owner, 0)
        return 0

    def _next_of(self, key: tuple[str, str]) -> None:
        """A delivery of `key` is done (taken or given up): the next of that key may go."""
        behind = self._behind.get(key)
        if not behind:
            self._behind.pop(key, None)
            return
        nxt = behind.popleft()
        nxt.due = time.monotonic()
        self._ready(nxt)

    def _deliver(self, item: _Delivery) -> str | None:
        """POST one notification; None when the webhook took it, else why not."""
        refused = self.rule.refusal(item.url, resolve=True)
        if refused is not None:
            item.tries = self.tries  # not worth retrying
            return refused
        import httpx

        assert self._http is not None
        try:
            response = self._http.post(item.url, json=item.body)
        except httpx.HTTPError as e:
            return f"{type(e).__name__}: {e}"
        if response.status_code >= 300:
            return f"HTTP {response.status_code}"
        return None

    def close(self) -> None:
        """Stop the senders; one stuck on a webhook that never answers is left (a daemon
        thread): the agent's shutdown never waits for a webhook."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        deadline = time.monotonic() + 1.0
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._http is not None and not any(t.is_alive() for t in self._threads):
            self._http.close()
