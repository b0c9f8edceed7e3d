"""`kubectl get`'s columns: the server answers `Accept: ...;as=Table;g=meta.k8s.io;v=v1` with a
meta.k8s.io/v1 Table, as the real API's printers do for these kinds (priority-1 columns show
with `-o wide`). Each row carries the object's metadata, so that `-L label` works."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

Object = dict[str, Any]
Column = tuple[str, str, int]  # name, type, priority


def age(stamp: str | None, at: datetime | None = None) -> str:
    """apimachinery's HumanDuration of the time since `stamp`, as kubectl shows AGE."""
    if not stamp:
        return "<unknown>"
    then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    seconds = int(((at or datetime.now(UTC)) - then).total_seconds())
    if seconds < -1:
        return "<invalid>"
    seconds = max(seconds, 0)
    minutes, hours = seconds // 60, seconds // 3600
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    years = hours // (24 * 365)
    return f"{years}y{(hours // 24) % 365}d" if hours < 24 * 365 * 8 else f"{years}y"


def _condition(obj: Object, kind: str) -> str | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return None


def _pod(pod: Object) -> list[Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    containers = pod.get("spec", {}).get("containers") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    status = pod.get("status", {}).get("phase", "Unknown")
    for s in statuses:
        waiting = s.get("state", {}).get("waiting")
        if waiting and waiting.get("reason"):
            status = waiting["reason"]
    if pod["metadata"].get("deletionTimestamp"):
        status = "Terminating"
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(containers)}",
        status,
        restarts,
        age(pod["metadata"].get("creationTimestamp")),
        pod.get("status", {}).get("podIP", "<none>"),
        pod.get("spec", {}).get("nodeName", "<none>"),
        "<none>",
        "<none>",
    ]


def _node(node: Object) -> list[Any]:
    status = {"True": "Ready", "False": "NotReady"}.get(_condition(node, "Ready") or "", "Unknown")
    if node.get("spec", {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    labels = node["metadata"].get("labels") or {}
    prefix = "node-role.kubernetes.io/"
    roles = ",".join(sorted(k[len(prefix) :] for k in labels if k.startswith(prefix))) or "<none>"
    info = node.get("status", {}).get("nodeInfo", {})
    addresses = {a["type"]: a["address"] for a in node.get("status", {}).get("addresses") or []}
    return [
        node["metadata"]["name"],
        status,
        roles,
        age(node["metadata"].get("creationTimestamp")),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP", "<none>"),
        addresses.get("ExternalIP", "<none>"),
        info.get("osImage", ""),
        info.get("kernelVersion", ""),
        info.get("containerRuntimeVersion", ""),
    ]


def _statefulset(sts: Object) -> list[Any]:
    containers = sts["spec"]["template"]["spec"].get("containers") or []
    return [
        sts["metadata"]["name"],
        f"{sts.get('status', {}).get('readyReplicas', 0)}/{sts['spec'].get('replicas', 1)}",
        age(sts["metadata"].get("creationTimestamp")),
        ",".join(c["name"] for c in containers),
        ",".join(c.get("image", "") for c in containers),
    ]


def _lease(lease: Object) -> list[Any]:
    return [
        lease["metadata"]["name"],
        lease.get("spec", {}).get("holderIdentity") or "",
        age(lease["metadata"].get("creationTimestamp")),
    ]


def _budget(pdb: Object) -> list[Any]:
    spec = pdb.get("spec", {})
    return [
        pdb["metadata"]["name"],
        spec.get("minAvailable", "N/A"),
        spec.get("maxUnavailable", "N/A"),
        pdb.get("status", {}).get("disruptionsAllowed", 0),
        age(pdb["metadata"].get("creationTimestamp")),
    ]


def _event(event: Object) -> list[Any]:
    regarding = event.get("involvedObject") or event.get("regarding") or {}
    last = (
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event["metadata"].get("creationTimestamp")
    )
    return [
        age(last if isinstance(last, str) and len(last) == 20 else None),
        event.get("type", ""),
        event.get("reason", ""),
        f"{regarding.get('kind', '').lower()}/{regarding.get('name', '')}",
        event.get("message") or event.get("note", ""),
    ]


def _default(obj: Object) -> list[Any]:
    return [obj["metadata"]["name"], age(obj["metadata"].get("creationTimestamp"))]


S, INT = "string", "integer"
PRINTERS: dict[str, tuple[Sequence[Column], Callable[[Object], list[Any]]]] = {
    "Pod": (
        (
            ("Name", S, 0),
            ("Ready", S, 0),
            ("Status", S, 0),
            ("Restarts", INT, 0),
            ("Age", S, 0),
            ("IP", S, 1),
            ("Node", S, 1),
            ("Nominated Node", S, 1),
            ("Readiness Gates", S, 1),
        ),
        _pod,
    ),
    "Node": (
        (
            ("Name", S, 0),
            ("Status", S, 0),
            ("Roles", S, 0),
            ("Age", S, 0),
            ("Version", S, 0),
            ("Internal-IP", S, 1),
            ("External-IP", S, 1),
            ("OS-Image", S, 1),
            ("Kernel-Version", S, 1),
            ("Container-Runtime", S, 1),
        ),
        _node,
    ),
    "StatefulSet": (
        (("Name", S, 0), ("Ready", S, 0), ("Age", S, 0), ("Containers", S, 1), ("Images", S, 1)),
        _statefulset,
    ),
    "Lease": ((("Name", S, 0), ("Holder", S, 0), ("Age", S, 0)), _lease),
    "PodDisruptionBudget": (
        (
            ("Name", S, 0),
            ("Min Available", S, 0),
            ("Max Unavailable", S, 0),
            ("Allowed Disruptions", INT, 0),
            ("Age", S, 0),
        ),
        _budget,
    ),
    "Event": (
        (
            ("Last Seen", S, 0),
            ("Type", S, 0),
            ("Reason", S, 0),
            ("Object", S, 0),
            ("Message", S, 0),
        ),
        _event,
    ),
}


def table(kind: str, items: Sequence[Object], resource_version: int, full: bool) -> Object:
    """A Table of `items`; each row's object is its metadata (PartialObjectMetadata) or,
    with `full` (includeObject=Object), the whole object."""
    columns, printer = PRINTERS.get(kind, ((("Name", S, 0), ("Age", S, 0)), _default))
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": str(resource_version)},
        "columnDefinitions": [
            {
                "name": name,
                "type": kind_,
                "format": "name" if name == "Name" else "",
                "description": "",
                "priority": priority,
            }
            for name, kind_, priority in columns
        ],
        "rows": [
            {
                "cells": printer(obj),
                "object": obj
                if full
                else {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj["metadata"],
                },
            }
            for obj in items
        ],
    }
