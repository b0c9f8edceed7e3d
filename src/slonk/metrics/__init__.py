"""INTERIM copy for the history branch alone: the metrics branch owns slonk.metrics and its
cause_label (the contract's); when merging, take the metrics branch's files and drop this one."""

from __future__ import annotations

from slonk.health import reasons
from slonk.health.catalogue import HEALTH_CHECKS


def cause_label(reason: str) -> str:
    if not reason:
        return "none"
    cause = reasons.classify(reason)
    if cause is None:
        return "human"
    if cause.kind == reasons.HEALTH:
        return cause.name if cause.name in HEALTH_CHECKS else "other-check"
    return cause.kind
