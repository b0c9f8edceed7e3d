"""A local cluster as API objects: the chart's StatefulSets and PDBs as rendered, each pod as
its StatefulSet's controller would make it from the template, landed on its own Node
`local-<pod>` (labels: kubernetes.io/hostname and the pod template's nodeSelector)."""

from __future__ import annotations

import copy
import platform
from typing import Any

Object = dict[str, Any]
NODE_PREFIX = "local-"
FAKE_VERSION = "v1.32.0-slonk-fake"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"


def node_name(pod: str) -> str:
    return f"{NODE_PREFIX}{pod}"


def ordinal(pod: str) -> tuple[str, int]:
    """("slonk-cpu", 1) for slonk-cpu-1."""
    base, _, number = pod.rpartition("-")
    return base, int(number)


def namespace_object(name: str) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def statefulset_object(rendered: Object, namespace: str) -> Object:
    sts = copy.deepcopy(rendered)
    sts["metadata"]["namespace"] = namespace
    sts["spec"].setdefault("podManagementPolicy", "OrderedReady")
    sts["status"] = {"replicas": 0, "readyReplicas": 0, "availableReplicas": 0}
    return sts


def budget_object(rendered: Object, namespace: str) -> Object:
    pdb = copy.deepcopy(rendered)
    pdb["metadata"]["namespace"] = namespace
    pdb["status"] = {
        "currentHealthy": 0,
        "desiredHealthy": 0,
        "disruptionsAllowed": 0,
        "expectedPods": 0,
    }
    return pdb


def unschedulable(spec: Object, node: Object | None) -> str | None:
    """Why the scheduler would not bind a pod of this spec to `node` (its only one: each
    local pod has its own), None if it would: the node cordoned, or tainted NoSchedule or
    NoExecute without a matching toleration."""
    if node is None:
        return "its node does not exist"
    taints = list(node.get("spec", {}).get("taints") or [])
    if node.get("spec", {}).get("unschedulable"):
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in spec.get("tolerations") or []):
            return (
                f"0/1 nodes are available: 1 node(s) had untolerated taint "
                f"{{{taint['key']}: {taint.get('value', '')}}}"
                if "unschedulable" not in taint["key"]
                else "0/1 nodes are available: 1 node(s) were unschedulable"
            )
    return None


def _tolerates(toleration: Object, taint: Object) -> bool:
    if toleration.get("effect") not in (None, "", taint.get("effect")):
        return False
    if toleration.get("operator") == "Exists":
        return toleration.get("key") in (None, "", taint.get("key"))
    return toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get(
        "value", ""
    )


def pod_object(sts: Object, number: int, address: str, bound: bool = True) -> Object:
    """Pod `number` of `sts` as its controller makes it: the template's metadata and spec,
    its name label and owner, bound to its own Node (unless `bound` is False: the scheduler
    would not place it there); Pending until kubelet says more."""
    template = sts["spec"]["template"]
    name = f"{sts['metadata']['name']}-{number}"
    spec = copy.deepcopy(template["spec"])
    spec.update(
        {
            **({"nodeName": node_name(name)} if bound else {}),
            "hostname": name,
            "subdomain": sts["spec"].get("serviceName", ""),
            "terminationGracePeriodSeconds": spec.get("terminationGracePeriodSeconds", 30),
            "restartPolicy": spec.get("restartPolicy", "Always"),
        }
    )
    spec.setdefault("serviceAccountName", "default")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": sts["metadata"]["namespace"],
            "labels": {**template["metadata"].get("labels", {}), POD_NAME_LABEL: name},
            "annotations": dict(template["metadata"].get("annotations") or {}),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": sts["metadata"]["name"],
                    "uid": sts["metadata"].get("uid", ""),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
        "status": {
            "phase": "Pending",
            "podIP": address,
            "podIPs": [{"ip": address}],
            "conditions": [],
            "containerStatuses": [],
        },
    }


def pod_status(pod: Object, pid: int | None, restarts: int, started: str | None) -> Object:
    """The status kubelet reports: Running and Ready while the pod's process runs, else
    Pending and not Ready (local mode restarts no container by itself)."""
    if not pod["spec"].get("nodeName"):
        return unscheduled_status(pod, "")
    running = pid is not None
    containers = pod["spec"].get("containers") or []
    flag = "True" if running else "False"
    status = dict(pod.get("status") or {})
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    stamp = started or pod["metadata"].get("creationTimestamp")
    for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        value = "True" if kind in ("PodScheduled", "Initialized") else flag
        old = conditions.get(kind, {})
        conditions[kind] = {
            "type": kind,
            "status": value,
            "lastProbeTime": None,
            "lastTransitionTime": old.get("lastTransitionTime")
            if old.get("status") == value
            else stamp,
        }
    state: Object = (
        {"running": {"startedAt": started}}
        if running
        else {"waiting": {"reason": "ContainerCreating"}}
    )
    status.update(
        {
            "phase": "Running" if running else "Pending",
            "conditions": list(conditions.values()),
            "startTime": status.get("startTime") or pod["metadata"].get("creationTimestamp"),
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": running,
                    "started": running,
                    "restartCount": restarts,
                    "state": state,
                    "containerID": f"local://{pid}" if running else "",
                }
                for c in containers
            ],
        }
    )
    return status


def node_object(pod: str, address: str, selector: dict[str, str]) -> Object:
    name = node_name(pod)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **selector,
            },
            "annotations": {},
        },
        "spec": {},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "local mode's stand-in kubelet is posting ready status",
                    "lastHeartbeatTime": None,
                    "lastTransitionTime": None,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "kubeletVersion": FAKE_VERSION,
                "kubeProxyVersion": "",
                "osImage": "slonk local",
                "kernelVersion": platform.release(),
                "containerRuntimeVersion": "slonk-local://1",
                "architecture": "amd64",
                "operatingSystem": "linux",
                "bootID": "",
                "machineID": "",
                "systemUUID": "",
            },
        },
    }


def unscheduled_status(pod: Object, why: str) -> Object:
    """Pending, not bound: PodScheduled False, as the scheduler reports it."""
    old: Object = next(
        (c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == "PodScheduled"),
        {},
    )
    return {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": why or old.get("message", ""),
                "lastProbeTime": None,
                "lastTransitionTime": pod["metadata"].get("creationTimestamp"),
            }
        ],
    }
