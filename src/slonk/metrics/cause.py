"""The cause label: why a node is drained or down, as a bounded word. Prometheus and the node
history key on it, so it never carries text from the reason itself beyond this set."""

from __future__ import annotations

from slonk.config.active_checks import NAMES as ACTIVE_CHECKS
from slonk.config.health_checks import HEALTH_CHECKS
from slonk.config.trends import NAMES as TREND_RULES
from slonk.slurm import reasons

NONE, OTHER_CHECK, HUMAN = "none", "other-check", "human"
# Every check slonk ships, by the name its results and drains carry: passive, active, trend.
CHECKS = frozenset({*HEALTH_CHECKS, *ACTIVE_CHECKS, *TREND_RULES})
# Every value cause_label returns.
CAUSES = frozenset(
    {
        NONE,
        OTHER_CHECK,
        HUMAN,
        reasons.HOOK,
        reasons.QUARANTINE,
        reasons.POD,
        reasons.SCALE_DOWN,
        reasons.K8S,
        *CHECKS,
    }
)


def cause_label(reason: str) -> str:
    """`none` for no reason; a health check's name (`other-check` for a check slonk does not
    ship); `hook`, `quarantine`, `pod`, `scale-down`, `k8s` for slonk's other drains; `human`
    for any reason slonk did not write. The caller says `none` for a node neither drained nor
    down, whose reason is stale."""
    if not reason:
        return NONE
    cause = reasons.classify(reason)
    if cause is None:
        return HUMAN
    if cause.kind == reasons.HEALTH:
        return cause.name if cause.name in CHECKS else OTHER_CHECK
    return cause.kind
