"""The Kubernetes API as the controller's loops use it (the syncer, the recycle loop), through
the official client with the controller pod's ServiceAccount, or outside a pod the operator's
kubeconfig: the error every caller catches, and the calls more than one loop makes, each
bounded in time. The chart's Role allows exactly what they ask (templates/rbac.yaml)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from slonk.base.errors import SlonkError

QUARANTINE_KEY = "slonk.io/quarantine"
QUARANTINE_REASON = "slonk.io/quarantine-reason"
CONNECT_SECONDS, WRITE_SECONDS = 10, 30


class KubeError(SlonkError):
    pass


class PodReplaced(KubeError):
    """The pod to delete is gone or was made anew since it was inspected."""


def api_client() -> Any:
    """A client from the pod's ServiceAccount, or, outside a pod, the operator's kubeconfig."""
    try:
        from kubernetes import client, config  # heavy: only the controller image has it
    except ImportError:
        raise KubeError("the controller's loops need the Kubernetes client: slonk[kube]") from None
    try:
        config.load_incluster_config()
    except config.ConfigException as in_pod:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as err:
            raise KubeError(
                f"no Kubernetes API: not in a pod ({in_pod}), and no kubeconfig ({err})"
            ) from err
    return client.ApiClient()


class Api:
    """The API of one namespace (the release's); `api` a client made elsewhere (tests)."""

    def __init__(self, namespace: str, api: Any = None) -> None:
        self.namespace = namespace
        self.api_client = api or api_client()
        from kubernetes import client

        self.core = client.CoreV1Api(self.api_client)
        self._error = client.ApiException
        self.writes = 0

    def _call(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from urllib3.exceptions import HTTPError

        self.writes += 1
        try:
            return method(*args, **kwargs, _request_timeout=(CONNECT_SECONDS, WRITE_SECONDS))
        except self._error as err:
            raise KubeError(f"{what}: {err.status} {err.reason}") from err
        except HTTPError as err:  # no answer: the network, or the API server away
            raise KubeError(f"{what}: {type(err).__name__}: {err}") from err

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        """A core/v1 Event slonk.metrics.node_events made (on a pod, or a Node in `default`)."""
        about = body.get("involvedObject") or {}
        self._call(
            f"event on {str(about.get('kind', '')).lower()} {about.get('name')}",
            self.core.create_namespaced_event,
            namespace,
            dict(body),
        )

    def pod_place(self, name: str) -> tuple[str, str]:
        """(its Kubernetes Node, its uid): which machine a recycle or quarantine is about."""
        found = self._call(f"read pod {name}", self.core.read_namespaced_pod, name, self.namespace)
        return found.spec.node_name or "", found.metadata.uid or ""

    def delete_pod(self, name: str, uid: str = "") -> None:
        """Its StatefulSet makes it anew: fresh containers, boot checks, slurmd registers.
        With `uid`, that pod only (a precondition), never one made since: PodReplaced when it
        is another, or gone. A delete left without an answer may still have been done: the
        pod is read back, and gone, going or made anew, the delete went through (the caller
        must not count it as undone)."""
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            self._call(
                f"delete pod {name}",
                self.core.delete_namespaced_pod,
                name,
                self.namespace,
                body=body,
            )
        except KubeError as err:
            status = getattr(err.__cause__, "status", None)
            if status in (404, 409):  # gone, or its uid no longer the one inspected
                raise PodReplaced(str(err)) from err
            if status is not None or not self._went(name, uid):
                raise

    def _went(self, name: str, uid: str) -> bool:
        """Whether the pod `name` (of `uid`, if given) is gone or going."""
        try:
            found = self._call(
                f"read pod {name}", self.core.read_namespaced_pod, name, self.namespace
            )
        except KubeError as err:
            return getattr(err.__cause__, "status", None) == 404
        meta = found.metadata
        return bool(meta.deletion_timestamp) or bool(uid and meta.uid != uid)

    def quarantine_node(self, pod: str, slurm_node: str, reason: str) -> str:
        """Taint the Kubernetes node under `pod` (nothing new lands there) and say why, for
        whoever replaces it. Returns the node's name."""
        found = self._call(f"read pod {pod}", self.core.read_namespaced_pod, pod, self.namespace)
        node_name = found.spec.node_name
        node = self._call(f"read node {node_name}", self.core.read_node, node_name)
        taints = [t.to_dict() for t in node.spec.taints or [] if t.key != QUARANTINE_KEY]
        taints.append({"key": QUARANTINE_KEY, "value": slurm_node, "effect": "NoSchedule"})
        patch = {
            "metadata": {"annotations": {QUARANTINE_REASON: reason}},
            "spec": {"taints": taints},
        }
        self._call(f"taint node {node_name}", self.core.patch_node, node_name, patch)
        return node_name
