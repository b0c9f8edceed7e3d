"""The exporter over HTTP (the agent's task `metrics`), or one scrape printed (`slonk
metrics show --role controller|worker`)."""

from __future__ import annotations

import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.process_collector import ProcessCollector

from slonk import paths
from slonk.metrics import sources
from slonk.metrics.collector import SourcesCollector, log


def registry(role: str, cluster: Path = paths.CLUSTER_SPEC) -> CollectorRegistry:
    """The role's collector, and the process' own (memory, CPU, open files: process_*)."""
    if role == "controller":
        found = sources.controller(sources.Spec(cluster))
    else:
        from slonk.identity import pod_name

        found = sources.worker(pod_name())
    collected = CollectorRegistry()
    collected.register(SourcesCollector(found))
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
) -> None:
    """Serve /metrics until `stop` is set: one pass over the sources per request."""
    started = start_http_server(port, addr=address, registry=registry(role, cluster))
    log(f"serving the {role}'s metrics on port {port} at /metrics")
    stop.wait()
    if started:  # prometheus_client >= 0.17 hands back its server (Debian 12's 0.16 does not)
        started[0].shutdown()
