"""Replacing files so that no reader ever sees half of one, and locks on shared volumes."""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import tempfile
from collections.abc import Iterator
from pathlib import Path


def owner_ids(user: str, group: str | None = None) -> tuple[int, int]:
    """uid and gid by name: ids differ between images and hosts, names do not."""
    entry = pwd.getpwnam(user)
    gid = entry.pw_gid
    if group is not None:
        gid = grp.getgrnam(group).gr_gid
    return entry.pw_uid, gid


def write_atomically(
    path: Path, data: str | bytes, mode: int = 0o644, owner: str | None = None
) -> None:
    """Write `path` through a temporary file and one rename; `owner` is a user name."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        if owner is not None:
            os.chown(tmp, *owner_ids(owner))
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def make_dir(path: Path, mode: int, owner: str = "root") -> None:
    """Create `path` if needed and set its mode and owner (by name)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)
    os.chown(path, *owner_ids(owner))


@contextlib.contextmanager
def exclusive(path: Path, wait: bool = True) -> Iterator[bool]:
    """An flock on `path`, made 0600 if missing and never opened through a link (the state
    volume is SlurmUser's too): True once held; False when `wait` is off and another process
    holds it. Open for writing, so that it holds across hosts on NFS mounted with locking,
    which makes flock a byte-range lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
