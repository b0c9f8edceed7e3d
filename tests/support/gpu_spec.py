"""A cluster.yaml document of two pools, one with GPUs: what the GPU-side health tests (active
checks, trend rules) parse, each adding its own `health` section."""

from __future__ import annotations

import copy
from typing import Any


def gpu_and_cpu_pools(health: dict[str, Any]) -> dict[str, Any]:
    """A fresh document (tests change it) with `health` on and its keys."""
    return copy.deepcopy(
        {
            "version": 1,
            "clusterName": "t",
            "release": "slonk",
            "nodepools": {
                "gpu": {"replicas": 2, "cpus": 4, "memoryMiB": 1024, "gpus": {"count": 2}},
                "cpu": {"replicas": 1, "cpus": 4, "memoryMiB": 1024},
            },
            "partitions": {"main": {"pools": ["gpu", "cpu"], "default": True}},
            "health": {"enabled": True, **health},
        }
    )
