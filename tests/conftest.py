"""Shared test helpers."""

from __future__ import annotations

import copy
from typing import Any

import pytest

# A small cluster that exercises every renderer feature: two pools on two switches,
# GPUs with a type, features, two partitions.
DEMO_SPEC: dict[str, Any] = {
    "version": 1,
    "clusterName": "demo",
    "release": "slonk",
    "namespace": "hpc",
    "nodepools": {
        "cpu": {
            "replicas": 2,
            "cpus": 4,
            "memoryMiB": 8192,
            "topology": {"switch": "leaf1", "block": "b1"},
        },
        "gpu": {
            "replicas": 4,
            "cpus": 64,
            "memoryMiB": 512000,
            "gpus": {"count": 8, "type": "h100"},
            "features": ["h100", "nvlink"],
            "topology": {"switch": "leaf2", "block": "b2"},
        },
    },
    "partitions": {
        "main": {"pools": ["cpu", "gpu"], "default": True},
        "gpu": {
            "pools": ["gpu"],
            "priorityTier": 10,
            "maxTime": "2-00:00:00",
            "preemptMode": "REQUEUE",
            "options": {"OverSubscribe": "NO"},
        },
    },
}


@pytest.fixture
def demo_spec() -> dict[str, Any]:
    return copy.deepcopy(DEMO_SPEC)
