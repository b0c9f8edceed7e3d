"""The role's s6 services: copy their directories into the scan dir, then become s6-svscan."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from slonk.base import paths

# agent: the pod's own loops (slonk.pod_agent), among them config-watch: the controller
# applies cluster.yaml's Slurm configuration, a worker its own health plan and job programs.
# A login pod has nothing of its own to follow (its clients fetch the configuration slurmctld
# runs): it runs an agent only to sync users from LDAP (init.optional_services).
ROLE_SERVICES = {
    "controller": ("munged", "slurmctld", "agent"),
    "worker": ("munged", "slurmd", "agent"),
    "login": ("munged", "sshd"),
    "ldap": ("slapd",),
    # Accounting: slurmdbd authenticates slurmctld and clients with munge; the chart's MariaDB.
    "slurmdbd": ("munged", "slurmdbd"),
    "database": ("mariadb",),
    # The REST API: users' tokens only, no munge (slonk.pod.restapi).
    "restapi": ("slurmrestd",),
}


def write_scan_dir(
    role: str,
    extra: tuple[str, ...] = (),
    share: Path = paths.SHARE,
    scan_dir: Path = paths.SCAN_DIR,
) -> None:
    """Fresh service dirs on every start: supervise state from a previous life must not linger."""
    if scan_dir.exists():
        shutil.rmtree(scan_dir)
    scan_dir.mkdir(parents=True)
    for service in (*ROLE_SERVICES[role], *extra):
        shutil.copytree(share / "services" / service, scan_dir / service, symlinks=True)
    shutil.copytree(share / "svscan", scan_dir / ".s6-svscan", symlinks=True)


def exec_svscan(role: str, scan_dir: Path = paths.SCAN_DIR) -> None:
    """Replace this process with s6-svscan: it is PID 1 from here on."""
    os.environ["SLONK_ROLE"] = role
    os.execvp("s6-svscan", ["s6-svscan", str(scan_dir)])


def idle(reason: str, log: Callable[[str], None]) -> NoReturn:
    """Stay up doing nothing: a service whose feature is off must not exit, or s6 restarts
    it every second (the syncer's; the agent's tasks just end)."""
    log(f"{reason}; idle")
    while True:
        time.sleep(3600)
