"""A job's log as a terminal shows it (`gpuhop.cli.termtext`), on a real Keras log.

data/keras_fit.log is the output of a real Keras 3.15 `fit` (default verbosity, 2 epochs of
40 steps, written to a file as a job's log is): its progress bar redraws each epoch's line
some 20 times with backspaces and carriage returns, in bold and colour."""

from __future__ import annotations

from pathlib import Path

from gpuhop.cli.termtext import TerminalText, render

KERAS_LOG = (Path(__file__).parent / "data" / "keras_fit.log").read_bytes()


def test_a_keras_progress_bar_reads_as_its_last_frame_without_escapes():
    assert KERAS_LOG.count(b"\r") > 40 and b"\x1b[1m" in KERAS_LOG  # what makes it garbage
    lines = render(KERAS_LOG).splitlines()
    assert lines[0] == "Epoch 1/2" and lines[2] == "Epoch 2/2"
    assert len(lines) == 4
    for bar in (lines[1], lines[3]):
        assert bar.startswith("40/40 ━━━━━━━━━━━━━━━━━━━━ "), bar
        assert "val_loss: 0.62" in bar and bar.count("loss:") == 2, bar
    assert not any(c in "".join(lines) for c in "\x1b\r\b"), lines


def test_the_same_text_whichever_way_the_bytes_are_cut():
    whole = render(KERAS_LOG)
    for size in (1, 2, 7, 500):
        text = TerminalText()
        pieces = [text.feed(KERAS_LOG[i : i + size]) for i in range(0, len(KERAS_LOG), size)]
        assert "".join(pieces) + text.close() == whole, size


def test_the_line_being_drawn_is_its_latest_frame():
    text = TerminalText()
    cut = KERAS_LOG.index(b"Epoch 2/2")
    first_frame_end = KERAS_LOG.index(b"\r", KERAS_LOG.index(b"\r", cut) + 1)
    first = KERAS_LOG[:first_frame_end]
    assert text.feed(first).splitlines()[-1] == "Epoch 2/2"
    assert text.open_line().startswith(" 1/40 ━"), text.open_line()


def test_what_a_terminal_does_with_returns_backspaces_and_escapes():
    assert render(b"abc\r\n") == "abc\n"  # a Windows line end keeps its line
    assert render(b"10%\r50%\r100%\n") == "100%\n"
    assert render(b"loading...\rok\n") == "okading...\n"  # overwritten, not cleared
    assert render(b"loading...\r\x1b[Kok\n") == "ok\n"  # ... unless erased
    assert render(b"abcd\b\bXY\n") == "abXY\n"
    assert render(b"\x1b[1;32mgreen\x1b[0m \x1b]0;a title\x07done\x07\n") == "green done\n"
    assert render(b"\xff no newline at the end") == "\ufffd no newline at the end"
