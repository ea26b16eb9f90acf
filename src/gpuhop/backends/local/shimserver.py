"""Runs on the GPU host, started by the agent's local backend: a warm shim that forks each
job's shim instead of the agent starting a fresh interpreter for it. Standard library only
(it runs with `python -I -S`, as the shim does).

Started as `python -I -S shimserver.py FD`, where FD is its end of a SOCK_SEQPACKET socket
pair with the agent. It imports the shim and every helper the shim may need once, then waits
for requests: each is one JSON message {"request": PATH} with the job's log file as an
attached descriptor. PATH, in the job's dir, holds {"argv": the shim's arguments, "env":
the job's environment, "cwd": where it starts, "cgroup": a cgroup.procs file to join or
null}; only the forked child reads it (and removes it), so no job's environment ever passes
through the server's memory, which every later shim inherits. It forks a child that becomes
exactly what a shim
started by the agent would be: the leader of a new session, stdin /dev/null, stdout and
stderr on the log, the job's environment and directory, in the attempt's cgroup, running
`shim.main`, and it answers {"pid": PID, "start": its start time} (or {"error": why}).
When a child ends, the server reaps it at once (so its pid never lingers as a zombie) and
tells the agent {"ended": PID, "code": its exit code, negative for a signal}.

The server is single-threaded and forks only from its main loop, so each child starts with
a clean copy of a small, idle interpreter. It ends when the agent's end of the socket
closes (the agent stopped or died); jobs it started live on, as jobs started by the agent
do, and a restarted agent finds them by their pid files.
"""

import contextlib
import json
import os
import signal
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # -I leaves this file's directory off sys.path
    sys.path.insert(0, HERE)

import shim  # noqa: E402

# What a job's shim may load: loaded once here, not in every job.
for _helper in ("sandbox", "workview", "gangenv", "relay", "envbuild"):
    __import__(_helper)

MAX_MESSAGE = 1 << 22
_CHLD = {signal.SIGCHLD}


def serve(sock: socket.socket) -> int:
    signal.signal(signal.SIGCHLD, lambda *_: _reap(sock))
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 4)
        except OSError:
            return 0
        if not msg:
            return 0  # the agent is gone
        # A child's end is told only after its pid: SIGCHLD waits until the answer is sent.
        signal.pthread_sigmask(signal.SIG_BLOCK, _CHLD)
        try:
            try:
                request = json.loads(msg)["request"]
                if not isinstance(request, str) or len(fds) != 1:
                    raise ValueError("expected a request file and the log's descriptor")
                pid = os.fork()
                if pid == 0:
                    _child(sock, request, fds[0])  # never returns
                reply = {"pid": pid, "start": shim._start(pid)}
            except (OSError, ValueError, KeyError, TypeError) as e:
                reply = {"error": f"{type(e).__name__}: {e}"}
            finally:
                for fd in fds:
                    os.close(fd)
            _send(sock, reply)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _CHLD)


def _send(sock: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):  # the agent is gone: the loop ends at its next read
        sock.send(json.dumps(message).encode())


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"ended": pid, "code": os.waitstatus_to_exitcode(status)})


def _child(sock: socket.socket, path: str, log: int) -> None:
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _CHLD)
        sock.close()
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in (log, null):
            if fd > 2:
                os.close(fd)
        with open(path) as f:
            request = json.load(f)
        os.unlink(path)
        if request.get("cgroup"):
            # As the agent's `sh -c 'echo $$ > cgroup.procs'` does: where it cannot, the job
            # runs outside it.
            try:
                with open(request["cgroup"], "w") as f:
                    f.write(str(os.getpid()))
            except OSError:
                pass
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        code = shim.main(request["argv"])
    except BaseException as e:
        os.write(2, f"gpuhop: the job's shim failed: {type(e).__name__}: {e}\n".encode())
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(serve(socket.socket(fileno=int(sys.argv[1]))))
