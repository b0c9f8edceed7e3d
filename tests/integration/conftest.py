"""The integration tests' fixtures: a real local cluster, from tests/support/cluster.py (the
image tests share it), skipped without root or the built images."""

from __future__ import annotations

import os

import pytest

from ..support.cluster import ROLES, cluster, healthy, image, image_exists

__all__ = ["cluster", "healthy"]  # fixtures, found here by pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = None
    if os.geteuid() != 0:
        reason = "integration tests need root (network namespaces, mounts)"
    elif absent := [i for i in map(image, ROLES) if not image_exists(i)]:
        reason = f"not built: {', '.join(absent)} (scripts/build-images)"
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
