"""Sizes of GPU memory as users write them, and as gpuhop prints them."""

from __future__ import annotations

import pytest

from gpuhop.api import format_mb, parse_mb


@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("6GiB", 6144),
        ("6G", 6144),
        ("6g", 6144),
        ("6GB", 6144),  # binary, as nvidia-smi and TensorFlow mean it
        ("6 GiB", 6144),
        ("1.5GiB", 1536),
        ("6144MiB", 6144),
        ("6144M", 6144),
        ("6144MB", 6144),
        ("6144", 6144),
        (" 512 ", 512),
        ("1T", 1024 * 1024),
        (4096, 4096),
    ],
)
def test_sizes_users_write(text: str | int, mb: int):
    assert parse_mb(text) == mb


@pytest.mark.parametrize(
    "text", ["", "GiB", "6XB", "6 G B", "-6G", "six", "6e3", "0", "0.0001G", "6K", True]
)
def test_bad_sizes_are_refused_with_examples(text: str):
    with pytest.raises(ValueError, match="6GiB, 6G"):
        parse_mb(text)


@pytest.mark.parametrize(
    ("mb", "text"),
    [
        (512, "512 MiB"),
        (1024, "1 GiB"),
        (8192, "8 GiB"),
        (12288, "12 GiB"),
        (1536, "1.5 GiB"),
        (81559, "79.6 GiB"),
    ],
)
def test_format(mb: int, text: str):
    assert format_mb(mb) == text
