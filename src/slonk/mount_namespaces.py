"""Mount namespace ids put in the order Slurm's job_container/tmpfs needs (Linux 6.18 and on).

job_container/tmpfs keeps each job's mount namespace (its own /tmp and /dev/shm) by
bind-mounting /proc/PID/ns/mnt of a process that unshared it onto a file under BasePath. The
kernel refuses that bind (EINVAL, its mount-loop check) unless the new namespace's id is
greater than the id of the namespace the bind is made in: the pod's. Since Linux 6.18 those
ids come from per-CPU batches, so a namespace made later on another CPU may get a smaller one.
Measured in a pod on 6.18.44: every bind made from one of two CPUs failed, and every job
launched there with it. Before slurmd starts, the pod makes and drops mount namespaces on each
CPU it may run on until that CPU's ids are past the pod's own. A CPU's ids only grow, so no
bind fails after; it costs at most one batch (4,096 namespaces) a CPU, about 0.6 s measured.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct

from slonk.errors import SlonkError

CLONE_NEWNS = 0x00020000
MS_REC, MS_SLAVE = 0x4000, 0x80000
NS_GET_MNTNS_ID = 0x8008B705  # _IOR(0xb7, 5, __u64), Linux 6.8 and on
# Past one batch a CPU's ids are fresh from the global counter, so past every id yet given.
# More than that means something else is wrong: stop rather than spin.
MOST_PER_CPU = 3 * 4096


class NamespaceError(SlonkError):
    """The pod cannot give jobs mount namespaces of their own."""


def namespace_id(path: str = "/proc/self/ns/mnt") -> int | None:
    """The mount namespace's id, or None where the kernel does not tell (before Linux 6.8:
    ids were then handed out in order)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = fcntl.ioctl(fd, NS_GET_MNTNS_ID, bytes(8))
    except OSError as err:
        if err.errno in (errno.ENOTTY, errno.EINVAL):
            return None
        raise
    finally:
        os.close(fd)
    return int(struct.unpack("Q", raw)[0])


def _unshare() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def _mount_slave() -> None:
    """Make every mount of this (new) namespace a slave of the pod's, as slurmstepd does in a
    job's before mounting its /tmp: a runtime profile that refuses mounts refuses this."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"mount: {os.strerror(number)}")


def _advance(cpu: int, past: int) -> int:
    """In a child pinned to `cpu`: make namespaces until one's id is past `past`; how many.
    The last one is made a slave, as a job's is: where mounts are refused, jobs would fail."""
    os.sched_setaffinity(0, {cpu})
    for made in range(1, MOST_PER_CPU + 1):
        _unshare()
        if (namespace_id() or 0) > past:
            _mount_slave()
            return made
    raise NamespaceError(f"CPU {cpu}: {MOST_PER_CPU} mount namespaces, none past id {past}")


def order_ids() -> str:
    """Make every CPU this process may run on hand out mount namespace ids past this process's
    namespace's own; what was done. Raises NamespaceError when the pod may not make mount
    namespaces or mount in them (no CAP_SYS_ADMIN, or a seccomp or AppArmor profile that
    refuses unshare or mount)."""
    mine = namespace_id()
    if mine is None:
        return "the kernel does not tell namespace ids: they are in order"
    children = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            os.close(read)
            try:
                said = f"ok {_advance(cpu, mine)}"
            except (OSError, SlonkError) as err:
                said = f"error {err}"
            os.write(write, said.encode())
            os._exit(0)
        os.close(write)
        children[cpu] = (pid, read)
    made, errors = 0, []
    for cpu, (pid, read) in children.items():
        with os.fdopen(read, "rb") as pipe:
            said = pipe.read().decode(errors="replace")
        os.waitpid(pid, 0)
        if said.startswith("ok "):
            made += int(said[3:])
        else:
            errors.append(f"CPU {cpu}: {said.removeprefix('error ') or 'no answer'}")
    if errors:
        raise NamespaceError(
            "jobs get their own /tmp and /dev/shm (JobContainerType job_container/tmpfs) in mount "
            "namespaces the worker makes; it could not: " + "; ".join(errors)
            + " (it needs SYS_ADMIN in workers.capabilities, and a runtime profile that allows"
            " unshare and mount: workers.appArmorProfile, workers.seccompProfile)"
        )  # fmt: skip
    return f"{made} namespaces on {len(children)} CPUs, each CPU's ids now past {mine}"
