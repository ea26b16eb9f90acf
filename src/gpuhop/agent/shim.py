"""Runs on the GPU host as each job's process-group leader: starts the job, waits, records.

Started by the supervisor as `python -I -S shim.py STATUS_FILE PID_FILE -- COMMAND...` in a
new session, with stdout and stderr already pointing at the job's log. It imports the
standard library only (fast start), outlives an agent restart, and writes the job's exit
status to STATUS_FILE atomically, so a restarted agent still learns how the job ended.
Signals sent to the group (cancel) reach the job; the shim itself keeps waiting for it.
"""

import json
import os
import signal
import sys
import time


def _write_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    status_path, pid_path, sep, *command = argv
    if sep != "--" or not command:
        print("usage: shim.py STATUS_FILE PID_FILE -- COMMAND...", file=sys.stderr)
        return 2
    _write_atomic(pid_path, {"pid": os.getpid()})
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A handler, not SIG_IGN: exec resets handled signals to their default in the child.
        signal.signal(sig, lambda *_: None)
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(command[0], command)
        except OSError as e:
            os.write(2, f"gpuhop: cannot start {command[0]!r}: {e.strerror}\n".encode())
            os._exit(127)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            status = 0
            break
    if os.WIFSIGNALED(status):
        result: dict[str, object] = {"exit_code": None, "signal": os.WTERMSIG(status)}
    else:
        result = {"exit_code": os.WEXITSTATUS(status), "signal": None}
    result["ended_at"] = time.time()
    _write_atomic(status_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
