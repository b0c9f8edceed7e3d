"""A per-pod phase for periodic work that asks a shared server (LDAP), so that N pods with
the same period do not all ask it in the same second.

The phase is a fraction of the period taken from the pod's name (deterministic: a restarted
pod keeps its slot; uniform over names), and the slots are counted from the epoch, so pods
started at the same moment are spread as much as pods started hours apart.
"""

from __future__ import annotations

import hashlib
import math


def phase(name: str, period: float) -> float:
    """Seconds into each period at which `name` does its work: 0 <= phase < period."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * period


def next_slot(now: float, period: float, offset: float) -> float:
    """The first time strictly after `now` (epoch seconds) that is `offset` past a multiple
    of `period`: at most one period away."""
    return offset + (math.floor((now - offset) / period) + 1) * period
