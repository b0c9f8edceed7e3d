"""Inside a new local pod's namespaces: make its root filesystem, then exec its command.

Run by `slonk local` (host runtime) as PID 1 of a fresh PID, mount, UTS and IPC namespace,
already joined to the pod's network namespace, as a container runtime would start a
container: the root is an overlay whose lower layers are the image's own (as the container
store keeps them) and whose upper layer is the pod's, thrown away with it. Into it go a
fresh /proc, a read-only /sys, a minimal /dev, tmpfs /run and /tmp, and the pod's volumes;
then the pod pivots into it and the host's root is detached. Nothing of the host is left
in the pod but what was bound in: its volumes (and, from a checkout, the checkout itself).
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

# mount(2) flags (linux/mount.h).
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND = 0x20, 0x1000
MNT_DETACH = 2
OLD_ROOT = "/run/.host"
# What a container's /dev holds (as OCI runtimes make it): bound from the host's.
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
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
    dev = f"{root}/dev"
    mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=0755,size=64k")
    for name in DEVICES:
        Path(dev, name).touch()
        bind(f"/dev/{name}", f"{dev}/{name}", read_only=False)
    for name in ("pts", "shm"):
        Path(dev, name).mkdir()
    mount("devpts", f"{dev}/pts", "devpts", MS_NOSUID | MS_NOEXEC,
          "newinstance,ptmxmode=0666,mode=0620")  # fmt: skip
    mount("shm", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for name, target in DEV_LINKS.items():
        Path(dev, name).symlink_to(target)
    for target, mode in spec["tmpfs"].items():  # /run among them, for OLD_ROOT
        mount("tmpfs", f"{root}{target}", "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}")
    return root


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
        Path(volume["target"]).mkdir(parents=True, exist_ok=True)
        bind(f"/proc/self/fd/{fd}", volume["target"], volume["readOnly"])
        os.close(fd)


def confined(command: list[str], spec: dict[str, Any]) -> list[str]:
    """The command under the container's securityContext, as a runtime would start it: with
    `drop: [ALL]`, root keeps only the added capabilities (and so does everything it starts);
    without, the pod keeps all of root's. allowPrivilegeEscalation false sets no_new_privs."""
    options = []
    if "ALL" in spec.get("dropCapabilities", []):
        keep = "".join(f",+{c.lower()}" for c in spec["capabilities"])
        options += ["--bounding-set", f"-all{keep}", "--inh-caps", "-all"]
    if spec.get("noNewPrivileges"):
        options.append("--no-new-privs")
    return ["setpriv", *options, "--", *command] if options else command


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    sources = [os.open(v["source"], os.O_PATH | os.O_DIRECTORY) for v in spec["binds"]]
    pivot(make_root(spec))
    add_volumes(spec, sources)
    detach_host()
    for path, text in spec["files"].items():
        Path(path).write_text(text)
    socket.sethostname(spec["hostname"])
    command = confined(spec["command"], spec)
    os.execvpe(command[0], command, spec["env"])


if __name__ == "__main__":
    main(sys.argv[1])
