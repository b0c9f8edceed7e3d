"""`slonk metrics serve|show --role controller|worker`: the exporter over HTTP (the s6
service `metrics`), or one scrape printed."""

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
    role: str, port: int, cluster: Path = paths.CLUSTER_SPEC, address: str = "0.0.0.0"
) -> None:
    """Serve /metrics until the process is stopped: one pass over the sources per request."""
    start_http_server(port, addr=address, registry=registry(role, cluster))
    log(f"serving the {role}'s metrics on port {port} at /metrics")
    threading.Event().wait()
