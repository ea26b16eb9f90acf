"""Runs on the GPU host, started by the agent's local backend: the leader server, a warm
process that forks each job's leader instead of the agent starting a fresh interpreter for
it. Standard library only (it runs with `python -I -S`, as the leader does).

Started as `python -I -S leaderserver.py FD [CGROUPS COUNTER]`, where FD is its end of a
SOCK_SEQPACKET socket pair with the agent, and CGROUPS the agent's memory cgroup (COUNTER the
file there that a memory cgroup has). It imports the leader and every helper the leader may need
once, then waits for requests: each is one JSON message {"request": PATH, "cgroup": DIR or
null} with the job's log file as an attached descriptor. PATH, in the job's dir, holds
{"argv": the leader's arguments, "env": the job's environment, "cwd": where it starts,
"specs": what the leader would read from its spec files (`{"sandbox": ...}`)}; only
the leader reads it (and removes it), so no job's environment ever passes through the
server's memory, which every later leader inherits. DIR is the attempt's cgroup, not yet made.
A forked leader becomes exactly what one started by the agent would be: the leader of a new
session, stdin /dev/null, stdout and stderr on the log, the job's environment and directory,
in the attempt's cgroup, running `leader.main`, and the server answers {"pid": PID, "start":
its start time} (or {"error": why}). When a child ends, the server reaps it at once (so its
pid never lingers as a zombie) and tells the agent {"ended": PID, "code": its exit code,
negative for a signal}.

The leader is forked before its job asks, and waits (a "spare"): its fork, its new session
and its move into a cgroup of its own (which on cgroup v1 waits out an RCU grace period of
5-15 ms) are paid while no job waits. A request then renames the spare's cgroup to the
attempt's (cgroup v1 renames a cgroup with its processes in it; where the kernel refuses,
the leader joins the attempt's cgroup itself, as before) and hands the spare the request and
the log; the next spare is forked 5 ms later. (It was 50 ms, so as not to fork beside a
job's start on the same cores; but then a job submitted 20-50 ms after the last found no
spare and waited for its fork: 17 or 28 ms to the first byte. At 5 ms every job of a
tight loop finds one, 16.6-20 ms, and the job that just started is no slower.) A spare
holds nothing of a job until then. Where there is no spare (a request came sooner, its fork
failed, or it died), the server forks one at once, with no cgroup of its own (the leader
joins the attempt's itself). Either way the server answers with the leader's pid only once
the leader leads its own session, so a cancel right after the answer reaches its whole group.

A request may name a ready container's spec ({"ready": SPEC}, for an image job that can run
in one: ready.py). The server hands such a request to the leader of a ready container of
that kind where it holds one (its cgroup renamed as a spare's), and 5 ms after the request
forks the next: a leader that joins a cgroup of its own, starts a container of that kind
(`podman run` of a waiter) and waits for the next job like it (`_ready_spare`). It holds
one per kind, READY_MAX in all (the oldest is told to end), each for READY_IDLE seconds; a
kind whose containers end before their job READY_TRIES times gets none more. When the server
ends, it tells each to end and waits until their containers have.

`python -I -S leaderserver.py --become PATH` is one leader of a fresh interpreter, which the
agent starts where this server could not fork one (LocalBackend.leader): it reads the same
request from PATH, its output already the job's log, so that there too the job's environment
is never an interpreter's own (root's, on a team agent: a user's LD_PRELOAD would act on it).

The server is single-threaded and forks only from its main loop, so each child starts with
a clean copy of a small, idle interpreter. It ends when the agent's end of the socket
closes (the agent stopped or died); its spare then leaves its cgroup, removes it and ends,
and jobs it started live on, as jobs started by the agent do, and a restarted agent finds
them by their pid files.
"""

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # -I leaves this file's directory off sys.path
    sys.path.insert(0, HERE)

import leader  # noqa: E402

# What a job's leader may load: loaded once here, not in every job.
for _helper in ("sandbox", "workview", "gangenv", "jobnet", "relay", "envbuild", "container"):
    __import__(_helper)
import ready  # noqa: E402

MAX_MESSAGE = 1 << 22
_CHLD = {signal.SIGCHLD}
SPARE_PREFIX = "gpuhop-spare"
# Seconds after a request before the next spare is forked (a request sooner gets a fork).
SPARE_AFTER = 0.005
# Ready containers (ready.py): how many the server keeps at once (one per kind of job: image,
# user, GPUs), how long one waits for its job before it ends, how many of a kind may end
# before their job (an image whose ENTRYPOINT cannot run the waiter, say) before that kind
# gets none more, and how long the server waits for theirs to end as it ends.
READY_MAX = 4
READY_IDLE = 600.0
READY_TRIES = 2
READY_END_SECONDS = 30.0


class Spare:
    """A leader forked ahead of its job: its pid, the server's end of its socket, and the
    cgroup it joined (None where it has none)."""

    def __init__(self, pid: int, sock: socket.socket, cgroup):
        self.pid = pid
        self.sock = sock
        self.cgroup = cgroup


class Server:
    def __init__(self, sock: socket.socket, cgroups=None):
        self.sock = sock
        # (the agent's memory cgroup, the file a memory cgroup has), for the spares' own.
        self.cgroups = cgroups
        self.spare = None
        self.renames = True  # cgroup v2 refuses to rename a cgroup: then joins it is
        self.made = 0
        self.ready: dict = {}  # kind -> the Spare holding a ready container of it
        self.wanted: dict | None = None  # the ready spec of the next ready container to start
        self.failed: dict = {}  # kind -> how many of its ended before their job
        self.retired: set = set()  # ready containers' leaders told to end, not yet reaped
        self.handed: dict = {}  # pid of a leader that had a ready container -> its base dir

    def serve(self) -> int:
        signal.signal(signal.SIGCHLD, lambda *_: self._reap())
        signal.pthread_sigmask(signal.SIG_BLOCK, _CHLD)
        try:
            self.spare = self._fork_spare()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _CHLD)
        while True:
            # The next spare is forked just after the last one's job was handed over (see
            # the docstring for why not later); so is the next ready container.
            later = self.spare is None or self.wanted is not None
            self.sock.settimeout(SPARE_AFTER if later else None)
            try:
                msg, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
            except TimeoutError:
                signal.pthread_sigmask(signal.SIG_BLOCK, _CHLD)
                try:
                    if self.spare is None:
                        self.spare = self._fork_spare()
                    if self.wanted is not None:
                        wanted, self.wanted = self.wanted, None
                        self._fork_ready(wanted)
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, _CHLD)
                continue
            except OSError:
                return self._end_ready()
            self.sock.settimeout(None)
            if not msg:
                return self._end_ready()  # the agent is gone
            # A child's end is told only after its pid: SIGCHLD waits until the answer is sent.
            signal.pthread_sigmask(signal.SIG_BLOCK, _CHLD)
            try:
                try:
                    message = json.loads(msg)
                    request, cgroup = message["request"], message.get("cgroup")
                    wants = message.get("ready")
                    if not isinstance(request, str) or len(fds) != 1:
                        raise ValueError("expected a request file and the log's descriptor")
                    if cgroup is not None and not isinstance(cgroup, str):
                        raise ValueError("expected the cgroup's path")
                    if wants is not None and not isinstance(wants, dict):
                        raise ValueError("expected a ready container's spec")
                    pid = self._start_ready(request, fds[0], cgroup, wants) if wants else None
                    if pid is None:
                        pid = self._start(request, fds[0], cgroup)
                    reply = {"pid": pid, "start": leader._start(pid)}
                except (OSError, ValueError, KeyError, TypeError) as e:
                    reply = {"error": f"{type(e).__name__}: {e}"}
                finally:
                    for fd in fds:
                        os.close(fd)
                self._send(reply)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _CHLD)

    def _start(self, request: str, log: int, cgroup) -> int:
        """Start the leader of one request: the spare, or else one forked now the same way.
        Returns its pid only once it leads its own session: a cancel that signals the
        group at once must find it (a pid answered before the child's setsid left a
        SIGTERM and SIGKILL with no group to reach, and the job running)."""
        for attempt in range(2):
            spare, self.spare = self.spare, None
            if spare is None and attempt == 1:
                spare = self._fork_spare(own_cgroup=False)  # it joins the attempt's itself
            if spare is None:
                continue
            if self._hand(spare, request, log, cgroup):
                return spare.pid
        raise OSError("could not fork the job's leader")

    def _hand(self, spare: Spare, request: str, log: int, cgroup) -> bool:
        """Hand the request to `spare`, its cgroup renamed to the attempt's `cgroup` where
        it has one; False where it died first. Its socket is closed either way."""
        try:
            if not _ready(spare):
                _remove(spare.cgroup)  # it died before it was ready: its end is reaped
                return False
            join = cgroup
            if cgroup is None and spare.cgroup is not None:
                join = os.path.dirname(spare.cgroup)  # none for this attempt: the server's own
            renamable = cgroup is not None and not os.path.exists(cgroup)  # not a dead one's
            if renamable and spare.cgroup is not None and self.renames:
                try:
                    os.rename(spare.cgroup, cgroup)
                    join = None  # the spare is in the attempt's cgroup already
                except OSError:
                    self.renames = False
            try:
                if join is not None:
                    _make(join)
                message = json.dumps({"request": request, "cgroup": join}).encode()
                socket.send_fds(spare.sock, [message], [log])
                return True
            except OSError:  # it died waiting: its end is reaped
                if join is not None:
                    _remove(spare.cgroup)
                return False
        finally:
            spare.sock.close()

    def _start_ready(self, request: str, log: int, cgroup, spec: dict):
        """Hand the request to the leader of a ready container of its kind (`spec`), if
        the server holds one and it still waits; None if not (a leader is forked as for
        any job). Either way, the next job of the kind will find one."""
        kind = ready.key(spec)
        spare = self.ready.pop(kind, None)
        if self.failed.get(kind, 0) < READY_TRIES:
            self.wanted = spec
        if spare is None:
            return None
        if not self._hand(spare, request, log, cgroup):
            self.retired.add(spare.pid)  # it ended waiting: reaped as one that had no job
            return None
        self.handed[spare.pid] = spec["base"]
        return spare.pid

    def _fork_ready(self, spec: dict) -> None:
        """A leader that starts a ready container of `spec`'s kind and waits for its job
        (`_ready_spare`); the oldest kind's is told to end where the server holds
        READY_MAX."""
        kind = ready.key(spec)
        if kind in self.ready:
            return
        ready.sweep(spec["base"])  # what killed leaders (of this server or an earlier) left
        while len(self.ready) >= READY_MAX:
            oldest = self.ready.pop(next(iter(self.ready)))
            oldest.sock.close()
            self.retired.add(oldest.pid)
        cgroup = self._new_cgroup()
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            pid = os.fork()
        except OSError:
            _remove(cgroup)
            return
        if pid == 0:
            ours.close()
            _ready_spare(self, theirs, spec, cgroup)  # never returns
        theirs.close()
        self.ready[kind] = Spare(pid, ours, cgroup)

    def _end_ready(self) -> int:
        """As the server ends: tell each ready container's leader to end, and wait (a
        while) until they have, so that no container outlives the agent."""
        signal.pthread_sigmask(signal.SIG_BLOCK, _CHLD)
        pids = [spare.pid for spare in self.ready.values()] + list(self.retired)
        for spare in self.ready.values():
            spare.sock.close()
        self.ready = {}
        deadline = time.monotonic() + READY_END_SECONDS
        for pid in pids:
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] != 0:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.02)
        return 0

    def _fork_spare(self, own_cgroup: bool = True):
        """A new spare, in a new cgroup of its own if `own_cgroup` (where the agent has
        one); None if the fork fails."""
        cgroup = self._new_cgroup() if own_cgroup else None
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            pid = os.fork()
        except OSError:
            _remove(cgroup)
            return None
        if pid == 0:
            ours.close()
            _spare(self, theirs, cgroup)  # never returns
        theirs.close()
        return Spare(pid, ours, cgroup)

    def _new_cgroup(self):
        """A new cgroup for a spare to join (None where the agent has none, or the kernel
        renames none: the spare would join the attempt's after its own)."""
        if self.cgroups is None or not self.renames:
            return None
        self.made += 1
        cgroup = os.path.join(self.cgroups[0], f"{SPARE_PREFIX}-{os.getpid()}-{self.made}")
        try:
            os.mkdir(cgroup)
            if not os.path.exists(os.path.join(cgroup, self.cgroups[1])):
                os.rmdir(cgroup)
                cgroup = None
        except OSError:
            cgroup = None
        return cgroup

    def _send(self, message: dict) -> None:
        with contextlib.suppress(OSError):  # the agent is gone: the loop ends at its next read
            self.sock.send(json.dumps(message).encode())

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            kind = next((k for k, s in self.ready.items() if s.pid == pid), None)
            if kind is not None:  # a ready container's leader, which had no job
                gone = self.ready.pop(kind)
                gone.sock.close()
                _remove(gone.cgroup)
                if os.waitstatus_to_exitcode(status) == ready.GONE:
                    self.failed[kind] = self.failed.get(kind, 0) + 1
                continue
            if pid in self.retired:
                self.retired.discard(pid)
                continue
            base = self.handed.pop(pid, None)
            if base is not None:  # what a killed one left mounted
                ready.sweep(base)
            spare = self.spare
            if spare is not None and pid == spare.pid:
                # A spare died waiting (killed): no job's end; a new one comes with the next
                # request, which the server then forks itself.
                self.spare = None
                spare.sock.close()
                _remove(spare.cgroup)
                continue
            self._send({"ended": pid, "code": os.waitstatus_to_exitcode(status)})

    def close_in_child(self) -> None:
        """In a forked child: let go of the server's sockets."""
        self.sock.close()
        if self.spare is not None:
            self.spare.sock.close()
        for spare in self.ready.values():
            spare.sock.close()


def _ready(spare: Spare) -> bool:
    """Wait until the spare has its session and cgroup (it says whether it joined one);
    False if it died first."""
    try:
        said = spare.sock.recv(16)
    except OSError:
        return False
    if said == b"alone":
        spare.cgroup = None  # it could not join its cgroup, and removed it
    return bool(said)


def _make(cgroup: str) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(cgroup)


def _remove(cgroup) -> None:
    if cgroup is not None:
        with contextlib.suppress(OSError):
            os.rmdir(cgroup)


def _join(cgroup: str) -> bool:
    """Move this process into `cgroup`, as the agent's `sh -c 'echo $$ > cgroup.procs'`
    does; where it cannot, the job runs outside it."""
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        return False
    return True


def _own_session(server: Server, cgroup):
    """In a forked spare: let go of the server's signals and sockets, lead a session of its
    own, and join `cgroup`; the cgroup it is in (None where it could not join, and removed
    it)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _CHLD)
    server.close_in_child()
    os.setsid()
    if cgroup is not None and not _join(cgroup):
        _remove(cgroup)
        return None
    return cgroup


def _spare(server: Server, sock: socket.socket, cgroup) -> None:
    """A spare's life: a session and a cgroup of its own, then wait for a request and
    become its leader; end (leaving its cgroup, and removing it) if the server ends first."""
    code = 1
    try:
        cgroup = _own_session(server, cgroup)
        try:
            # Only now may the server rename the cgroup: the spare is in it.
            sock.send(b"alone" if cgroup is None else b"ready")
            msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 1)
        except OSError:  # the server ended first (a reset, if it never read our word)
            msg, fds = b"", []
        sock.close()
        if not msg or len(fds) != 1:  # the server is gone
            if cgroup is not None:
                _join(os.path.dirname(cgroup))
                _remove(cgroup)
            os._exit(0)
        message = json.loads(msg)
        join = message.get("cgroup")
        if join is not None and _join(join):
            _remove(cgroup)  # not renamed (the kernel refused, or the job has no cgroup)
        code = _become_leader(message["request"], fds[0], None)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.write(2, f"gpuhop: the job's leader failed: {type(e).__name__}: {e}\n".encode())
    finally:
        _exit(code)


def _ready_spare(server: Server, sock: socket.socket, spec: dict, cgroup) -> None:
    """A ready container's leader (ready.py): a session and a cgroup of its own (as a
    spare's: the request renames it), its container started, then wait for a job and become
    its leader with the container; end it (and so its container) if the server ends first,
    the container ends first (exit code ready.GONE), or no job came for READY_IDLE seconds."""
    code = 1
    held = None
    try:
        cgroup = _own_session(server, cgroup)
        leader._adopt_orphans()  # conmon, which parents the container's processes
        held = ready.Ready(spec)
        try:
            held.start()  # `podman run`, in this cgroup: a job's container is in its own
        except OSError as e:
            with contextlib.suppress(OSError):
                os.write(2, f"gpuhop: a ready container did not start: {e}\n".encode())
            code = ready.GONE
            raise _NoJob() from None
        code = 0
        try:
            sock.send(b"alone" if cgroup is None else b"ready")
            deadline = time.monotonic() + READY_IDLE
            msg, fds = b"", []  # type: tuple[bytes, list[int]]
            while time.monotonic() < deadline:
                left = deadline - time.monotonic()
                readable = select.select([sock, held.sock], [], [], left)[0]
                if sock in readable:
                    msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 1)
                    break
                if held.sock in readable and not held.poll():
                    code = ready.GONE
                    break
        except OSError:
            msg, fds = b"", []
        sock.close()
        if not msg or len(fds) != 1:
            raise _NoJob()
        message = json.loads(msg)
        join = message.get("cgroup")
        if join is not None and _join(join):
            _remove(cgroup)  # not renamed (the kernel refused, or the job has no cgroup)
        leader.READY = held
        code = _become_leader(message["request"], fds[0], None)
    except _NoJob:
        if held is not None:
            held.close()  # the container ends, and `podman run` with it
        if cgroup is not None:
            _join(os.path.dirname(cgroup))
            _remove(cgroup)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.write(2, f"gpuhop: the job's leader failed: {type(e).__name__}: {e}\n".encode())
    finally:
        _exit(code)


class _NoJob(Exception):
    """A ready container's leader ends without a job."""


def _become_leader(path: str, log: int, cgroup) -> int:
    """Take the job's log as output, read its request (and remove it), join `cgroup` if
    given, and run the leader."""
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
    if cgroup is not None:
        _join(cgroup)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    return leader.main(request["argv"], request.get("specs"))


def _exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--become"]:
        # One leader, of a fresh interpreter the agent started where this server could not
        # (LocalBackend.leader): its output is the job's log already, its request the file.
        _exit(_become_leader(sys.argv[2], 1, None))
    _cgroups = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else None
    sys.exit(Server(socket.socket(fileno=int(sys.argv[1])), _cgroups).serve())
