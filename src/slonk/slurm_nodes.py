"""Turn check results into Slurm node state: drain with slonk's reason, resume what slonk
drained once the same check passes, and never touch a drain a person made."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from slonk.health import reasons
from slonk.health.runner import Result
from slonk.slurm_state import SHOW_NODES, NodeState, SlurmError, parse_nodes

__all__ = ["NodeState", "SlurmError", "apply", "decide", "drain", "read_nodes"]

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


def read_nodes(*names: str) -> list[NodeState]:
    """The named nodes, or every node, in one call."""
    command, option = SHOW_NODES[1:-1], SHOW_NODES[-1]
    return parse_nodes(scontrol(*command, *names, option))


def decide(node: NodeState, results: Sequence[Result], undrain: bool) -> tuple[str, str] | None:
    """('drain', reason), ('resume', old reason) or None. A drain slonk made for one check is
    replaced only once that check passes; hooks' and quarantine drains are not health's to
    lift or replace, and a person's drain is theirs."""
    failed = [r for r in results if not r.ok]
    passed = {r.check for r in results if r.ok}
    cause = node.cause
    if node.drained and (cause is None or cause.kind != reasons.HEALTH):
        return None
    if failed:
        if cause is None or cause.name in passed:
            return ("drain", failed[0].reason)
        return None
    if undrain and cause is not None and cause.name in passed:
        return ("resume", node.reason)
    return None


def apply(name: str, results: Sequence[Result], undrain: bool) -> str:
    """Act on the node in Slurm; returns what was done, for the log."""
    found = [n for n in read_nodes(name) if n.name == name]
    if len(found) != 1:
        raise SlurmError(f"scontrol show node {name}: no record of the node could be read")
    (node,) = found
    action = decide(node, results, undrain)
    if action is None:
        return f"left {node.label}" + (
            f" ({node.reason!a}, set by {node.reason_by!a})" if node.reason else "")
    verb, reason = action
    if verb == "drain":
        drain(name, reason)
        return f"drained: {reason}"
    scontrol("update", f"nodename={name}", "state=resume")
    return f"resumed (was: {reason})"
