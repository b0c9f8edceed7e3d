"""The integration tests' fixtures: a real local cluster, from tests/support/cluster.py (the
image tests share it), skipped without root or the built images."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator

import pytest

from slonk.base import paths
from slonk.local.cluster import Cluster

from ..support.cluster import ROLES, SCRATCH, LocalCluster, cluster, healthy, image, image_exists

__all__ = ["cluster", "healthy"]  # fixtures, found here by pytest


def pytest_configure(config: pytest.Config) -> None:
    checkout = paths.checkout()
    if checkout and checkout.is_relative_to(SCRATCH):
        raise pytest.UsageError(
            f"the checkout {checkout} is under {SCRATCH}, where these tests mount a small disk "
            "on a worker (hiding the checkout from it): run them from a checkout elsewhere"
        )


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


# What a failed test leaves for whoever reads CI's output: each pod's log from the test's start
# and the nodes as Slurm has them (the cluster is gone by the time anyone looks).
LOG_LINES = 40


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    found = item.funcargs.get("cluster")  # type: ignore[attr-defined]
    if isinstance(found, LocalCluster):
        pods = Cluster(found.state_dir).pod_names()
        item.stash[_LOGS_FROM] = (found, {p: found.log_offset(p) for p in pods})
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    # A teardown that fails (a fixture setting the cluster back) is read the same way.
    if report.when in ("call", "teardown") and report.failed and _LOGS_FROM in item.stash:
        found, offsets = item.stash[_LOGS_FROM]
        for pod, offset in offsets.items():
            tail = found.log(pod, offset).splitlines()[-LOG_LINES:]
            title = f"{pod}'s log during the test (last {LOG_LINES} lines)"
            report.sections.append((title, "\n".join(tail)))
        nodes = "\n".join(f"{n}: {s} {r!r}" for n, (s, r) in found.nodes().items())
        report.sections.append(("nodes after the test", nodes))
    return report


_LOGS_FROM = pytest.StashKey[tuple[LocalCluster, dict[str, int]]]()
