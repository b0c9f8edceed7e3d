"""A user's processes on this node (this pod's PID namespace), as /proc shows them, and
ending them all: what a user left behind (slonk.hooks.leftovers), or a user over their share
of a pod's resources (slonk.srun_ports). Small, for the Epilog's path."""

from __future__ import annotations

import os

# How long the ended processes may take to leave /proc (a process in uninterruptible sleep
# dies only once its I/O returns): the caller then says what is still there.
END_SECONDS = 5.0
# Debian's SYS_UID_MAX: a system account's processes (a daemon's user) are never ended.
SYSTEM_UID_MAX = 999
NOGROUP = 65534  # a group to run as where the user's own is not known: kill(-1) asks only the uid


def end_processes(uid: int, gid: int, wait: float = END_SECONDS) -> tuple[int, int]:
    """Kill every process `uid` runs in this PID namespace, from a child running as `uid`
    (kill(-1): all of theirs at once, so a process forking as fast as it can does not outrun
    it, and nothing of anyone else's), and wait up to `wait` seconds for them to be gone: how
    many went, and how many are still there, of those /proc shows (kill(-1) reaches those it
    hides too); (0, 0) for root or a system account, whose processes are never ended. OSError:
    kill could not be run."""
    import subprocess
    import time

    if uid <= SYSTEM_UID_MAX:  # root is 0
        return 0, 0
    found = len(processes(uid))
    try:
        subprocess.run(
            ["kill", "-KILL", "--", "-1"],  # the one form procps 3 and 4 both read as kill(-1)
            user=uid,
            group=gid,
            extra_groups=[],
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,  # its status is 1 even when all went: what is left is counted below
            timeout=wait,
        )
    except subprocess.TimeoutExpired as err:
        raise OSError(f"kill did not return within {wait:g} s") from err
    deadline = time.monotonic() + wait
    while processes(uid) and time.monotonic() < deadline:
        time.sleep(0.02)  # killed: only the kernel's teardown and their parents' reaping left
    still = len(processes(uid))
    return found - still, still


def runs_processes(uid: int, proc: str = "/proc") -> bool:
    """Whether any process on the node runs as `uid`."""
    return bool(processes(uid, proc))


def processes(uid: int, proc: str = "/proc") -> list[str]:
    """The PIDs of the processes on the node running as `uid` (a /proc/PID entry is owned by
    its process's effective user)."""
    found = []
    for name in os.listdir(proc):
        if name.isdigit():
            try:
                if os.stat(f"{proc}/{name}").st_uid == uid:
                    found.append(name)
            except OSError:  # ended meanwhile
                continue
    return found
