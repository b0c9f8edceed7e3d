"""A pod's /metrics as Prometheus sees it, for the integration tests."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from slonk.local.network import Network
from slonk.local.state import Cluster

from .cluster import LocalCluster, wait_for

PORT = 9341  # cluster.yaml's metrics.port when the chart leaves it out


def scrape(cluster: LocalCluster, target: str) -> dict[str, list]:
    """/metrics of `target`'s pod, fetched from outside the cluster as Prometheus does, in
    the network namespace of the cluster's switch (the pods' policies let a scrape in from
    there; a login pod may send it nowhere); {name: samples}."""
    url = f"http://{Cluster(cluster.state_dir).address(target)}:{PORT}/metrics"
    fetch = (
        f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=30).read().decode())"
    )
    switch = Network.for_state_dir(cluster.state_dir).switch
    out = wait_for(
        f"{target}:{PORT}/metrics",
        lambda: subprocess.run(
            ["ip", "netns", "exec", switch, sys.executable, "-c", fetch],
            capture_output=True, text=True, timeout=60, check=False,
        ).stdout,
    )  # fmt: skip
    found: dict[str, list] = {}  # by sample name: a counter's family name has no _total
    for family in text_string_to_metric_families(out):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def values(families: dict[str, list], name: str, **labels: str) -> list[float]:
    return [s.value for s in families[name] if all(s.labels.get(k) == v for k, v in labels.items())]
