"""Amounts of GPU memory as people write them ("6GiB", "6144M") and as gpuhop shows them.

Runs on both sides: the client parses what a user typed, the agent and the CLI format MB in
their messages. Sizes are binary, as nvidia-smi's and TensorFlow's are: 1G = 1GiB = 1024 MB.
Standard library only.
"""

from __future__ import annotations

import re

__all__ = ["format_mb", "parse_mb"]

_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*\Z")
# Every unit in MB. "GB" and "MB" are taken as binary, as GPU tools mean them.
_UNITS = {
    "": 1,
    "m": 1,
    "mb": 1,
    "mib": 1,
    "g": 1024,
    "gb": 1024,
    "gib": 1024,
    "t": 1024 * 1024,
    "tb": 1024 * 1024,
    "tib": 1024 * 1024,
}
EXAMPLES = "6GiB, 6G, 1.5GiB, 6144MiB, 6144M or a plain number of MB"


def parse_mb(text: str | int) -> int:
    """MB in a size such as "6GiB", "6G", "6144MiB", "6144M" or "6144". Raises ValueError.

    A plain number (or an int) is MB. Fractions are allowed and rounded down to whole MB.
    """
    if isinstance(text, bool):  # bool is an int; True is not a size
        raise ValueError(f"{text!r} is not a size; give a size like {EXAMPLES}")
    if isinstance(text, int):
        mb = text
    else:
        match = _SIZE_RE.match(text)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"cannot read {text!r} as a size; give a size like {EXAMPLES}")
        mb = int(float(match.group(1)) * _UNITS[unit])
    if mb < 1:
        raise ValueError(f"{text!r} is less than 1 MB; give a size like {EXAMPLES}")
    return mb


def format_mb(mb: int | float) -> str:
    """ "512 MiB", "8 GiB", "79.6 GiB": whole GiB without decimals, one decimal otherwise."""
    if mb < 1024:
        return f"{mb:.0f} MiB"
    gib = mb / 1024
    text = f"{gib:.1f}"
    return f"{text.removesuffix('.0')} GiB"
