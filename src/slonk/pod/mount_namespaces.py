"""Mount namespace ids put in the order Slurm's job_container/tmpfs needs (Linux 6.18 and on).

job_container/tmpfs keeps each job's mount namespace (its own /tmp and /dev/shm) by
bind-mounting /proc/PID/ns/mnt of a process that unshared it onto a file under BasePath. The
kernel refuses that bind (EINVAL, its mount-loop check) unless the new namespace's id is
greater than the id of the namespace the bind is made in: the pod's. Since Linux 6.18 those
ids come from per-CPU batches, so a namespace made later on another CPU may get a smaller one.
Measured in a pod on 6.18.44: every bind made from one of two CPUs failed, and with it the
launch of every job started there.

Before slurmd starts, the pod advances each CPU it may run on until that CPU's next mount
namespace id is past the pod's own. A CPU's ids only grow, so binds made on those CPUs never
fail after. The CPUs are those of the pod's affinity at its start: a CPU added to the pod's
cpuset later (a shared CPU pool that grows, a CPU brought online) is not advanced. On 6.18 the
kernel draws every kind of namespace's id from one counter, so the CPU is advanced with UTS
namespaces, which copy nothing (a mount namespace copies the pod's mount table under a lock
the whole machine shares), and a mount namespace made after each round says when it is done.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct

from slonk.base.errors import SlonkError

CLONE_NEWNS, CLONE_NEWUTS = 0x00020000, 0x04000000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
NS_GET_MNTNS_ID = 0x8008B705  # _IOR(0xb7, 5, __u64), Linux 6.8 and on
ROUND = 256  # UTS namespaces made between two looks
# Past one batch (4,096 ids) a CPU's ids are fresh from the global counter, so past every id
# yet given. Where UTS namespaces did not advance them, each look advances by one: stop
# (and say so) rather than spin.
MOST_LOOKS = 3 * 4096
SCRATCH_MOUNT = b"/tmp"  # where the check mounts a tmpfs, in its own namespace only

_libc = ctypes.CDLL(None, use_errno=True)


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


def _call(what: str, result: int) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def unshare(flags: int = CLONE_NEWNS) -> None:
    _call("unshare", _libc.unshare(flags))


def _mount_as_a_job_does() -> None:
    """In a fresh namespace, what slurmstepd does in a job's before its /tmp: every mount made
    private, then a tmpfs mounted. A runtime profile that refuses mounts refuses these."""
    _call("mount --make-rprivate /", _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None))
    _call("mount tmpfs", _libc.mount(b"tmpfs", SCRATCH_MOUNT, b"tmpfs", 0, None))


def _advance(cpu: int, past: int) -> int:
    """In a child pinned to `cpu`: advance its ids until a new mount namespace's is past
    `past`, then mount in that namespace as a job would; how many namespaces it made."""
    os.sched_setaffinity(0, {cpu})
    made = 0
    for _ in range(MOST_LOOKS):
        unshare(CLONE_NEWNS)
        made += 1
        if (namespace_id() or 0) > past:
            _mount_as_a_job_does()
            return made
        for _ in range(ROUND):
            unshare(CLONE_NEWUTS)
        made += ROUND
    raise NamespaceError(f"CPU {cpu}: {made} namespaces made, no mount namespace id past {past}")


def _in_child(cpu: int, past: int) -> tuple[int, int]:
    """Fork a child that advances `cpu`; its PID and the pipe it answers on."""
    read, write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write)
        return pid, read
    try:  # pragma: no cover - the child answers through the pipe and never returns
        os.close(read)
        try:
            said = f"ok {_advance(cpu, past)}"
        except BaseException as err:  # anything: it must reach the parent, not unwind here
            said = f"error {err}"
        os.write(write, said.encode())
    finally:
        os._exit(0)


def order_ids() -> str:
    """Make every CPU this process may run on hand out mount namespace ids past this process's
    namespace's own; what was done. Raises NamespaceError when the pod may not make mount
    namespaces or mount in them (no CAP_SYS_ADMIN, or a seccomp or AppArmor profile that
    refuses unshare or mount)."""
    mine = namespace_id()
    if mine is None:
        return "the kernel does not tell namespace ids: they are in order"
    children: dict[int, tuple[int, int]] = {}
    answers: dict[int, str] = {}
    try:
        for cpu in sorted(os.sched_getaffinity(0)):
            children[cpu] = _in_child(cpu, mine)
    finally:  # every child forked is read and reaped, even when a fork failed
        for cpu, (pid, read) in children.items():
            with os.fdopen(read, "rb") as pipe:
                answers[cpu] = pipe.read().decode(errors="replace")
            os.waitpid(pid, 0)
    made = sum(int(a[3:]) for a in answers.values() if a.startswith("ok "))
    errors = [
        f"CPU {cpu}: {said.removeprefix('error ') or 'no answer'}"
        for cpu, said in answers.items()
        if not said.startswith("ok ")
    ]
    if errors:
        raise NamespaceError(
            "jobs get their own /tmp and /dev/shm (JobContainerType job_container/tmpfs) in mount "
            "namespaces the worker makes; it could not: " + "; ".join(errors)
            + " (it needs SYS_ADMIN in workers.capabilities, and a runtime profile that allows"
            " unshare and mount: workers.appArmorProfile, workers.seccompProfile)"
        )  # fmt: skip
    return f"{made} namespaces on {len(children)} CPUs, each CPU's ids now past {mine}"
