"""The seccomp filter a local pod runs under, in place of a runtime's default profile (the
chart's `seccompProfile: RuntimeDefault`), as a classic BPF program built here: local mode
has no runtime to take a profile from, and no libseccomp on every host.

It follows the default profile of containerd and Docker in what it refuses, not in its form
(theirs lists what is allowed): system calls that act on the whole machine, or let a process
reach into others' memory or kernel state, fail with EPERM, and those a capability would
allow stay allowed when the container has that capability (SYS_ADMIN: mounts, namespaces).
In the pod's user namespace most of them would fail anyway (the kernel checks the host's
capabilities); the filter takes the kernel's code for them out of the pod's reach. x86_64
only: elsewhere, and for a 32-bit or x32 call on x86_64, the pod gets no filter, or EPERM.
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Iterable, Sequence

# linux/audit.h, linux/seccomp.h, linux/filter.h, linux/prctl.h
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0 = 0, 4, 16  # struct seccomp_data (little-endian arg 0)
# clone(2) and unshare(2) flags that make namespaces (CLONE_NEWNS ... CLONE_NEWTIME).
NAMESPACE_FLAGS = 0x7E020080

# x86_64 numbers (asm/unistd_64.h) of what no pod may call.
ALWAYS = {
    "acct": 163, "add_key": 248, "clock_adjtime": 305, "clock_settime": 227,
    "create_module": 174, "delete_module": 176, "finit_module": 313, "get_kernel_syms": 177,
    "init_module": 175, "ioperm": 173, "iopl": 172, "kexec_file_load": 320, "kexec_load": 246,
    "keyctl": 250, "nfsservctl": 180, "open_by_handle_at": 304, "query_module": 178,
    "reboot": 169, "request_key": 249, "settimeofday": 164, "_sysctl": 156, "sysfs": 139,
    "uselib": 134, "userfaultfd": 323, "ustat": 136, "vhangup": 153,
}  # fmt: skip
# What a capability of the container allows (as in the default profile).
BY_CAPABILITY = {
    "SYS_ADMIN": {
        "bpf": 321, "fanotify_init": 300, "fsconfig": 431, "fsmount": 432, "fsopen": 430,
        "fspick": 433, "lookup_dcookie": 212, "mount": 165, "mount_setattr": 442,
        "move_mount": 429, "name_to_handle_at": 303, "open_tree": 428, "perf_event_open": 298,
        "pivot_root": 155, "quotactl": 179, "quotactl_fd": 443, "setns": 308, "swapoff": 168,
        "swapon": 167, "umount2": 166,
    },
    "SYS_PTRACE": {"kcmp": 312, "process_vm_readv": 310, "process_vm_writev": 311},
    "SYSLOG": {"syslog": 103},
}  # fmt: skip
# Without SYS_ADMIN, clone and unshare may not make namespaces; clone3 hides its flags in
# memory a filter cannot read, so it answers ENOSYS and the C library falls back to clone.
CLONE, UNSHARE, CLONE3 = 56, 272, 435


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return (code, jt, jf, k)


def _deny(numbers: Iterable[int]) -> list[tuple[int, int, int, int]]:
    program = []
    for nr in sorted(set(numbers)):
        program += [_insn(BPF_JEQ_K, nr, 0, 1), _insn(BPF_RET_K, SECCOMP_RET_ERRNO | EPERM)]
    return program


def _no_namespaces() -> list[tuple[int, int, int, int]]:
    """clone and unshare with a namespace flag: EPERM; clone3: ENOSYS."""
    program = [_insn(BPF_JEQ_K, CLONE3, 0, 1), _insn(BPF_RET_K, SECCOMP_RET_ERRNO | ENOSYS)]
    for nr in (CLONE, UNSHARE):
        program += [
            _insn(BPF_JEQ_K, nr, 0, 4),
            _insn(BPF_LD_W_ABS, OFFSET_ARG0),
            _insn(BPF_JSET_K, NAMESPACE_FLAGS, 0, 1),
            _insn(BPF_RET_K, SECCOMP_RET_ERRNO | EPERM),
            _insn(BPF_RET_K, SECCOMP_RET_ALLOW),
        ]
    return program


def program(capabilities: Sequence[str] | None) -> list[tuple[int, int, int, int]]:
    """The filter for a container with these capabilities (None: all, privileged)."""
    caps = set(capabilities) if capabilities is not None else set(BY_CAPABILITY)
    denied = [*ALWAYS.values()]
    for cap, calls in BY_CAPABILITY.items():
        if cap not in caps:
            denied += calls.values()
    return [
        _insn(BPF_LD_W_ABS, OFFSET_ARCH),
        _insn(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        _insn(BPF_RET_K, SECCOMP_RET_ERRNO | EPERM),
        _insn(BPF_LD_W_ABS, OFFSET_NR),
        _insn(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        _insn(BPF_RET_K, SECCOMP_RET_ERRNO | EPERM),
        *_deny(denied),
        *([] if "SYS_ADMIN" in caps else _no_namespaces()),
        _insn(BPF_RET_K, SECCOMP_RET_ALLOW),
    ]


class _Filter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def supported() -> bool:
    return platform.machine() == "x86_64"


def install(capabilities: Sequence[str] | None) -> None:
    """Put this process (and all it starts) under the filter. It needs CAP_SYS_ADMIN in its
    user namespace (or no_new_privs): a pod's PID 1 has it until it execs its command."""
    instructions = program(capabilities)
    filters = (_Filter * len(instructions))(*(_Filter(*i) for i in instructions))
    prog = _Program(len(instructions), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the pod's seccomp filter")
