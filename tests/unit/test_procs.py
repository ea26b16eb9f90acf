"""Process liveness that survives pid reuse, checked against real short-lived children; and
asking a program a question with its output and time bounded."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuhop.backends import procs

SLEEP = shutil.which("sleep")


def wait_until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)


def proc_state(pid: int) -> str | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()[0].decode()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(argv0: str | None = None) -> subprocess.Popen[bytes]:
        assert SLEEP is not None
        program = SLEEP
        if argv0 is not None:
            # comm comes from the executed file's name, so run sleep through a link.
            program = str(tmp_path / argv0)
            os.symlink(SLEEP, program)
        proc = subprocess.Popen([program, "30"], start_new_session=True)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_running_child_is_alive_and_not_after_it_is_reaped(spawn):
    proc = spawn()
    started = procs.start_time(proc.pid)

    assert started is not None and started.isdigit()
    assert procs.start_time(proc.pid) == started  # stable while it runs
    assert procs.alive(proc.pid, started)
    assert procs.alive(proc.pid, None)

    proc.kill()
    proc.wait()

    assert procs.start_time(proc.pid) is None
    assert not procs.alive(proc.pid, started)
    assert not procs.alive(proc.pid, None)


def test_alive_with_another_start_time_is_false(spawn):
    # The pid was reused: same number, a different process.
    proc = spawn()
    started = procs.start_time(proc.pid)
    assert started is not None

    assert not procs.alive(proc.pid, str(int(started) + 1))
    assert not procs.alive(proc.pid, "0")


def test_zombie_counts_as_dead(spawn):
    proc = spawn()
    started = procs.start_time(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    wait_until(lambda: proc_state(proc.pid) == "Z")

    assert not procs.alive(proc.pid, started)
    assert procs.start_time(proc.pid) is None


def test_start_time_parses_a_command_name_with_spaces_and_parentheses(spawn):
    weird = "x) (y z"
    proc = spawn(argv0=weird)
    wait_until(lambda: b"(" + weird.encode() + b")" in Path(f"/proc/{proc.pid}/stat").read_bytes())

    data = Path(f"/proc/{proc.pid}/stat").read_bytes()
    # Field 22 (starttime), counted with the odd name swapped for a plain one.
    expected = data.replace(b"(" + weird.encode() + b")", b"(sleep)").split()[21].decode()
    assert procs.start_time(proc.pid) == expected
    assert procs.alive(proc.pid, expected)


def test_signal_group_reaches_the_group_and_reports_a_gone_one(spawn):
    proc = spawn()

    assert procs.signal_group(proc.pid, signal.SIGTERM) is True
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert procs.signal_group(proc.pid, signal.SIGTERM) is False


@pytest.mark.parametrize(
    ("sig", "words"),
    [
        (signal.SIGKILL, "killed by signal 9 (SIGKILL) (likely out of memory"),
        (signal.SIGTERM, "killed by signal 15 (SIGTERM)"),
        (200, "killed by signal 200 (signal 200)"),
    ],
)
def test_describe_signal(sig: int, words: str):
    assert procs.describe_signal(sig).startswith(words)


@pytest.mark.parametrize(
    ("seconds", "words"), [(0, "0.0s"), (59.94, "59.9s"), (90, "2 min"), (5400, "1.5 h")]
)
def test_describe_duration(seconds: float, words: str):
    assert procs.describe_duration(seconds) == words


def test_ask_reads_a_programs_answer_with_its_errors():
    answer = procs.ask(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert answer == procs.Answer(3, "out\nerr\n", None)


def test_ask_stops_a_program_that_prints_without_end():
    answer = procs.ask(["sh", "-c", "exec yes"], cap=4096)
    assert answer.stopped == "it printed more than 4 KiB" and answer.cut
    assert answer.code == -signal.SIGKILL and answer.out == "y\n" * 2048


def test_ask_stops_a_program_that_never_answers():
    answer = procs.ask(["sh", "-c", "exec sleep 600"], seconds=0.5)
    assert answer == procs.Answer(-signal.SIGKILL, "", "it had not answered after 0.5 s")


def test_an_answer_is_the_json_after_its_mark_on_the_last_line_that_has_it():
    said = "echo 'm:1'; echo 'noise m:2'; echo 'm:{\"a\": [2]}'; echo after"
    assert procs.ask(["sh", "-c", said]).marked("m:") == {"a": [2]}
    assert procs.ask(["sh", "-c", "echo m:1; exit 1"]).marked("m:") is None  # failed
    assert procs.ask(["sh", "-c", "echo m:not-json"]).marked("m:") is None
    assert procs.ask(["sh", "-c", "echo nothing marked"]).marked("m:") is None
    stopped = procs.ask(["sh", "-c", "echo m:1; exec sleep 600"], seconds=0.5)
    assert stopped.marked("m:") is None and not stopped.cut
