"""Every health check slonk has: a function from the node's plan and the check's options to
a short description of what it saw, raising Unhealthy with the problem otherwise."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slonk.base.paths import SLURMD_SPOOL
from slonk.config import check_names
from slonk.health import active, gpu, leftovers, trend
from slonk.health.probe import Inconclusive, TimedOut, Unhealthy, bounded

SYS_NET = Path("/sys/class/net")
SYS_RDMA = Path("/sys/class/infiniband")
MOUNTINFO = Path("/proc/self/mountinfo")
CONTROLLER_RETRY_SECONDS = 0.5


@dataclass(frozen=True)
class Node:
    """What the checks know of the node they run on (from cluster.yaml, written at init)."""

    name: str
    gpus: int
    peers: tuple[str, ...]  # every node of this node's pool: their Services must resolve


def jobs_here(node: Node, spool: Path = SLURMD_SPOOL) -> bool:
    """Whether slurmd runs any job step on the node: each has a socket in slurmd's spool
    directory, `<node>_<job>.<step>` (with PrologFlags=Contain, the extern step's lasts from
    the job's allocation to its end). Unsure (an unreadable spool) counts as yes."""
    try:
        return any(entry.name.startswith(f"{node.name}_") for entry in os.scandir(spool))
    except FileNotFoundError:
        return False
    except OSError:
        return True


def check_gpu(node: Node, options: Mapping[str, Any], phase: str, timeout: float) -> str:
    """After a job (epilog), or between jobs (watch, interval on a node with none), the GPUs
    must also be free: memory or a process left there belongs to no job."""
    expected = gpu.expected_count(options, node.gpus)
    if phase == "epilog":
        return gpu.check(options, expected, True, timeout)
    between_jobs = phase in ("watch", "interval") and not jobs_here(node)
    try:
        return gpu.check(options, expected, between_jobs, timeout)
    except (Inconclusive, TimedOut):
        raise  # out of time: that is for the runner to judge, not a job's GPU memory
    except Unhealthy:
        if not between_jobs or not jobs_here(node):
            raise
        # A job began while nvidia-smi looked: what it holds is its own. Look again as
        # during a job.
        return gpu.check(options, expected, False, timeout)


def check_interfaces(node: Node, options: Mapping[str, Any], phase: str, timeout: float) -> str:
    problems = []
    for name in options["names"]:
        status, output = bounded(["ip", "-json", "address", "show", "dev", name], timeout)
        if status:
            problems.append(f"{name} missing")
            continue
        (link,) = json.loads(output)
        if "UP" not in link.get("flags", []) or link.get("operstate") == "DOWN":
            problems.append(f"{name} down")
        elif not [a for a in link.get("addr_info", []) if a.get("scope") == "global"]:
            problems.append(f"{name} has no address")
    for device in options["rdmaDevices"]:
        states = [p.read_text() for p in (SYS_RDMA / device / "ports").glob("*/state")]
        if not any("ACTIVE" in s for s in states):
            problems.append(f"RDMA device {device} {'not active' if states else 'missing'}")
    if problems:
        raise Unhealthy(", ".join(problems))
    return ", ".join([*options["names"], *options["rdmaDevices"]]) + " up"


def check_controller(node: Node, options: Mapping[str, Any], phase: str, timeout: float) -> str:
    """A real RPC (a bare TCP probe would make slurmctld log an error every interval), tried
    again until the timeout: a slurmctld restarting under s6 is no fault of this node's."""
    deadline = time.monotonic() + timeout
    while True:
        status, output = bounded(["scontrol", "ping"], max(0.1, deadline - time.monotonic()))
        if status == 0 and "is UP" in output:
            return "slurmctld answers"
        if time.monotonic() + CONTROLLER_RETRY_SECONDS >= deadline:
            raise Unhealthy(f"slurmctld does not answer: {' '.join(output.split())}")
        time.sleep(CONTROLLER_RETRY_SECONDS)


def check_dns(node: Node, options: Mapping[str, Any], phase: str, timeout: float) -> str:
    missing = []
    for name in node.peers:
        try:
            socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError:
            missing.append(name)
    if missing:
        raise Unhealthy(f"cannot resolve {len(missing)} node Services: {', '.join(missing[:5])}")
    return f"{len(node.peers)} node Services resolve"


def mount_options(path: str) -> list[str] | None:
    """The per-mount options of the mount at `path`, None when nothing is mounted there."""
    found = None
    for line in MOUNTINFO.read_text().splitlines():
        fields = line.split()
        if fields[4] == path:
            found = fields[5].split(",")  # the last mount on a path is the one seen
    return found


def check_storage(node: Node, options: Mapping[str, Any], phase: str, timeout: float) -> str:
    """Mounted, writable, and answering in time: a write through the mount, in a child that
    a hung server cannot take the check down with."""
    for path in options["paths"]:
        if problem := _mount_problem(path):
            raise Unhealthy(problem)
        # A new name each time, made by mktemp (O_EXCL): one a user could guess, plant a
        # directory or a link at, would drain (or fool) every node writing there.
        write = 'f=$(mktemp -p "$1" .slonk-health.XXXXXXXX) && rm -f "$f"'
        status, output = bounded(["sh", "-c", write, "probe", path], timeout)
        if not status:
            continue
        # A mount turned read-only (or gone) while the probe wrote, as a file system does on
        # an error, is named as the next look would name it, so the reason holds still; what
        # the write met (an I/O error, say) is said on stderr.
        if problem := _mount_problem(path):
            said = " ".join(output.split())
            print(f"slonk health: storage: the write to {path} failed: {said}", file=sys.stderr)
            raise Unhealthy(problem)
        raise Unhealthy(f"{path} is not writable: {output.strip()}")
    return f"{', '.join(options['paths'])} writable"


def _mount_problem(path: str) -> str | None:
    """What is wrong with the mount at `path` by its options (None: mounted read-write)."""
    mounted = mount_options(path)
    if mounted is None:
        return f"{path} is not mounted"
    if "ro" in mounted:
        return f"{path} is mounted read-only"
    return None


def check_scratch(node: Node, options: Mapping[str, Any], phase: str, timeout: float) -> str:
    """Free space on the node's scratch, judged between jobs: space a running job holds is the
    job's. With no job on the node, what users left there goes first (slonk.health.leftovers: as
    each Epilog does, for anyone whose Epilog did not; only in the node's own /tmp, /var/tmp
    or /dev/shm); what is still full then drains the node (never recycled,
    slonk.config.health_checks.SHARED_CHECKS)."""
    path, least = options["path"], options["minFreePercent"]
    started, deadline = time.time(), time.monotonic() + timeout
    percent = _free_percent(path, timeout)
    if percent >= least:
        return f"{path} {percent:.0f}% free"
    problem = f"{path} {percent:.1f}% free, below {least}%"
    if jobs_here(node):
        raise Inconclusive(f"{problem}, with jobs on the node: theirs until they end")
    # Half of what is left for the cleaning, the rest for the second look: within the check's time.
    cleaned = leftovers.clean_left_behind(path, started, (deadline - time.monotonic()) / 2)
    if not cleaned:
        raise Unhealthy(problem)
    percent = _free_percent(path, max(deadline - time.monotonic(), 1.0))
    said = "; ".join(cleaned)
    if percent < least:
        raise Unhealthy(f"{path} {percent:.1f}% free, below {least}%, after {said}")
    return f"{path} {percent:.0f}% free after {said}"


def _free_percent(path: str, timeout: float) -> float:
    status, output = bounded(["stat", "--file-system", "--format=%a %b", path], timeout)
    if status:
        raise Unhealthy(f"{path}: {output.strip()}")
    free, total = (int(n) for n in output.split())
    return 100.0 * free / total if total else 0.0


def check_munge(node: Node, options: Mapping[str, Any], phase: str, timeout: float) -> str:
    """Every Slurm RPC needs munged. (Whether slurmd answers is slurmctld's to see: it runs
    these checks, and marks a node that stops answering NOT_RESPONDING, then DOWN.)"""
    status, output = bounded(["sh", "-c", "munge -n | unmunge >/dev/null"], timeout)
    if status:
        raise Unhealthy(f"munge round trip failed: {output.strip()}")
    return "munge round trip"


def check_active(node: Node, options: Mapping[str, Any], phase: str, timeout: float) -> str:
    """Any active check (slonk.health.active): its options say what its probe measures, or
    name a site's own command."""
    if "command" in options:
        return active.run_command(options, timeout)
    return active.check(options, node.gpus, timeout)


Check = Callable[[Node, Mapping[str, Any], str, float], str]
CHECKS: Mapping[str, Check] = {
    "gpu": check_gpu,
    "interfaces": check_interfaces,
    "controller": check_controller,
    "dns": check_dns,
    "storage": check_storage,
    "scratch": check_scratch,
    "munge": check_munge,
}


def check_trend(node: Node, options: Mapping[str, Any], phase: str, timeout: float) -> str:
    """Any trend rule (slonk.health.trend): its options name the counter. Its drain waits for
    a person, so only a rise counts: a fault of its own (a file it cannot keep) is no result."""
    try:
        return trend.check(options, timeout)
    except Unhealthy:
        raise
    except Exception as err:
        raise Inconclusive(f"could not judge the trend: {err!r}") from err


def find(name: str) -> Check:
    """The check a plan names: a passive one, `active:<check>` or `trend:<rule>`."""
    if name.startswith(check_names.ACTIVE_PREFIX):
        return check_active
    return check_trend if name.startswith(check_names.TREND_PREFIX) else CHECKS[name]
