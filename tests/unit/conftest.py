"""Unit tests' shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.kubeapi import Fake


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Fake]:
    """Local mode's fake API server, in-process, with a stub kubelet."""
    made = Fake(tmp_path)
    yield made
    made.close()
