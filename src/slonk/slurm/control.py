"""Which controller pod's slurmctld is in control (values controller.backup).

Slurm's own order decides: the first of SlurmctldHost's list whose slurmctld answers holds
control (a backup takes over only while the primary does not answer, and a returning primary
asks for control back). What must happen once per cluster — sacctmgr's associations, node
recycling, the syncer, applying a new Slurm configuration — happens in that pod; the other
one keeps its files current and waits. With one controller, it is always in control.

A pod asks `scontrol ping` on its own slurmctld's files: a configless client would first
fetch them from a slurmctld, which is what may be missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable

from slonk.base import paths
from slonk.config.model import ClusterSpec

PING_TIMEOUT_SECONDS = 30.0


def answering(conf: str = str(paths.SLURMCTLD_CONF_DIR / "slurm.conf")) -> list[str] | None:
    """The controllers whose slurmctld answers a ping, in SlurmctldHost's order; None when
    scontrol cannot say (no files yet, a hung call, output that is no ping)."""
    try:
        done = subprocess.run(
            ["scontrol", "ping", "--json"],
            capture_output=True,
            text=True,
            timeout=PING_TIMEOUT_SECONDS,
            check=False,
            env={**os.environ, "SLURM_CONF": conf},
        )
        pings = json.loads(done.stdout)["pings"]
        return [str(p["hostname"]) for p in pings if p.get("responding") is True]
    except (subprocess.TimeoutExpired, OSError, ValueError, KeyError, TypeError):
        return None


def holder(spec: ClusterSpec, ask: Callable[[], list[str] | None] = answering) -> str | None:
    """The controller pod in control: the first whose slurmctld answers (the only one, without
    a backup, unasked); None when scontrol cannot say or none answers."""
    if len(spec.controller_names) == 1:
        return spec.controller_names[0]
    answers = ask()
    return answers[0] if answers else None


def in_control(
    spec: ClusterSpec, pod: str, ask: Callable[[], list[str] | None] = answering
) -> bool:
    """Whether `pod`'s slurmctld holds control: without a backup, always. With one, a pod that
    cannot tell (its own slurmctld not up yet) does not: the duty waits for the next look."""
    return len(spec.controller_names) == 1 or holder(spec, ask) == pod


def held_elsewhere(
    spec: ClusterSpec, pod: str, ask: Callable[[], list[str] | None] = answering
) -> str | None:
    """The other controller pod, when it is seen holding control; None without a backup, or
    when nobody can be seen holding it."""
    if len(spec.controller_names) == 1:
        return None
    found = holder(spec, ask)
    return found if found not in (None, pod) else None
