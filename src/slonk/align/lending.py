"""`slonk pool scale`'s targets, for the syncer (paths.LENDING: {pool: replicas}).

Scaling a pool down, `slonk pool scale` sets the target first: the nodes at or above it count
as lent, and are drained, before the StatefulSet is scaled. The syncer drops a target once the
StatefulSet's replicas reached it: from then on the replicas say it, and a later `kubectl
scale` up gives the nodes back."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

from slonk.base import paths
from slonk.base.files import write_atomically


def targets(path: Path = paths.LENDING) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if type(v) is int and v >= 0}  # not a bool


def set_target(pool: str, replicas: int | None, path: Path = paths.LENDING) -> None:
    """Set (or, with None, drop) a pool's target: read, change and replace under a lock, as
    `slonk pool scale` for several pools and the syncer may write at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = targets(path)
        if replicas is None and pool not in found:
            return
        if replicas is None:
            found.pop(pool)
        else:
            found[pool] = replicas
        write_atomically(path, json.dumps(found, sort_keys=True))
