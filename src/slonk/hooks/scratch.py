"""What a user leaves in a node's scratch goes with their last job there (issue 28).

Jobs share the worker's /tmp, /var/tmp and /dev/shm: files one job leaves behind fill them for
every later job, and a full scratch between jobs would drain the node (the health check
`scratch`), a machine taken out of service for one user's files. So each Epilog removes the
entries the job's user owns at the top of each scratch directory, unless that user still runs a
process on the node (another of their jobs, or an ssh session adopted into one): those may be
using them. The check `scratch`, finding its directory full with no job on the node, first
does the same for every user who left entries there (an Epilog that did not run, a session's
files), and judges what is left.

The removal runs as the user, never as root: whatever the user put there (links to root's
files, directories renamed mid-walk) can lead it only to what the user could delete anyway.
An entry changed after the Epilog began is kept: a job of theirs starting meanwhile owns it.
Bounded in time (TIMEOUT_SECONDS); what is left after that stays, and the log says so.

Runs for every job (slonk.hooks.dispatch), so it imports only what it uses."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing's: see slonk.hooks.dispatch
if TYPE_CHECKING:
    from collections.abc import Mapping

SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
TIMEOUT_SECONDS = 60.0
NOGROUP = 65534
# As the user: a directory they made read-only is still theirs to empty.
REMOVE = 'chmod -R u+rwx -- "$@" 2>/dev/null; exec rm -rf --one-file-system -- "$@"'


def after_job(environ: Mapping[str, str] = os.environ, dirs: tuple[str, ...] = SCRATCH_DIRS) -> str:
    """The Epilog's part: the ending job's user's entries (Slurm names the user in the
    Epilog's environment); what was done."""
    import time

    since = time.time()
    uid, gid = environ.get("SLURM_JOB_UID", ""), environ.get("SLURM_JOB_GID", "")
    if not (uid.isascii() and uid.isdigit()):
        return ""
    group = int(gid) if gid.isascii() and gid.isdigit() else NOGROUP
    return clean(int(uid), group, since, dirs)


def owners(folder: str) -> dict[int, int]:
    """The users (and a group of each) owning entries at the top of `folder`, root aside."""
    found: dict[int, int] = {}
    try:
        entries = os.scandir(folder)
    except OSError:
        return found
    with entries:
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid:
                found.setdefault(st.st_uid, st.st_gid)
    return found


def clean_left_behind(folder: str, since: float, timeout: float = TIMEOUT_SECONDS) -> list[str]:
    """`clean` for every user with entries at the top of `folder`, all within `timeout`;
    what was done."""
    import time

    deadline = time.monotonic() + timeout
    said = []
    for uid, gid in owners(folder).items():
        left = deadline - time.monotonic()
        if left <= 0:
            said.append(f"scratch: out of time before uid {uid}'s entries")
            break
        said.append(clean(uid, gid, since, (folder,), timeout=left))
    return [s for s in said if s]


def runs_processes(uid: int, proc: str = "/proc") -> bool:
    """Whether any process on the node runs as `uid` (a /proc/PID entry is owned by its
    process's effective user)."""
    for name in os.listdir(proc):
        if name.isdigit():
            try:
                if os.stat(f"{proc}/{name}").st_uid == uid:
                    return True
            except OSError:  # ended meanwhile
                continue
    return False


def clean(
    uid: int,
    gid: int,
    since: float,
    dirs: tuple[str, ...] = SCRATCH_DIRS,
    proc: str = "/proc",
    timeout: float = TIMEOUT_SECONDS,
) -> str:
    """Remove `uid`'s entries at the top of `dirs` last changed before `since` (a time.time()),
    as that user; what was done, in a few words ("" when nothing was there)."""
    import subprocess

    if uid == 0:
        return ""  # root's files are the node's own
    if runs_processes(uid, proc):
        return f"scratch kept: uid {uid} still runs processes on the node"
    present = [d for d in dirs if os.path.isdir(d)]
    if not present:
        return ""
    find = [
        "find", *present, "-mindepth", "1", "-maxdepth", "1", "-uid", str(uid),
        "!", "-newermt", f"@{since:.9f}", "-print", "-exec", "sh", "-c", REMOVE, "sh", "{}", "+",
    ]  # fmt: skip
    try:
        child = subprocess.Popen(
            find,
            user=uid,
            group=gid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as err:
        return f"scratch: could not remove uid {uid}'s entries: {err}"
    try:
        out, err_out = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        import signal

        os.killpg(child.pid, signal.SIGKILL)  # find and the rm it runs
        child.communicate()
        return f"scratch: uid {uid}'s entries not all removed within {timeout:g} s"
    removed = len(out.splitlines())
    said = f"scratch: removed {removed} entries uid {uid} left" if removed else ""
    if child.returncode:
        problem = (err_out.strip().splitlines() or [f"exit {child.returncode}"])[-1]
        said = f"{said}; " if said else ""
        said += f"scratch: some of uid {uid}'s entries stay: {problem}"
    return said
