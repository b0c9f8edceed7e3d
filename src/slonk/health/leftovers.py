"""What a user leaves on a node goes with their last job there (issue 28).

Jobs share the worker's processes, /tmp, /var/tmp and /dev/shm. A process that escaped its
job (daemonised out of the job's process tree, where no cgroup holds it) keeps running for
nobody, holding memory, GPUs or ports, and files a job left fill scratch for every later job:
a full scratch between jobs would drain the node (the health check `scratch`), a machine taken
out of service for one user's files. So each Epilog, once Slurm shows no other job of the
user on the node, ends every process the user still runs there (a worker admits no one
without a job: pam_slurm_adopt) and removes the entries they own at the top of each scratch
directory. The check `scratch`, finding its directory full with no job on the node at all,
first does the same for every user who left entries there (an Epilog that did not run), and
judges what is left.

Root ends the processes by uid (slonk.health.user_processes: stopped first, so a process forking as
fast as it can does not outrun it, and nothing of root's or another user's is hit). The
removal runs as the user, never as root: it can lead only to what the user could change
anyway, and follows no link; an entry whose inode changed
after the Epilog began stays (a job of theirs starting meanwhile owns it): the change time,
which a user cannot set back as they can a modification time. Bounded in time
(TIMEOUT_SECONDS); what is left after that stays, and the log says so. Whatever goes wrong
here is said and never fails the Epilog: Slurm drains a node whose Epilog fails.

Runs for every job (slonk.hooks.dispatch), so it imports only what it uses."""

from __future__ import annotations

import os

from slonk.health.user_processes import END_SECONDS, end_processes, runs_processes

TYPE_CHECKING = False  # not typing's: see slonk.hooks.dispatch
if TYPE_CHECKING:
    from collections.abc import Mapping

SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
TIMEOUT_SECONDS = 60.0
NOGROUP = 65534
# As the user, given the entries: their own directories made writable (find follows no link,
# not even one named on its command line), then removed, staying on each entry's file system.
REMOVE = (
    'find "$@" -type d ! -perm -u=rwx -print0 2>/dev/null | xargs -0r chmod u+rwx -- 2>/dev/null; '
    'exec rm -rf --one-file-system -- "$@"'
)


def after_job(environ: Mapping[str, str] = os.environ, dirs: tuple[str, ...] = SCRATCH_DIRS) -> str:
    """The Epilog's part: the ending job's user's processes and entries (Slurm names the user,
    the job and the node in the Epilog's environment); what was done."""
    import time

    since = time.time()
    uid, gid = environ.get("SLURM_JOB_UID", ""), environ.get("SLURM_JOB_GID", "")
    if not (uid.isascii() and uid.isdigit()) or int(uid) == 0:
        return ""
    left_files = any(int(uid) in owners(d) for d in dirs)
    if not left_files and not runs_processes(int(uid)):
        return ""  # nothing of theirs: no question for slurmctld
    other = other_job(int(uid), environ.get("SLURM_JOB_ID", ""), environ.get("SLURMD_NODENAME", ""))
    if other:
        return f"left as they are: uid {uid} {other}"
    group = int(gid) if gid.isascii() and gid.isdigit() else NOGROUP
    return clear(int(uid), group, since, dirs if left_files else ())


def clear(
    uid: int, gid: int, since: float, dirs: tuple[str, ...], timeout: float = TIMEOUT_SECONDS
) -> str:
    """End `uid`'s processes, then remove their entries in `dirs` if none is left; what was
    done. The caller has made sure the user has no job on the node."""
    wait = min(END_SECONDS, timeout)
    try:
        ended, still = end_processes(uid, wait)
        said = [f"processes: ended {ended} uid {uid} left on the node" if ended else ""]
        if still:
            said.append(f"processes: {still} of uid {uid} still there after {wait:g} s")
    except OSError as err:
        said = [f"processes: could not end uid {uid}'s: {err}"]
    if runs_processes(uid):
        said.append(f"scratch kept: uid {uid} still runs processes on the node")
    else:
        said.append(clean(uid, gid, since, dirs, timeout))
    return "; ".join(s for s in said if s)


def other_job(uid: int, job: str, node: str) -> str:
    """Why the user may still need their processes and entries here ("" when nothing says
    so): another of their jobs on this node as slurmctld shows it, or slurmctld not answering
    (unsure: kept, and the check `scratch` looks again once no job is on the node). Not one
    that is ending (COMPLETING): it needs nothing more, and two of the user's jobs ending
    together would each keep everything for the other."""
    from slonk.slurm import slurm_nodes

    query = [
        "squeue", "--noheader", "--format=%A", f"--user={uid}", f"--nodelist={node}",
        "--states=RUNNING,SUSPENDED,CONFIGURING",
    ]  # fmt: skip
    try:
        found = slurm_nodes.run(query).split()
    except slurm_nodes.SlurmError as err:
        return f"not known to have no other job here: {err}"
    others = [j for j in found if j != job]
    return f"has another job on the node ({others[0]})" if others else ""


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
    """`clear` for every user with entries at the top of `folder` (one of SCRATCH_DIRS, node
    local: never a site's shared scratch, whose files jobs elsewhere use), all within
    `timeout`; what was done. The caller has made sure no job is on the node."""
    import time

    if folder not in SCRATCH_DIRS:
        return []
    deadline = time.monotonic() + timeout
    said = []
    for uid, gid in owners(folder).items():
        left = deadline - time.monotonic()
        if left <= 0:
            said.append(f"scratch: out of time before uid {uid}'s entries")
            break
        said.append(clear(uid, gid, since, (folder,), timeout=left))
    return [s for s in said if s]


def clean(
    uid: int, gid: int, since: float, dirs: tuple[str, ...], timeout: float = TIMEOUT_SECONDS
) -> str:
    """Remove `uid`'s entries at the top of `dirs` whose inode last changed before `since`
    (a time.time()), as that user; what was done, in a few words ("" when nothing was
    there). The caller has made sure the user no longer needs them."""
    import subprocess

    from slonk.base.text import printable

    present = [d for d in dirs if os.path.isdir(d)]
    if uid == 0 or not present:
        return ""  # root's files are the node's own
    find = [
        "find", *present, "-mindepth", "1", "-maxdepth", "1", "-uid", str(uid),
        "!", "-newerct", f"@{since:.9f}", "-print0", "-exec", "sh", "-c", REMOVE, "sh", "{}", "+",
    ]  # fmt: skip
    try:
        child = subprocess.Popen(
            find,
            user=uid,
            group=gid,
            extra_groups=[],
            cwd="/",  # the Epilog's own may be closed to the user
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
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
    found = [p for p in out.split(b"\0") if p]
    removed = sum(not os.path.lexists(p) for p in found)
    said = f"scratch: removed {removed} entries uid {uid} left" if removed else ""
    if removed < len(found):
        problem = err_out.decode(errors="backslashreplace").strip().splitlines()
        stay = f"{len(found) - removed} of uid {uid}'s entries stay"
        said = f"{said}; " if said else "scratch: "
        said += f"{stay}: {printable(problem[-1])}" if problem else stay  # names a user chose
    return said
