"""Slurm node state through scontrol: read the nodes, drain one with a reason, resume one.
What a reason says and who may lift it is slonk.health.reasons'; reading Slurm's JSON is
slonk.slurm_state's."""

from __future__ import annotations

import subprocess

from slonk.slurm_state import SHOW_NODES, NodeState, SlurmError, parse_nodes

__all__ = ["NodeState", "SlurmError", "drain", "read_nodes", "resume", "scontrol"]

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


def drain(name: str, reason: str) -> None:
    scontrol("update", f"nodename={name}", "state=drain", f"reason={reason}")


def resume(name: str) -> None:
    scontrol("update", f"nodename={name}", "state=resume")


def read_nodes(*names: str) -> list[NodeState]:
    """The named nodes, or every node, in one call."""
    command, option = SHOW_NODES[1:-1], SHOW_NODES[-1]
    return parse_nodes(scontrol(*command, *names, option))
