"""Where each node's pod landed, by switch and block, as the syncer reads it from the Kubernetes
Node labels named in `syncer.topologyLabels` (slonk.align). Saved on the controller's volume
beside slurmctld's state; topology.conf is rendered from it, a pool's static `topology` being
the fallback for nodes it does not name.

Label values come from Node objects: whoever may label a Node writes here. A value that is not
a Slurm name, or an attribute other than switch and block, is dropped, never rendered."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from slonk.base import paths
from slonk.base.files import write_atomically
from slonk.config import patterns

Placement = Mapping[str, Mapping[str, str]]  # node -> {"switch"|"block": group}
ATTRIBUTES = ("switch", "block")
_NAME = re.compile(patterns.SLURM_NAME)


def clean(placement: Placement) -> dict[str, dict[str, str]]:
    return {
        str(node): where
        for node, groups in placement.items()
        if isinstance(groups, Mapping)
        and (
            where := {
                k: v
                for k, v in groups.items()
                if k in ATTRIBUTES and isinstance(v, str) and _NAME.fullmatch(v) and len(v) <= 63
            }
        )
    }


def load(path: Path = paths.PLACEMENT) -> dict[str, dict[str, str]]:
    """The saved placement; empty (the static topology) when there is none or it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return clean(data) if isinstance(data, dict) else {}


def save(placement: Placement, path: Path = paths.PLACEMENT) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(clean(placement), sort_keys=True))
