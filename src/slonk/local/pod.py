"""Start, stop and enter local pods: namespaces on the host, s6-svscan as each one's PID 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slonk.base.errors import SlonkError
from slonk.local.network import NETNS_DIR, netns_inode
from slonk.local.podinit import confined

# The PATH a pod's processes and its sidecars start with, as a container runtime's default.
POD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A launch is a few forks, but on a machine busy starting hundreds of pods it waits its turn.
LAUNCH_TIMEOUT_SECONDS = 60.0


class PodError(SlonkError):
    pass


def _child_of(pid: int, timeout: float = LAUNCH_TIMEOUT_SECONDS) -> int:
    """The first child of `pid`: unshare --fork's child is PID 1 of the new namespace."""
    deadline = time.monotonic() + timeout
    children = Path(f"/proc/{pid}/task/{pid}/children")
    while time.monotonic() < deadline:
        try:
            found = children.read_text().split()
        except OSError:
            found = []
        if found:
            return int(found[0])
        time.sleep(0.005)
    raise PodError(f"pod launcher {pid} started no process")


def launch_command(spec_file: Path) -> list[str]:
    """The command line that starts a pod from its spec: PID 1 of new PID, mount, UTS and IPC
    namespaces is slonk.local.podinit (in the caller's network namespace)."""
    return [
        "unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--mount-proc",
        "--propagation", "private", "--", sys.executable, "-m", "slonk.local.podinit",
        str(spec_file),
    ]  # fmt: skip


def start(pod_dir: Path, netns: str) -> int:
    """Launch a pod from its spec, pod_dir/pod.json (see podinit); returns the host pid of
    its PID 1."""
    spec_file = pod_dir / "pod.json"
    with open(pod_dir / "log", "ab") as log:
        launcher = subprocess.Popen(
            ["nsenter", f"--net={NETNS_DIR / netns}", "--", *launch_command(spec_file)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return _child_of(launcher.pid)


def running_pid(pod_dir: Path, netns: str) -> int | None:
    """The pod's PID 1 if it is alive, and really ours (not a recycled pid)."""
    try:
        pid = int((pod_dir / "pid").read_text())
        alive = os.stat(f"/proc/{pid}/ns/net").st_ino == netns_inode(netns)
    except (OSError, ValueError):
        return None
    return pid if alive else None


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.02)
    return not Path(f"/proc/{pid}").exists()


def handles(pid: int, signum: int) -> bool:
    """Whether the process takes `signum`: has a handler for it, or blocks it (s6-svscan
    blocks signals and reads them from a signalfd). The first process of a PID namespace
    gets only such signals (SIGKILL aside), from any namespace: before (a pod's init, before
    it becomes s6-svscan) a SIGTERM is dropped, not delivered later."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        wanted = ("SigCgt:", "SigBlk:")
        masks = [int(line.split()[1], 16) for line in lines if line.startswith(wanted)]
    except (OSError, ValueError, IndexError):
        return False
    return any(mask >> (signum - 1) & 1 for mask in masks)


def wait_handles(pid: int, signum: int, timeout: float) -> bool:
    """Wait until the process handles `signum` (see `handles`); False if it did not in time
    or is gone."""
    deadline = time.monotonic() + timeout
    while not handles(pid, signum):
        if time.monotonic() >= deadline or not Path(f"/proc/{pid}").exists():
            return False
        time.sleep(0.02)
    return True


def stop(pid: int, grace: float) -> None:
    """SIGTERM to PID 1 (s6 stops the services), SIGKILL after `grace` seconds. When a
    PID namespace's first process dies the kernel kills every other process in it. A pod
    still in its init gets the SIGTERM once its s6-svscan can take it (within the grace)."""
    deadline = time.monotonic() + grace
    try:
        if wait_handles(pid, signal.SIGTERM, grace):
            os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, max(0.0, deadline - time.monotonic())):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 5.0)
    except ProcessLookupError:
        pass


def _user_namespace(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/user").st_ino
    except OSError:
        return None


def _wait_own_user_namespace(pid: int, timeout: float = LAUNCH_TIMEOUT_SECONDS) -> None:
    """Wait until the pod's PID 1 is in its own user namespace, mapped (podinit moves there
    last): whatever enters it before would be the host's root in the host's namespaces."""
    deadline = time.monotonic() + timeout
    host = _user_namespace("self")
    while True:
        try:
            mapped = Path(f"/proc/{pid}/uid_map").read_text().strip()
        except OSError:
            raise PodError(f"pod process {pid} is gone") from None
        if mapped and _user_namespace(pid) not in (host, None):
            return
        if time.monotonic() >= deadline:
            raise PodError(f"pod process {pid} did not leave the host's user namespace")
        time.sleep(0.005)


def enter(pid: int, command: Sequence[str], spec: Mapping[str, Any]) -> list[str]:
    """The argv that runs `command` inside a running pod, with the pod's environment, as a
    runtime's exec does: in every namespace of the pod (its user namespace too, where the
    host runtime gives it one) and under its container's securityContext."""
    own = spec.get("userNamespace", False)
    if own:
        _wait_own_user_namespace(pid)
    env = ["env", "-i", *(f"{k}={v}" for k, v in spec["env"].items()), *command]
    return [
        "nsenter",
        "-t",
        str(pid),
        "--mount",
        "--uts",
        "--ipc",
        "--net",
        "--pid",
        *(["--user"] if own else []),
        "--",
        *confined(env, spec),
    ]
