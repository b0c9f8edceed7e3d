"""A worker's cgroup tree, made usable for job confinement (`slurm.confinement: cgroup`).

slurmd (CgroupPlugin=cgroup/v2) puts each job in a cgroup of its own under the pod's, which the
pod sees as /sys/fs/cgroup in its own cgroup namespace. A container runtime mounts that
read-only for any container that is not privileged, and slurmd then does not start (measured on
a cgroup v2 H100 node, issue 29). The pod's root may remount it read-write: the mount shows the
pod's subtree alone, so nothing outside the pod becomes writable. That takes CAP_SYS_ADMIN
(workers.capabilities) and a runtime profile that lets the pod mount (containerd's default
AppArmor profile does not: workers.appArmorProfile). Where the pod cannot, it stops here with
one line that says what to set, rather than crash-looping on slurmd's error.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from slonk.base.errors import SlonkError

CGROUP_ROOT = "/sys/fs/cgroup"
MOUNTINFO = Path("/proc/self/mountinfo")


class ConfinementError(SlonkError):
    """The pod cannot confine jobs as slurm.confinement asks."""


@dataclass(frozen=True)
class Mount:
    fstype: str
    options: tuple[str, ...]  # the mount's own (ro or rw among them)


def mount_at(path: str, mountinfo: str) -> Mount | None:
    """What is mounted at `path` (the last mount there, the one seen), from mountinfo's text."""
    found = None
    for line in mountinfo.splitlines():
        mine, _, fs = line.partition(" - ")
        fields, fs_fields = mine.split(), fs.split()
        if len(fields) >= 6 and fs_fields and fields[4] == path:
            found = Mount(fs_fields[0], tuple(fields[5].split(",")))
    return found


def _remount(argv: Sequence[str]) -> tuple[int, str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.returncode, " ".join(done.stderr.split())


def prepare(
    mountinfo: Path = MOUNTINFO, run: Callable[[Sequence[str]], tuple[int, str]] = _remount
) -> str:
    """Make the pod's cgroup v2 tree writable for slurmd; what was done. Raises
    ConfinementError, naming what to set, when this pod cannot confine jobs."""
    found = mount_at(CGROUP_ROOT, mountinfo.read_text())
    if found is None:
        raise ConfinementError(
            f"slurm.confinement cgroup: nothing is mounted at {CGROUP_ROOT}; "
            "set slurm.confinement none to run jobs unconfined"
        )
    if found.fstype != "cgroup2":
        raise ConfinementError(
            f"slurm.confinement cgroup needs cgroup v2, and this node mounts {found.fstype} at "
            f"{CGROUP_ROOT} (cgroup v1): boot the node with the unified hierarchy "
            "(systemd.unified_cgroup_hierarchy=1), or set slurm.confinement none"
        )
    if "ro" not in found.options:
        return f"{CGROUP_ROOT} is writable (cgroup v2)"
    status, said = run(["mount", "-o", "remount,rw", CGROUP_ROOT])
    if status:
        raise ConfinementError(
            f"slurm.confinement cgroup: {CGROUP_ROOT} is read-only and this pod cannot remount "
            f"it ({said or f'exit {status}'}): the worker container needs CAP_SYS_ADMIN "
            "(workers.capabilities) and a profile that lets it mount (workers.appArmorProfile "
            "{type: Unconfined} where nodes run AppArmor), or workers.privileged: true"
        )
    return f"remounted {CGROUP_ROOT} read-write (the pod's own cgroup namespace)"
