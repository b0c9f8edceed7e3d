"""slonk.pod.mount_namespaces on this machine's kernel. In a mount namespace of its own, as a pod
is, a namespace made on any CPU can be kept by a bind mount of its /proc file (what Slurm's
job_container/tmpfs does for every job) once the ids are ordered. The "pod" is made on the CPU
whose ids are furthest ahead, so that on Linux 6.18 and on, with more than one CPU, the other
CPUs' namespaces start behind it."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from slonk.pod import mount_namespaces

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount namespaces)")

MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 0x1000, 0x4000, 0x40000, 2
ROUNDS = 4  # namespaces made and kept per CPU
libc = ctypes.CDLL(None, use_errno=True)


def _in_child(action: Callable[[], str]) -> str:
    """`action` in a forked child (its namespaces die with it); what it returned or raised."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reports through the pipe
        try:
            os.close(read)
            try:
                said = action()
            except BaseException as err:  # whatever it was, the test reads it
                said = f"raised {type(err).__name__}: {err}"
            os.write(write, said.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return said


def _next_id(cpu: int) -> int:
    """The id a mount namespace made on `cpu` gets now."""

    def made() -> str:
        os.sched_setaffinity(0, {cpu})
        mount_namespaces.unshare()
        return str(mount_namespaces.namespace_id() or 0)

    return int(_in_child(made))


def _pod_ahead_of_the_other_cpus(directory: Path) -> None:
    """Become a pod: a mount namespace of its own, made on the CPU whose ids are furthest
    ahead (with per-CPU batches, another CPU's next namespace then has a smaller id), with a
    tmpfs of its own on `directory` to bind namespaces onto."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {max(cpus, key=_next_id)})
    mount_namespaces.unshare()
    os.sched_setaffinity(0, set(cpus))
    assert libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0
    assert libc.mount(b"tmpfs", str(directory).encode(), b"tmpfs", 0, None) == 0


def _keep_one_per_cpu(directory: Path) -> list[str]:
    """Make a namespace on each CPU, ROUNDS times, and keep each by a bind mount, as
    slurmstepd does; the CPUs where the bind failed, with why."""
    failed = []
    for round_ in range(ROUNDS):
        for cpu in sorted(os.sched_getaffinity(0)):
            ready, go = os.pipe(), os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - waits to be bound, then leaves
                try:
                    os.sched_setaffinity(0, {cpu})
                    mount_namespaces.unshare()
                    os.write(ready[1], b"x")
                    os.read(go[0], 1)
                finally:
                    os._exit(0)
            os.close(ready[1])  # a child that died unready ends the read below
            os.close(go[0])
            if os.read(ready[0], 1):
                target = directory / f"{round_}-{cpu}"
                target.touch()
                done = libc.mount(
                    f"/proc/{pid}/ns/mnt".encode(), bytes(target), None, MS_BIND, None
                )
                if done != 0:
                    failed.append(f"CPU {cpu}: {os.strerror(ctypes.get_errno())}")
                else:
                    libc.umount2(bytes(target), MNT_DETACH)
            else:
                failed.append(f"CPU {cpu}: the child could not make a namespace")
            os.write(go[1], b"x")
            os.waitpid(pid, 0)
            os.close(ready[0])
            os.close(go[1])
    return failed


def test_after_ordering_a_namespace_made_on_any_cpu_can_be_kept(tmp_path: Path):
    def pod() -> str:
        _pod_ahead_of_the_other_cpus(tmp_path)
        before = _keep_one_per_cpu(tmp_path)
        done = mount_namespaces.order_ids()
        after = _keep_one_per_cpu(tmp_path)
        return f"before: {len(before)} failed; {done}; after: {after}"

    said = _in_child(pod)
    assert said.endswith("after: []"), said


def test_a_pod_that_may_not_unshare_is_told_what_it_needs(tmp_path: Path):
    def pod() -> str:
        _pod_ahead_of_the_other_cpus(tmp_path)
        # Drop CAP_SYS_ADMIN (21) from the effective set, as a worker without it runs.
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        assert libc.capget(header, data) == 0
        data[0] &= ~(1 << 21)
        assert libc.capset(header, data) == 0
        try:
            return f"no error: {mount_namespaces.order_ids()}"
        except mount_namespaces.NamespaceError as err:
            return str(err)

    said = _in_child(pod)
    if "does not tell" in said:
        pytest.skip("this kernel does not tell mount namespace ids (before Linux 6.8)")
    assert "SYS_ADMIN in workers.capabilities" in said and "Operation not permitted" in said, said
