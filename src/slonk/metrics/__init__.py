"""Prometheus metrics: the cluster exporter on the controller, health results on workers; and
what happened to a node, recorded (node_events: its history, Kubernetes Events, counters).

Importing the package costs only the cause label (slonk.metrics.cause): the syncer and the
node history use it; prometheus_client is imported by slonk.metrics.collector alone, which
only the `metrics` service loads."""

from slonk.metrics.cause import CAUSES, cause_label

__all__ = ["CAUSES", "cause_label"]
