"""Turn check results into Slurm node state: drain with slonk's reason, resume what slonk
drained once the same check passes, and never touch a drain a person made."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from slonk.health import reasons
from slonk.health.runner import Result

SCONTROL_TIMEOUT_SECONDS = 10
FIELD = re.compile(r"(\w+)=(\S*)")
REASON_SUFFIX = re.compile(r" \[[^]]*@[^]]*\]\Z")
MAX_SHOWN = 200  # of a line that cannot be read, in the log


class SlurmError(RuntimeError):
    pass


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # Slurm's base state, lower case: idle, mixed, allocated, down, ...
    flags: frozenset[str]
    reason: str
    slurmd_started: str = ""  # as Slurm prints it: changes when a new slurmd registers

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def cause(self) -> reasons.Cause | None:
        """Why slonk drained the node (a check, a hook, quarantine), None when slonk did not
        drain it."""
        return reasons.classify(self.reason) if self.drained else None


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


def parse_nodes(text: str) -> list[NodeState]:
    """`scontrol --oneliner show node`: `Key=value` fields, the reason (spaces and all) last,
    ending in `[user@time]`. (Debian's Slurm 22.05 has no --json.) One node a line, ended by a
    line feed only: a reason may hold what str.splitlines() also ends lines at (U+2028, NEL,
    FS, VT...). A line without a node's name and state (a reason a person wrote with a line
    end in it) is logged and skipped: one strange record never hides the others."""
    nodes = []
    for line in text.split("\n"):
        head, _, reason = line.partition(" Reason=")
        fields = dict(FIELD.findall(head))
        if "NodeName" not in fields or "State" not in fields:
            if line.strip():
                print(f"slonk health: skipped a line of scontrol's output with no node's name "
                      f"and state: {line[:MAX_SHOWN]!a}", file=sys.stderr, flush=True)
            continue
        state, *flags = fields["State"].split("+")
        nodes.append(
            NodeState(
                name=fields["NodeName"],
                state=state.lower(),
                flags=frozenset(flags),
                reason=REASON_SUFFIX.sub("", reason),
                slurmd_started=fields.get("SlurmdStartTime", ""),
            )
        )
    return nodes


def drain(name: str, reason: str) -> None:
    scontrol("update", f"nodename={name}", "state=drain", f"reason={reason}")


def read_nodes(*names: str) -> list[NodeState]:
    """The named nodes, or every node."""
    return parse_nodes(scontrol("--oneliner", "show", "node", *names))


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
        return f"left {node.state}{'+drain' if node.drained else ''}" + (
            f" ({node.reason})" if node.reason else ""
        )
    verb, reason = action
    if verb == "drain":
        drain(name, reason)
        return f"drained: {reason}"
    scontrol("update", f"nodename={name}", "state=resume")
    return f"resumed (was: {reason})"
