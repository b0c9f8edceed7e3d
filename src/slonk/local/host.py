"""The host's kernel limits a local cluster of many pods needs. Every pod runs as the host's
root in the host's user namespace, so per-user and machine-wide limits a Kubernetes node has
for each kubelet's few dozen pods are shared here by all of them. `up` raises those below
what its pods need (never lowers one), saying so, as Kubernetes nodes commonly raise them.

Measured at 256 workers (bench/local_scale.py):
- fs.inotify.max_user_instances (default 128): every inotify user (an agent watching its
  cluster.yaml, s6, sshd) takes instances of root's one count: at 128 inotify_init fails.
- net.ipv4.neigh.default.gc_thresh1..3 (default 128/512/1024): the neighbour (ARP) table is
  one for all network namespaces; the controller alone holds an entry per node and
  `srun -N256` an entry per node in the pod it runs from, each slurmd several (its tree's
  fan-out): past gc_thresh3 the kernel drops new neighbours ("neighbour table overflow") and
  messages time out.
- kernel.pid_max (32768 below 32 CPUs): pids are threads, machine-wide; a worker pod holds
  some 30 (s6 and its supervisors, munged's and slurmd's threads, the Python services').
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

SYSCTL_DIR = Path("/proc/sys")


def needed(pods: int) -> dict[str, int]:
    """The least each limit must be for `pods` pods (and the rest of the machine)."""
    return {
        "fs/inotify/max_user_instances": 128 + 8 * pods,
        "fs/inotify/max_user_watches": 65536 + 1024 * pods,
        "net/ipv4/neigh/default/gc_thresh1": 128 + 8 * pods,
        "net/ipv4/neigh/default/gc_thresh2": 512 + 32 * pods,
        "net/ipv4/neigh/default/gc_thresh3": 1024 + 64 * pods,
        "kernel/pid_max": 32768 + 256 * pods,
    }


def raise_limits(pods: int, progress: Callable[[str], None], root: Path = SYSCTL_DIR) -> None:
    """Raise each limit below what `pods` pods need; one line for those raised. A limit the
    kernel lacks or refuses is left, saying so (the pods may still fit)."""
    raised, failed = [], []
    for key, least in needed(pods).items():
        path = root / key
        try:
            current = int(path.read_text().split()[0])
            if current >= least:
                continue
            path.write_text(f"{least}\n")
        except (OSError, ValueError) as err:
            failed.append(f"{key.replace('/', '.')} ({err})")
            continue
        raised.append(f"{key.replace('/', '.')} {current} -> {least}")
    if raised:
        progress(f"slonk local: raised for {pods} pods: {', '.join(raised)}")
    if failed:
        progress(f"slonk local: could not raise {', '.join(failed)}")
