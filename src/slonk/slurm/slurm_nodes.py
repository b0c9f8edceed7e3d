"""Slurm node state through scontrol: read the nodes, drain one with a reason, resume one.
What a reason says and who may lift it is slonk.slurm.reasons'; reading Slurm's JSON is
slonk.slurm.slurm_state's."""

from __future__ import annotations

import subprocess

from slonk.slurm.slurm_state import (
    SHOW_NODES,
    NodeState,
    SlurmError,
    SlurmNotInstalled,
    parse_nodes,
)

__all__ = [
    "NodeState",
    "SlurmError",
    "down",
    "drain",
    "find_node",
    "read_node",
    "read_nodes",
    "resume",
    "run",
    "running_jobs",
    "scontrol",
]

SCONTROL_TIMEOUT_SECONDS = 10


def run(argv: list[str], timed_out: str = "", failed: str = "") -> str:
    """A Slurm command's output; a SlurmError saying it timed out (`timed_out`, by default
    the program's name) or failed (`failed`, by default the command line, then its stderr)."""
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_SECONDS, check=False
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(timed_out or f"{argv[0]} timed out") from None
    except (FileNotFoundError, PermissionError) as err:  # a pod of another image, a host
        raise SlurmNotInstalled(f"{argv[0]}: {err.strerror}") from None
    except OSError as err:  # no fork now (memory, processes): another try may do
        raise SlurmError(f"{argv[0]}: {err.strerror}") from None
    if result.returncode:
        said = result.stderr.strip() or "failed"
        raise SlurmError(f"{failed or ' '.join(argv)}: {said}")
    return result.stdout


def scontrol(*args: str) -> str:
    return run(["scontrol", *args], timed_out=f"scontrol {args[0]} timed out")


def running_jobs() -> dict[str, int]:
    """How many jobs run (or complete) on each node, from one squeue call: node lists are
    hostlists of node names, which are DNS labels."""
    import hostlist  # only the controller counts jobs

    command = ["squeue", "--noheader", "--states=RUNNING,COMPLETING", "--format=%N"]
    counts: dict[str, int] = {}
    for line in run(command, failed="squeue").split():
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


def find_node(name: str) -> NodeState | None:
    """The named node's record; None when Slurm's answer holds no single one."""
    found = [n for n in read_nodes(name) if n.name == name]
    return found[0] if len(found) == 1 else None


def read_node(name: str) -> NodeState:
    """The named node's record, or a SlurmError saying there is none."""
    node = find_node(name)
    if node is None:
        raise SlurmError(f"scontrol show node {name}: no record of the node could be read")
    return node
