"""Slurm node state through scontrol: read the nodes, drain one with a reason, resume one.
What a reason says and who may lift it is slonk.health.reasons'; reading Slurm's JSON is
slonk.slurm_state's."""

from __future__ import annotations

import subprocess

from slonk.slurm_state import SHOW_NODES, NodeState, SlurmError, parse_nodes

__all__ = [
    "NodeState",
    "SlurmError",
    "down",
    "drain",
    "read_nodes",
    "resume",
    "running_jobs",
    "scontrol",
]

SCONTROL_TIMEOUT_SECONDS = 10


def scontrol(*args: str) -> str:
    try:
        result = subprocess.run(
            ["scontrol", *args],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"scontrol {args[0]} timed out") from None
    if result.returncode:
        raise SlurmError(f"scontrol {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def running_jobs() -> dict[str, int]:
    """How many jobs run (or complete) on each node, from one squeue call: node lists are
    hostlists of node names, which are DNS labels."""
    import hostlist  # only the controller counts jobs

    try:
        result = subprocess.run(
            ["squeue", "--noheader", "--states=RUNNING,COMPLETING", "--format=%N"],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SlurmError("squeue timed out") from None
    if result.returncode:
        raise SlurmError(f"squeue: {result.stderr.strip()}")
    counts: dict[str, int] = {}
    for line in result.stdout.split():
        try:
            names = hostlist.expand_hostlist(line)
        except hostlist.BadHostlist as err:
            raise SlurmError(f"squeue: {line!r:.100} is not a node list: {err}") from None
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return counts


def down(name: str, reason: str) -> None:
    scontrol("update", f"nodename={name}", "state=down", f"reason={reason}")


def drain(name: str, reason: str) -> None:
    scontrol("update", f"nodename={name}", "state=drain", f"reason={reason}")


def resume(name: str) -> None:
    scontrol("update", f"nodename={name}", "state=resume")


def read_nodes(*names: str) -> list[NodeState]:
    """The named nodes, or every node, in one call."""
    command, option = SHOW_NODES[1:-1], SHOW_NODES[-1]
    return parse_nodes(scontrol(*command, *names, option))
