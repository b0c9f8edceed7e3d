"""The integration tests' fixtures: a real local cluster, from tests/support/cluster.py (the
image tests share it), skipped without root or the built images."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from slonk.base import paths
from slonk.local.cluster import Cluster

from ..support.cluster import ROLES, SCRATCH, LocalCluster, cluster, healthy, image, image_exists

__all__ = ["cluster", "healthy"]  # fixtures, found here by pytest


def pytest_configure(config: pytest.Config) -> None:
    if gone := [m for m in SLOWEST_FIRST if not (Path(__file__).parent / f"{m}.py").exists()]:
        raise pytest.UsageError(f"SLOWEST_FIRST names modules that are gone: {gone}")
    checkout = paths.checkout()
    if checkout and checkout.is_relative_to(SCRATCH):
        raise pytest.UsageError(
            f"the checkout {checkout} is under {SCRATCH}, where these tests mount a small disk "
            "on a worker (hiding the checkout from it): run them from a checkout elsewhere"
        )


# The modules that take longest, longest first (seconds on a quiet 2-core machine, with the
# cluster each starts: junit `time`, summed per module). ci/integration runs modules three at
# a time, each whole in one process, in collection order (--no-loadscope-reorder): started
# first, no long module is left to begin near the end while the other processes idle
# (measured: makespan 657 s in name order; 629 s simulated in this order).
SLOWEST_FIRST = (
    "test_local_health",  # 190
    "test_local_cluster",  # 167
    "test_local_power",  # 138
    "test_local_active",  # 125
    "test_local_topology",  # 118
    "test_local_ssh",  # 111
    "test_local_hooks",  # 109
    "test_local_backup_controller",  # 84
    "test_local_align",  # 78
    "test_config_rollout",  # 78
    "test_local_scrontab",  # 71: cron's next minute, then Slurm's next scheduling pass
)


def _slowness(item: pytest.Item) -> int:
    module = item.path.stem
    return SLOWEST_FIRST.index(module) if module in SLOWEST_FIRST else len(SLOWEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_slowness)  # stable: a module's tests keep their order
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
