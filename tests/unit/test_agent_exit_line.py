"""Which agent's exit a starting client hears: its own only.

An agent that stops frees its lock, then writes its exit line. A client that starts the next
agent at once (`stop` then `start`, as a restart does) may see that line come after its own
start began: it failed such a start with "the agent failed to start: gpuhop agent exited with
code 0" while the new agent was starting fine (a fresh-clone run's test_gpu_health). The exit
line names its agent's pid, and the client waits on its own agent's.
"""

from pathlib import Path

from gpuhop.client.embedded import _log_says_exited


def test_only_the_started_agents_exit_line_counts(tmp_path: Path):
    log = tmp_path / "agent.log"
    earlier = b"gpuhop agent exited with code 1 (pid 41)\n"  # before this start: not read
    log.write_bytes(earlier)
    start = len(earlier)
    with open(log, "ab") as f:
        f.write(b"2026-12-02 17:14:20,677 INFO gpuhop.agent: agent 42 serving ...\n")
        f.write(b"gpuhop agent exited with code 0 (pid 4242)\n")  # the one stopped before
    assert not _log_says_exited(log, start, 42)
    assert not _log_says_exited(log, 0, 4)  # a pid that is a prefix of another's is not it
    assert _log_says_exited(log, 0, 41) and not _log_says_exited(log, start, 41)
    with open(log, "ab") as f:
        f.write(b"gpuhop agent exited with code 1 (pid 42)\n")
    assert _log_says_exited(log, start, 42)
