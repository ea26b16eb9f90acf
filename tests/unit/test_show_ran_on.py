"""`gpuhop show`'s line on what the job ran on counts its packages in words: "1 package"."""

from __future__ import annotations

from gpuhop.cli.show import ran_on_rows


def record(packages: dict[str, str]) -> dict[str, object]:
    return {
        "recorded": True,
        "python": {"implementation": "CPython", "version": "3.11.2"},
        "platform": {"system": "Linux", "release": "6.1.0", "machine": "x86_64"},
        "packages": packages,
        "packages_digest": "ab" * 32,
    }


def test_the_packages_are_counted_one_or_more():
    one = dict(ran_on_rows(record({"numpy": "2.0.0"})))["ran on"]
    assert one == "CPython 3.11.2 on Linux 6.1.0 x86_64; 1 package (digest abababababab)"
    two = dict(ran_on_rows(record({"numpy": "2.0.0", "six": "1.16.0"})))["ran on"]
    assert "; 2 packages (digest" in two
