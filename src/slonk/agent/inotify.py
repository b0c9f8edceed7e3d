"""A minimal binding to Linux inotify through libc (ctypes).

Why ctypes: the standard library has no inotify, Debian's python3-pyinotify is unmaintained
and python3-watchdog is a large framework with its own threads; the agent needs four libc
calls (inotify_init1, inotify_add_watch, inotify_rm_watch, read) and the event layout, which
is a stable kernel ABI. Nothing is installed into the images for it.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# Anything that changes which file a name in the directory is, or a file's content: kubelet's
# and git-sync's symlink swaps are IN_MOVED_TO (a rename over the link), an editor's save
# IN_CLOSE_WRITE or IN_MOVED_TO; the directory itself going away ends the watch.
DIRECTORY_CHANGES = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
    | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
)  # fmt: skip

_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)


@dataclass(frozen=True)
class Event:
    wd: int
    mask: int
    name: str


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)  # the process' own libc: no search, no path
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def _check(result: int, what: str) -> int:
    if result < 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")
    return result


class Inotify:
    """One inotify instance (one of fs.inotify.max_user_instances): watches and their
    events. OSError from the constructor means inotify is not available (EMFILE: the user's
    instances are used up; ENOSYS: no inotify in this kernel or sandbox)."""

    def __init__(self) -> None:
        self._lib = _libc()
        self.fd = _check(self._lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")

    def add_watch(self, path: Path, mask: int = DIRECTORY_CHANGES) -> int:
        return _check(
            self._lib.inotify_add_watch(self.fd, os.fsencode(path), mask), f"watch {path}"
        )

    def rm_watch(self, wd: int) -> None:
        self._lib.inotify_rm_watch(self.fd, wd)  # a watch the kernel dropped already: no matter

    def read(self) -> list[Event]:
        """The events queued now (none if there are none: the descriptor never blocks)."""
        try:
            data = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return []
        return list(parse(data))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def parse(data: bytes) -> Iterator[Event]:
    offset = 0
    while offset + _HEADER.size <= len(data):
        wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        raw = data[offset : offset + length]
        offset += length
        yield Event(wd, mask, os.fsdecode(raw.rstrip(b"\0")))
