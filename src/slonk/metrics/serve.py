"""The exporter over HTTP (the agent's task `metrics`), or one scrape printed (`slonk
metrics show --role controller|worker`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector

from slonk.agent.runner import Board
from slonk.base import paths
from slonk.metrics import sources
from slonk.metrics.collector import Source, SourcesCollector, log
from slonk.metrics.server import DEFAULT_LIMITS, Limits, MetricsServer


def registry(
    role: str, cluster: Path = paths.CLUSTER_SPEC, more: Mapping[str, Source] | None = None
) -> CollectorRegistry:
    """The role's collector (with `more` sources), and the process' own (memory, CPU, open
    files: process_*)."""
    if role == "controller":
        found = sources.controller(sources.Spec(cluster))
    else:
        from slonk.base.identity import pod_name

        found = sources.worker(pod_name())
    collected = CollectorRegistry()
    collected.register(SourcesCollector({**found, **(more or {})}))
    ProcessCollector(registry=collected)
    return collected


def show(role: str, cluster: Path = paths.CLUSTER_SPEC) -> str:
    return generate_latest(registry(role, cluster)).decode()


def serve(
    role: str,
    port: int,
    stop: threading.Event,
    cluster: Path = paths.CLUSTER_SPEC,
    address: str = "0.0.0.0",
    board: Board | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> None:
    """Serve /metrics until `stop` is set: one pass over the sources per request (or per
    fresh period), within `limits` whoever connects (slonk.metrics.server). With the agent's
    `board`, its tasks' states too."""
    server = MetricsServer(address, port, limits, log)
    more: dict[str, Source] = {"server": server.families}
    if board is not None:
        from slonk.metrics.tasks import task_families

        more["agent"] = lambda: task_families(board)
    log(f"serving the {role}'s metrics on port {port} at /metrics")
    server.serve(registry(role, cluster, more), stop)
