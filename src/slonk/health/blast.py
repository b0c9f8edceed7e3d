"""The one home of the blast-radius rule: a check whose failure many nodes share at once points
at something they share (a full /home, cluster DNS, a bad driver roll-out), not at each
machine. One check may hold at most `health.maxDrainedPercent` of the nodes drained (at least
one); past that, its failures are reported, not drained, and none of its nodes is recycled or
quarantined: a new pod cannot fix a shared dependency, and a machine quarantined for one
stays out after the dependency heals.

Nodes decide alone, so two can drain in the same second: each looks before its drain and
again once that second has passed (slonk.health.drains.CONFIRM_AFTER_SECONDS), when every
drain stamped with it is there to see, and every node orders a check's drains the same way
(by when Slurm took the reason, then by name). A node past the limit undoes its own drain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from slonk.slurm import reasons
from slonk.slurm.slurm_state import NodeState


def limit(nodes: int, percent: int) -> int:
    """How many nodes one check may hold drained: `percent` of `nodes`, at least one."""
    return max(1, nodes * percent // 100)


def drained_by(node: NodeState) -> str | None:
    """The health check that drained the node, if one did."""
    cause = node.cause
    return cause.name if cause is not None and cause.kind == reasons.HEALTH else None


def drained_for(nodes: Iterable[NodeState], check: str) -> list[NodeState]:
    """The nodes a health check `check` drained, first drained first."""
    found = [n for n in nodes if drained_by(n) == check]
    return sorted(found, key=lambda n: (n.reason_time, n.name))


def within(nodes: list[NodeState], check: str, name: str, percent: int) -> bool:
    """Whether node `name`'s drain for `check` is among the first the limit allows (or, not
    drained for it yet, whether one more drain would be)."""
    drained = [n.name for n in drained_for(nodes, check)]
    allowed = limit(len(nodes), percent)
    if name in drained:
        return drained.index(name) < allowed
    return len(drained) < allowed


def over_limit(nodes: list[NodeState], percent: int) -> set[str]:
    """The checks holding more nodes drained than the limit allows: shared failures."""
    counts = Counter(check for n in nodes if (check := drained_by(n)) is not None)
    allowed = limit(len(nodes), percent)
    return {check for check, count in counts.items() if count > allowed}
