"""The GPUs' serial numbers, from the worker to the controller's node history.

The worker asks nvidia-smi once, at boot (`slonk init`, beside the boot checks), and its first
health run (slurmd's, before it registers) puts them on its Slurm node's `Extra` field with
scontrol, which workers run as root already. The controller reads every node's Extra in the
`scontrol show node --json` each syncer and recycle pass makes anyway: no new channel, no new
right, and slurmctld keeps it on its state volume across controller restarts. A new pod writes
its own (none, when it has no GPUs), so a recycled node shows the machine it now runs on.

Extra is a free-form field a site may use: slonk writes it only when it is empty or JSON
slonk wrote (an object with EXTRA_KEY), and keeps the object's other keys."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slonk.base.files import write_atomically
from slonk.base.paths import HEALTH_STATE
from slonk.health import gpu
from slonk.health.probe import Unhealthy
from slonk.slurm import slurm_nodes

SAVED = HEALTH_STATE / "gpu-serials.json"
REPORTED = HEALTH_STATE / "gpu-serials.reported"  # this pod's are on its Slurm node
EXTRA_KEY = "slonk.gpuSerials"
# nvidia-smi prints `[N/A]` for a GPU with no serial (consumer boards); real ones are digits.
SERIAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_GPUS = 64


def query(options: Mapping[str, Any], timeout: float) -> list[str]:
    """The serial of each GPU nvidia-smi answers for; none when it cannot say."""
    try:
        rows = gpu.query(options["nvidiaSmi"], ("serial",), "gpu", timeout)
    except Unhealthy:  # the gpu check says what is wrong; a serial is only a name
        return []
    return [row[0] for row in rows if SERIAL.fullmatch(row[0])][:MAX_GPUS]


def save(serials: Sequence[str], path: Path = SAVED) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(list(serials)) + "\n")


def saved(path: Path = SAVED) -> list[str] | None:
    """What boot saved; None when there is nothing (not a worker pod of this version)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return (
        [s for s in data if isinstance(s, str) and SERIAL.fullmatch(s)]
        if isinstance(data, list)
        else None
    )


def _object(extra: str) -> dict[str, Any] | None:
    """Extra as slonk may rewrite it: {} when empty, the object when JSON; None when it is a
    site's text."""
    if not extra.strip():
        return {}
    try:
        data = json.loads(extra)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def decode(extra: str) -> tuple[str, ...]:
    """The serials a node's Extra holds (untrusted: anything else reads as none)."""
    data = _object(extra) or {}
    found = data.get(EXTRA_KEY)
    if not isinstance(found, list):
        return ()
    return tuple(s for s in found if isinstance(s, str) and SERIAL.fullmatch(s))[:MAX_GPUS]


def encode(extra: str, serials: Sequence[str]) -> str | None:
    """The new Extra, or None when it must stay as it is (a site's text, or already so)."""
    data = _object(extra)
    if data is None or data.get(EXTRA_KEY) == list(serials):
        return None
    if serials:
        data[EXTRA_KEY] = list(serials)
    else:
        data.pop(EXTRA_KEY, None)
    return json.dumps(data, separators=(",", ":")) if data else ""


def report(node_name: str, done: Path = REPORTED) -> str | None:
    """Put boot's serials on the node's Extra, once per pod (`done` says it is); what was
    done, for the log (None: nothing). Raises while Slurm cannot be asked: a later health
    run tries again."""
    if done.exists():  # every later health run: one stat, nothing more
        return None
    serials = saved()
    if serials is None:
        return None
    node = slurm_nodes.read_node(node_name)
    new = encode(node.extra, serials)
    if new is not None:
        slurm_nodes.scontrol("update", f"nodename={node_name}", f"extra={new}")
    done.touch()
    return None if new is None else f"GPU serials on the node: {', '.join(serials) or 'none'}"
