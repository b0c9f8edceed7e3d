"""The two things the recycler asks of Kubernetes, through the official client with the
controller pod's ServiceAccount (the chart's Role allows exactly these)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slonk.errors import SlonkError

QUARANTINE_KEY = "slonk.io/quarantine"
QUARANTINE_REASON = "slonk.io/quarantine-reason"


class KubeError(SlonkError):
    pass


class KubeApi:
    """The Kubernetes API of the controller pod's namespace, as the recycler uses it."""

    def __init__(self, namespace: str) -> None:
        try:
            from kubernetes import client, config  # heavy: only the controller image has it
        except ImportError:
            raise KubeError("the recycler needs the Kubernetes client: slonk[kube]") from None

        try:
            config.load_incluster_config()
        except config.ConfigException as err:
            raise KubeError(f"no Kubernetes API from this pod: {err}") from err
        self.api = client.CoreV1Api()
        self.namespace = namespace
        self._error = client.ApiException

    def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except self._error as err:
            raise KubeError(f"{what}: {err.status} {err.reason}") from err

    def pod_place(self, name: str) -> tuple[str, str]:
        """(its Kubernetes Node, its uid): which machine a recycle or quarantine is about."""
        found = self._call(f"read pod {name}", self.api.read_namespaced_pod, name, self.namespace)
        return found.spec.node_name or "", found.metadata.uid or ""

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        """A core/v1 Event slonk.node_events made (on a pod, or a Node in `default`)."""
        about = body.get("involvedObject") or {}
        self._call(
            f"event on {str(about.get('kind', '')).lower()} {about.get('name')}",
            self.api.create_namespaced_event,
            namespace,
            dict(body),
        )

    def delete_pod(self, name: str) -> None:
        """Its StatefulSet makes it anew: fresh containers, boot checks, slurmd registers."""
        self._call(f"delete pod {name}", self.api.delete_namespaced_pod, name, self.namespace)

    def quarantine_node(self, pod: str, slurm_node: str, reason: str) -> str:
        """Taint the Kubernetes node under `pod` (nothing new lands there) and say why, for
        whoever replaces it. Returns the node's name."""
        found = self._call(f"read pod {pod}", self.api.read_namespaced_pod, pod, self.namespace)
        node_name = found.spec.node_name
        node = self._call(f"read node {node_name}", self.api.read_node, node_name)
        taints = [t.to_dict() for t in node.spec.taints or [] if t.key != QUARANTINE_KEY]
        taints.append({"key": QUARANTINE_KEY, "value": slurm_node, "effect": "NoSchedule"})
        patch = {
            "metadata": {"annotations": {QUARANTINE_REASON: reason}},
            "spec": {"taints": taints},
        }
        self._call(f"taint node {node_name}", self.api.patch_node, node_name, patch)
        return node_name
