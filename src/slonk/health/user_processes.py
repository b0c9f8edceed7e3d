"""A user's processes on this node (this pod's PID namespace), as /proc shows them, and
ending them all: what a user left behind (slonk.health.leftovers), or a user over their share
of a pod's resources (slonk.pod.srun_ports). Small, for the Epilog's path."""

from __future__ import annotations

import os
from collections.abc import Iterator

# How long the ended processes may take to leave /proc (a process in uninterruptible sleep
# dies only once its I/O returns): the caller then says what is still there.
END_SECONDS = 5.0
# Debian's SYS_UID_MAX: a system account's processes (a daemon's user) are never ended.
SYSTEM_UID_MAX = 999


def end_processes(uid: int, wait: float = END_SECONDS) -> tuple[int, int]:
    """Kill every process whose real or saved uid is `uid` (kill(-1)'s rule) in this PID
    namespace, and wait up to `wait` seconds for them to be gone: how many went, and how many
    are still there; (0, 0) for root or a system account, whose processes are never ended.

    Root does it, holding each process by a pidfd (a PID reused meanwhile is never hit): it
    first stops every one it finds, pass after pass until a pass finds none new (a stopped
    process forks no more), then kills them all. Nothing runs as the user, who could stop or
    kill a helper of their own uid before it acted, and hang the Epilog waiting on it."""
    import signal
    import time

    if uid <= SYSTEM_UID_MAX:  # root is 0
        return 0, 0
    deadline = time.monotonic() + wait
    held: dict[int, int] = {}  # pid -> pidfd
    try:
        while time.monotonic() < deadline:
            new = 0
            for pid in _pids():
                if pid in held:
                    continue
                try:
                    fd = os.pidfd_open(pid)
                except OSError:
                    continue  # ended meanwhile
                try:
                    if uid in _real_and_saved(pid):  # read once it is held: not a reused PID
                        signal.pidfd_send_signal(fd, signal.SIGSTOP)
                        held[pid], fd, new = fd, -1, new + 1
                except OSError:
                    pass  # ended meanwhile
                finally:
                    if fd >= 0:
                        os.close(fd)
            if not new:
                break
        for fd in held.values():
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                continue  # ended meanwhile
    finally:
        for fd in held.values():
            os.close(fd)
    while processes(uid) and time.monotonic() < deadline:
        time.sleep(0.02)  # killed: only the kernel's teardown and their parents' reaping left
    still = len(processes(uid))
    return max(len(held) - still, 0), still


def _pids(proc: str = "/proc") -> list[int]:
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def _real_and_saved(pid: int) -> tuple[int, int]:
    """A process's real and saved uids (/proc/PID/status: real, effective, saved, fs)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Uid:"):
                real, _effective, saved, _fs = line.split()[1:5]
                return int(real), int(saved)
    raise OSError(f"/proc/{pid}/status names no Uid")


def runs_processes(uid: int, proc: str = "/proc") -> bool:
    """Whether any process on the node runs as `uid`."""
    return any(owner == uid for _, owner in _owners(proc))


def processes(uid: int, proc: str = "/proc") -> list[str]:
    """The PIDs of the processes on the node running as `uid`."""
    return [pid for pid, owner in _owners(proc) if owner == uid]


def running_users(proc: str = "/proc") -> set[int]:
    """The users (not root or a system account) running a process on the node."""
    return {owner for _, owner in _owners(proc) if owner > SYSTEM_UID_MAX}


def _owners(proc: str) -> Iterator[tuple[str, int]]:
    """Every process on the node (its PID) with its effective user, which owns its /proc
    entry."""
    for name in os.listdir(proc):
        if name.isdigit():
            try:
                yield name, os.stat(f"{proc}/{name}").st_uid
            except OSError:  # ended meanwhile
                continue
