"""Trend rules on this node: a GPU counter read at each watch, its samples over the rule's
window kept in the pod's health state, and a failure when one GPU's count rose by more than the
rule allows within the window (slonk.config.trends). Counters only grow while the driver stays
loaded; one that falls was reset, and counts again from there.

A rule's name in a node's plan, results and drain reason is `trend:<rule>`. Its samples live
with the pod (HEALTH_STATE): a new pod starts its windows afresh."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slonk.base.files import write_atomically
from slonk.base.paths import HEALTH_STATE
from slonk.config.trends import PREFIX
from slonk.health import gpu
from slonk.health.probe import Unhealthy

__all__ = ["PREFIX", "check", "increases"]

MAX_SAMPLES = 4096  # a day's watches at one every 21 s; older ones thin out below


def samples_path(rule: str, state: Path) -> Path:
    return state / f"trend-{rule}.json"


def _load(path: Path) -> list[tuple[float, dict[str, int]]]:
    try:
        records = json.loads(path.read_text())
        return [(float(t), {str(k): int(v) for k, v in values.items()}) for t, values in records]
    except (OSError, ValueError, TypeError, AttributeError):
        return []  # none yet, or not ours to trust: the window starts again


def increases(samples: list[tuple[float, dict[str, int]]]) -> dict[str, int]:
    """Each GPU's rise over the samples, oldest first: from its last reset (a fall) on."""
    rise: dict[str, int] = {}
    base: dict[str, int] = {}
    last: dict[str, int] = {}
    for _, values in samples:
        for index, value in values.items():
            if index not in base or value < last[index]:
                base[index] = value
            last[index] = value
            rise[index] = value - base[index]
    return rise


def check(options: Mapping[str, Any], timeout: float, state: Path = HEALTH_STATE) -> str:
    """Read the rule's counter, keep it, and judge the window: a short description, or
    Unhealthy naming the GPU, its rise and the window."""
    rule, field = options["rule"], options["field"]
    rows = gpu.query(options["nvidiaSmi"], ("index", field), "gpu", timeout)
    now = time.time()
    current = {index: int(value) for index, value in rows if value.isdigit()}
    path = samples_path(rule, state)
    window = options["windowSeconds"]
    kept = [(t, v) for t, v in _load(path) if now - window <= t <= now]
    kept = [*kept[-(MAX_SAMPLES - 1) :], (now, current)]
    if state.is_dir():
        write_atomically(path, json.dumps(kept) + "\n")
    rise = increases(kept)
    most = options["maxIncrease"]
    over = [f"GPU {i} {field} +{n}" for i, n in sorted(rise.items()) if n > most]
    span = now - kept[0][0]
    if over:
        raise Unhealthy(f"{', '.join(over)} in {span:.0f} s (at most {most} in {window} s)")
    if not current:
        return f"{field} not counted by these GPUs"
    return f"{field} +{max(rise.values(), default=0)} in {span:.0f} s"
