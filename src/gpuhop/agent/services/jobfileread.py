"""Runs in the agent: reading a job's own files (its artifacts, its /tmp) while the job may
still be changing them, for its owner's downloads and listings.

The agent reads them as root on a team agent, and a running job can swap any file or dir
of its artifacts for a link (to `tokens.db`, `/etc/shadow`) or a FIFO between a look at a
path and its open. So nothing here opens a path: each dir is entered from the one above it
as a dir and never through a link (O_DIRECTORY | O_NOFOLLOW), the file is opened the same
way and without blocking (a FIFO), and what is sent is the file that was opened and checked
to be a regular one, whatever its name leads to by then.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from mimetypes import guess_type
from pathlib import Path
from typing import Any

from starlette.responses import FileResponse
from starlette.types import Receive, Scope, Send

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class OpenedFile:
    """A job's regular file, opened to be sent (OpenedFileResponse closes it)."""

    fd: int
    name: bytes
    """Its path under the dir it was opened in."""


class LinkOnTheWay(Exception):
    """A link (a file or a dir of the path) where a job's file was asked for."""


def open_file(root: Path, name: bytes) -> OpenedFile:
    """The regular file `root/name` (a relative path, checked), opened with each dir on the
    way entered without following a link. Raises LinkOnTheWay for a link on the way,
    FileNotFoundError where there is no such regular file (or a dir of the path is not one)."""
    parts = name.split(b"/")
    fd = _open_dir(root, parts[:-1])
    try:
        try:
            file = os.open(parts[-1], FILE_FLAGS, dir_fd=fd)
        except OSError as e:
            raise _refusal(e) from None
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file).st_mode):
        os.close(file)
        raise FileNotFoundError(os.fsdecode(name))
    return OpenedFile(file, name)


def regular_files(
    root: Path, under: list[bytes] | None = None
) -> Iterator[tuple[bytes, os.stat_result]]:
    """The regular files under `root/under...` (links neither followed nor given), as their
    paths under that dir and their stat, each dir's files sorted, then its subdirs sorted.
    Nothing where that dir is missing or a link is on the way to it."""
    try:
        top = _open_dir(root, under or [])
    except (LinkOnTheWay, FileNotFoundError):
        return
    opened = [top]
    try:
        pending = [(b"", _listing(top))]
        while pending:
            prefix, subdirs = pending[-1]
            name = next(subdirs, None)
            if name is None:
                pending.pop()
                os.close(opened.pop())
                continue
            if isinstance(name, tuple):  # a file: its name and stat
                yield prefix + name[0], name[1]
                continue
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=opened[-1])
            except OSError:  # removed, or swapped for a link or a file, since it was listed
                continue
            opened.append(sub)
            pending.append((prefix + name + b"/", _listing(sub)))
    finally:
        for fd in opened:
            os.close(fd)


def _listing(dir_fd: int) -> Iterator[tuple[bytes, os.stat_result] | bytes]:
    """What the open dir holds: its regular files (name, stat) sorted, then its subdirs'
    names sorted."""
    files: list[tuple[bytes, os.stat_result]] = []
    dirs: list[bytes] = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            name = os.fsencode(entry.name)
            if stat.S_ISDIR(st.st_mode):
                dirs.append(name)
            elif stat.S_ISREG(st.st_mode):
                files.append((name, st))
    return iter([*sorted(files, key=lambda f: f[0]), *sorted(dirs)])


def _open_dir(root: Path, parts: list[bytes]) -> int:
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts:
            try:
                sub = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                raise _refusal(e) from None
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refusal(e: OSError) -> Exception:
    """What an open's error says of the path: a link on it, or no such file there."""
    if e.errno == errno.ELOOP:
        return LinkOnTheWay()
    if isinstance(e, (FileNotFoundError, NotADirectoryError)):
        return FileNotFoundError(e.filename)
    return e


class OpenedFileResponse(FileResponse):
    """A file the agent opened (`open_file`), sent as FileResponse sends one (ranges, HEAD)
    from that open file, through `/proc/self/fd`: never from whatever its path leads to by
    the time it is sent. The fd is closed once the response has been sent, or failed.
    Without a `media_type`, the one its name suggests, as FileResponse guesses from a path."""

    def __init__(self, opened: OpenedFile, **kwargs: Any) -> None:
        self.fd = opened.fd
        text = opened.name.decode("utf-8", "replace")
        kwargs.setdefault("media_type", guess_type(text)[0] or "application/octet-stream")
        super().__init__(f"/proc/self/fd/{self.fd}", stat_result=os.fstat(self.fd), **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            os.close(self.fd)
