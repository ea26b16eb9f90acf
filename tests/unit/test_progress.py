"""The terminal display's pure parts: lines as a terminal shows them, the status line."""

from __future__ import annotations

from gpuhop.cli.progress import LineSplitter, elapsed_text, wants_live


def test_lines_are_released_whole_and_utf8_may_split_across_chunks():
    lines = LineSplitter()
    snowman = "☃".encode()
    assert lines.feed(b"epoch 1 " + snowman[:1]) == ""
    assert lines.feed(snowman[1:] + b"\nepoch 2") == "epoch 1 ☃\n"
    assert lines.feed(b"\n") == "epoch 2\n"
    assert lines.feed(b"tail without newline") == ""
    assert lines.rest() == "tail without newline"
    assert lines.rest() == ""


def test_a_carriage_return_keeps_what_a_terminal_would_show():
    lines = LineSplitter()
    assert lines.feed(b"10%\r50%\r100%\nnext\r\n") == "100%\n\n"
    assert lines.feed(b"\xff\n") == "\ufffd\n"  # bad bytes never stop the stream


def test_elapsed_time_reads_like_a_clock():
    assert elapsed_text(0) == "0:00"
    assert elapsed_text(61.9) == "1:01"
    assert elapsed_text(3 * 3600 + 62) == "3:01:02"
    assert elapsed_text(-5) == "0:00"  # clocks of two machines may disagree


class _Tty:
    def isatty(self) -> bool:
        return True


def test_live_display_only_on_a_terminal_and_never_when_asked_not_to(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    assert wants_live(False, _Tty())
    assert not wants_live(True, _Tty())
    with open("/dev/null", "w") as devnull:
        assert not wants_live(False, devnull)
    monkeypatch.setenv("TERM", "dumb")
    assert not wants_live(False, _Tty())
