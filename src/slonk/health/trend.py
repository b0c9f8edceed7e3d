"""Trend rules on this node: a GPU counter read at each watch, its samples over the rule's
window kept in the pod's health state, and a failure when one GPU's count rose by more than the
rule allows within the window (slonk.config.trends). Counters only grow while the driver stays
loaded; one that falls was reset, and counts again from there.

A rule's name in a node's plan, results and drain reason is `trend:<rule>`. Its samples live
with the pod (HEALTH_STATE): a new pod starts its windows afresh."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slonk.base.files import write_atomically
from slonk.base.paths import HEALTH_STATE
from slonk.health import gpu
from slonk.health.probe import Inconclusive, Unhealthy

# Samples kept a window: at most this many, spaced evenly over it (each watch is judged,
# whether or not its sample is kept).
MAX_SAMPLES = 1024
# The agent's own copy, by file: the watch's process lives as long as the pod, and a file
# users could fill (the pod's filesystem) must never be what the judgement rests on.
_KEPT: dict[Path, list[tuple[float, dict[str, int]]]] = {}


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
        for gpu_id, value in values.items():
            if gpu_id not in base or value < last[gpu_id]:
                base[gpu_id] = value
            last[gpu_id] = value
            rise[gpu_id] = value - base[gpu_id]
    return rise


def _read(options: Mapping[str, Any], timeout: float) -> tuple[dict[str, int], dict[str, str]]:
    """Each GPU's count by its bus id (an index shifts when a GPU drops), and its index, from
    the rule's program (nvidia-smi, or slonk.health.nvml, which answers alike). One that fails
    says nothing of a trend: the GPU check is the one to drain for it."""
    field = options["field"]
    try:
        rows = gpu.query(options["command"], ("index", "pci.bus_id", field), "gpu", timeout)
    except Unhealthy as err:
        raise Inconclusive(f"cannot read {field}: {err}") from None
    counts, names = {}, {}
    for index, bus, value in rows:
        if value.isascii() and value.isdigit():  # [N/A] where a GPU does not count it
            counts[bus], names[bus] = int(value), index
    return counts, names


def check(options: Mapping[str, Any], timeout: float, state: Path = HEALTH_STATE) -> str:
    """Read the rule's counter, keep it, and judge the window: a short description, or
    Unhealthy naming each GPU past the rule. The words do not change while the rise holds,
    so that the watch does not ask Slurm again each round."""
    rule, field, window = options["rule"], options["field"], options["windowSeconds"]
    current, names = _read(options, timeout)
    now = time.time()
    path = samples_path(rule, state)
    kept = [(t, v) for t, v in _KEPT.get(path) or _load(path) if now - window <= t <= now]
    judged = [*kept, (now, current)]
    if not kept or now - kept[-1][0] >= window / MAX_SAMPLES:
        kept = judged[-MAX_SAMPLES:]
        _KEPT[path] = kept
        if state.is_dir():
            with contextlib.suppress(OSError):  # for the next agent; this one keeps its own
                write_atomically(path, json.dumps(kept) + "\n")
    rise = increases(judged)
    most = options["maxIncrease"]
    over = [f"GPU {names.get(bus, '?')} ({bus})" for bus, n in sorted(rise.items()) if n > most]
    if over:
        raise Unhealthy(f"{', '.join(over)}: {field} rose by more than {most} within {window} s")
    if not current:
        return f"{field} not counted by these GPUs"
    return f"{field} +{max(rise.values(), default=0)} in {now - judged[0][0]:.0f} s"
