"""Inside a new local pod's namespaces: make its root filesystem, then exec its command.

Run by `slonk local` (host runtime) as PID 1 of a fresh PID, mount, UTS and IPC namespace,
already joined to the pod's network namespace, as a container runtime would start a
container: the root is an overlay whose lower layers are the image's own (as the container
store keeps them) and whose upper layer is the pod's, thrown away with it. Into it go a
fresh /proc (the kernel's settings and triggers in it read-only or hidden, as runc does), a
read-only /sys, a /dev of its own, tmpfs /run and /tmp, and the pod's volumes; then the pod
pivots into it and the host's root is detached. Nothing of the host is left in the pod but
what was bound in: its volumes (and, from a checkout, the checkout itself).

Last, the pod moves into a user namespace of its own (uids mapped one to one: files keep
their owners) with a new mount namespace in it, and execs its command under the container's
securityContext. Its root's capabilities then act on what that namespace owns, not on the
host (no module, no kernel setting, no cgroup), and every mount it was given is locked, as
the kernel locks mounts it hands to a less privileged namespace: a read-only one stays
read-only, and none can be unmounted to reveal what lies under it. Even a pod the chart
makes privileged, or that keeps SYS_ADMIN (workers, for cgroups), cannot write the host's
checkout or the state directory the host's root runs `slonk local` from.

The node acceptance test (tests/node) runs the chart's pods here as Kubernetes does on a real
node: no user namespace (`userNamespace: false`), a cgroup of the machine's v2 tree with a
cgroup namespace rooted there (`cgroup`), cgroupfs mounted as a runtime mounts it
(`cgroupfs`), the machine's GPU devices (`devices`), and single files bound in (the host's
nvidia-smi and NVML, as the NVIDIA container toolkit binds them).
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slonk.local import seccomp

# mount(2) flags (linux/mount.h).
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND = 0x20, 0x1000
MNT_DETACH = 2
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWCGROUP = 0x20000, 0x10000000, 0x02000000
OLD_ROOT = "/run/.host"
# uid 0 of the pod is the host's (every uid is mapped to itself) so that the images' and the
# volumes' files keep their owners: 2^32 - 1 ids, all but the invalid (uid_t)-1.
ID_MAP = "0 0 4294967295\n"
# What a container's /dev holds (as OCI runtimes make it), each the pod's own node: a bind
# of the host's would let the pod's root chmod or chown the host's /dev/null.
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8),
           "urandom": (1, 9), "tty": (5, 0)}  # fmt: skip
# runc's defaults: /proc/sys and the triggers are the machine's (sysctl checks only that the
# writer's uid is 0, and the pod's uid 0 is the host's), made read-only; what shows the
# kernel's memory, keys or devices is hidden. Paths a kernel lacks are skipped.
PROC_READ_ONLY = ("bus", "fs", "irq", "sys", "sysrq-trigger")
PROC_MASKED = ("acpi", "asound", "kcore", "keys", "latency_stats", "timer_list",
               "timer_stats", "sched_debug", "scsi")  # fmt: skip
SYS_MASKED = ("firmware", "devices/virtual/powercap")
# The per-network-namespace sysctl a runtime sets for a container allowed to bind low ports
# (NET_BIND_SERVICE): the pod's network namespace is not its user namespace's, so the
# capability would not reach it.
# What containerd and CRI-O give a container that neither drops ALL nor is privileged.
RUNTIME_DEFAULT_CAPABILITIES = (
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
)  # fmt: skip
FAKE_NVIDIA_SMI = "/usr/bin/nvidia-smi"
SLONK_PYTHON = "/opt/slonk/bin/python3"  # the images' (images/base/Dockerfile)
UNPRIVILEGED_PORT_START = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
    "ptmx": "pts/ptmx",
}
_libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str = "") -> None:
    if _libc.mount(source.encode(), target.encode(), fstype and fstype.encode(), flags,
                   data.encode()) != 0:  # fmt: skip
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def bind(source: str, target: str, read_only: bool) -> None:
    mount(source, target, None, MS_BIND)
    if read_only:
        mount("none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def make_root(spec: dict[str, Any]) -> str:
    """The pod's root, mounted (in this mount namespace only) at spec's root.target, with
    what must come from the host's side: /proc of the pod's PID namespace, /sys, devices."""
    layer = spec["root"]
    root = layer["target"]
    lower = ":".join(layer["lower"])
    mount("overlay", root, "overlay", 0,
          f"lowerdir={lower},upperdir={layer['upper']},workdir={layer['work']}")  # fmt: skip
    mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("sysfs", f"{root}/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    hide_kernel(root)
    dev = f"{root}/dev"
    mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=0755,size=64k")
    for name, (major, minor) in DEVICES.items():
        os.mknod(f"{dev}/{name}", stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(f"{dev}/{name}", 0o666)
    for name in ("pts", "shm"):
        Path(dev, name).mkdir()
    mount("devpts", f"{dev}/pts", "devpts", MS_NOSUID | MS_NOEXEC,
          "newinstance,ptmxmode=0666,mode=0620")  # fmt: skip
    mount("shm", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for name, target in DEV_LINKS.items():
        Path(dev, name).symlink_to(target)
    fake_gpus(root, int(spec.get("gpus", 0)))
    for path in spec.get("devices", ()):
        # A device of the machine, as a device plugin hands it over: its number and mode.
        given = os.stat(path)
        os.mknod(f"{root}{path}", stat.S_IFMT(given.st_mode), given.st_rdev)
        os.chmod(f"{root}{path}", stat.S_IMODE(given.st_mode))
    if spec.get("cgroupfs"):
        # The pod's own cgroup tree (its cgroup namespace's), as a runtime mounts it for a
        # container: read-only unless privileged.
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC | (0 if spec.get("privileged") else MS_RDONLY)
        mount("cgroup2", f"{root}/sys/fs/cgroup", "cgroup2", flags)
    for target, mode in spec["tmpfs"].items():  # /run among them, for OLD_ROOT
        mount("tmpfs", f"{root}{target}", "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}")
    return root


def fake_gpus(root: str, count: int) -> None:
    """Local mode's fake device plugin, for a pod that asks for `count` GPUs: one /dev/nvidiaN
    each (null devices: nothing of a real GPU the machine may have) and /dev/nvidiactl, as
    the NVIDIA container toolkit would give, for gres.conf's File= lines; and the fake
    nvidia-smi (slonk.local.fake_gpu) as the pod's own."""
    if not count:
        return
    major, minor = DEVICES["null"]
    for name in [f"nvidia{i}" for i in range(count)] + ["nvidiactl"]:
        os.mknod(f"{root}/dev/{name}", stat.S_IFCHR | 0o666, os.makedev(major, minor))
        os.chmod(f"{root}/dev/{name}", 0o666)
    smi = Path(root, FAKE_NVIDIA_SMI.lstrip("/"))
    smi.write_text(
        f"#!/bin/sh\nFAKE_GPU_COUNT={count} exec {SLONK_PYTHON} -I -m slonk.local.fake_gpu "
        'nvidia-smi "$@"\n'
    )
    smi.chmod(0o755)


def hide_kernel(root: str) -> None:
    """/proc's and /sys's machine-wide parts: read-only or hidden (PROC_READ_ONLY...)."""
    for name in PROC_READ_ONLY:
        if os.path.lexists(path := f"{root}/proc/{name}"):
            bind(path, path, read_only=True)
    for path in [f"{root}/proc/{n}" for n in PROC_MASKED] + [f"{root}/sys/{n}" for n in SYS_MASKED]:
        if not os.path.lexists(path):
            continue
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0")
        else:
            bind("/dev/null", path, read_only=True)


def pivot(root: str) -> None:
    """Make `root` this mount namespace's root, the host's kept at OLD_ROOT (in the pod's
    /run tmpfs) until `detach_host`: binds from descriptors into the host's mounts work only
    while those are attached."""
    Path(root, OLD_ROOT.lstrip("/")).mkdir()
    subprocess.run(["pivot_root", root, f"{root}{OLD_ROOT}"], check=True)
    os.chdir("/")


def detach_host() -> None:
    if _libc.umount2(OLD_ROOT.encode(), MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), "cannot detach the host's root")
    os.rmdir(OLD_ROOT)


def add_volumes(spec: dict[str, Any], sources: list[int]) -> None:
    """After the pivot, so that each target resolves inside the pod (/var/run is a link to
    /run in the image): the sources are held as descriptors opened before it, their mounts
    still attached at OLD_ROOT."""
    for fd, volume in zip(sources, spec["binds"], strict=True):
        target = Path(volume["target"])
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            target.mkdir(parents=True, exist_ok=True)
        else:  # a single file (the host's nvidia-smi, as the NVIDIA container toolkit binds)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        bind(f"/proc/self/fd/{fd}", volume["target"], volume["readOnly"])
        os.close(fd)


def open_low_ports(spec: dict[str, Any]) -> None:
    """Let the pod bind ports below 1024 when its container may (NET_BIND_SERVICE)."""
    if (caps := capabilities(spec)) is None or "NET_BIND_SERVICE" in caps:
        Path(UNPRIVILEGED_PORT_START).write_text("0\n")


def own_user_namespace() -> None:
    """Move into a new user namespace, uids and gids mapped to themselves, and a new mount
    namespace owned by it: every mount made so far is now locked (see the module's doc). A
    process left in the host's namespace writes the maps (one cannot write its own)."""
    ready, go = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(go)
        os.read(ready, 1)
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{os.getppid()}/{name}").write_text(ID_MAP)
        os._exit(0)
    os.close(ready)
    failed = _libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)
    os.write(go, b"!")  # the helper exits either way
    _, status = os.waitpid(helper, 0)
    if failed:
        raise OSError(ctypes.get_errno(), "cannot make the pod's user namespace")
    if status:
        raise OSError(f"cannot map the pod's user namespace (helper status {status})")


def capabilities(spec: Mapping[str, Any]) -> list[str] | None:
    """The container's capabilities as Kubernetes gives them: all (None) when privileged;
    else the runtime's default set (none after `drop: [ALL]`) less what it drops, with what
    it adds. A spec from before `privileged` was kept is privileged when it names none."""
    added, dropped = set(spec["capabilities"]), set(spec.get("dropCapabilities", []))
    if spec.get("privileged", not (added or dropped)):
        return None
    kept = set() if "ALL" in dropped else set(RUNTIME_DEFAULT_CAPABILITIES) - dropped
    return sorted(kept | added)


def filter_system_calls(spec: Mapping[str, Any]) -> None:
    """The runtime's default seccomp profile, where the chart asks for it (RuntimeDefault;
    a Localhost profile local mode cannot load gets the same) and the filter knows the
    machine (slonk.local.seccomp)."""
    if spec.get("seccomp") in ("RuntimeDefault", "Localhost") and seccomp.supported():
        seccomp.install(capabilities(spec))


def confined(command: Sequence[str], spec: Mapping[str, Any]) -> list[str]:
    """The command under the container's securityContext, as a runtime would start it: root
    keeps only the container's capabilities (and so does everything it starts; in the pod's
    own user namespace, see `own_user_namespace`). allowPrivilegeEscalation false sets
    no_new_privs."""
    options = []
    if (caps := capabilities(spec)) is not None:
        keep = "".join(f",+{c.lower()}" for c in caps)
        options += ["--bounding-set", f"-all{keep}", "--inh-caps", "-all"]
    if spec.get("noNewPrivileges"):
        options.append("--no-new-privs")
    return ["setpriv", *options, "--", *command] if options else list(command)


def own_cgroup(path: str) -> None:
    """Move into the pod's cgroup (a folder of the machine's cgroup v2 tree), then into a
    cgroup namespace rooted there, as a runtime starts a container: the pod's processes alone
    are in it (its launcher stays outside), and its /sys/fs/cgroup shows that subtree."""
    Path(path, "cgroup.procs").write_text("0")  # 0: the writer itself
    if _libc.unshare(CLONE_NEWCGROUP) != 0:
        raise OSError(ctypes.get_errno(), "cannot make the pod's cgroup namespace")


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("cgroup"):
        own_cgroup(spec["cgroup"])
    open_low_ports(spec)
    sources = [os.open(v["source"], os.O_PATH) for v in spec["binds"]]
    pivot(make_root(spec))
    add_volumes(spec, sources)
    detach_host()
    for path, text in spec["files"].items():
        Path(path).write_text(text)
    socket.sethostname(spec["hostname"])
    if spec.get("userNamespace", True):
        own_user_namespace()
    filter_system_calls(spec)
    command = confined(spec["command"], spec)
    os.execvpe(command[0], command, spec["env"])


if __name__ == "__main__":
    main(sys.argv[1])
