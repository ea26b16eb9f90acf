"""The queue's words on the wire: why a job ended (`EndClass`), what a retry is for
(`RetryOn`), time limits as people write them, and the webhooks told of a job's start and
end (`check_webhook_url`). A changed priority (`RequeueRequest`) is in `models`.

Runs on both sides. The standard library only: the CLI parses --timeout without pydantic.
"""

from __future__ import annotations

import re

from gpuhop.api.states import INFRA_CLASSES, EndClass, RetryOn

__all__ = [
    "INFRA_CLASSES",
    "MAX_GRACE",
    "EndClass",
    "RetryOn",
    "format_seconds",
    "parse_duration",
]


_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*\Z", re.IGNORECASE)
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
# A week: longer is a typo, not a limit.
MAX_TIMEOUT = 7 * 86400
# A cancel's grace, between SIGTERM and SIGKILL: an hour at most (cancel, sweep cancel).
MAX_GRACE = 3600


def parse_duration(text: str | float) -> float:
    """Seconds in "6h", "90m", "30s", "2d" or a plain number of seconds, as a time limit
    (more than 0, at most a week). Raises ValueError."""
    seconds = duration_seconds(text)
    if not 0 < seconds <= MAX_TIMEOUT:
        raise ValueError(f"{text!r}: a time limit is more than 0 and at most 7 days")
    return seconds


def duration_seconds(text: str | float) -> float:
    """Seconds in "6h", "90m", "30s", "2d" or a plain number of seconds, whatever their
    number: a caller with limits of its own says them. Raises ValueError."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        m = _DURATION_RE.match(text)
        if m is None:
            raise ValueError(
                f"{text!r} is not a duration; give e.g. 6h, 90m, 30s, 2d or plain seconds"
            )
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2).lower()]
    return seconds


def format_seconds(seconds: float) -> str:
    """6h, 1h30m, 90s: the shortest exact way to write a time limit."""
    s = round(seconds)
    if s < 60 or s % 60:
        return f"{s}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60}m{s % 60}s"
    m = s // 60
    if m < 60 or m % 60:
        return f"{m}m" if m < 60 else f"{m // 60}h{m % 60}m"
    return f"{m // 60}h"


def check_webhook_url(url: str) -> str:
    """`url` if it is an http(s) URL with a host and no credentials, else raise ValueError.
    Which hosts the agent posts to is the agent's call (gpuhop.agent.services.notify)."""
    from urllib.parse import urlsplit

    if len(url) > 2048 or any(c in url for c in "\x00\r\n "):
        raise ValueError(f"notify URL {url[:80]!r}: too long, or has spaces or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as e:
        raise ValueError(f"notify URL {url[:80]!r}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"notify URL {url[:80]!r}: only http:// and https:// URLs are allowed")
    if parts.username or parts.password:
        raise ValueError(f"notify URL {url[:80]!r}: credentials in the URL are not allowed")
    return url


def shown_webhook(url: str) -> str:
    """`url` as gpuhop shows and logs it: its scheme, host and port, and "…" for the rest.
    A webhook's path is its secret (Slack's, Discord's and ntfy's URLs carry their token
    there): whoever reads the agent's log, `show` or the dashboard must not be able to post
    to it."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
    except ValueError:
        return "(a webhook URL that cannot be read)"
    rest = "…" if parts.path.strip("/") or parts.query or parts.fragment else ""
    return f"{parts.scheme}://{host}/{rest}"
