"""Events kept once and served through both of the API server's Event APIs: core v1 (slonk's
own Events; `kubectl get events` and `kubectl events` read these) and events.k8s.io/v1 (newer
clients).
The store holds core v1's form; events.k8s.io/v1 reads and writes it through Kubernetes'
own field conversion. A field neither form has is refused, never dropped."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from slonk.local.apiserver.resources import Resource
from slonk.local.apiserver.status import ApiError, invalid
from slonk.local.apiserver.store import Object

GROUP = "events.k8s.io"
CORE_KEY = "/events"  # where both APIs' Events are stored: the core group's
# events.k8s.io/v1's fields and core v1's (k8s.io/kubernetes pkg/apis/events/v1 conversion).
AS_CORE = {
    "regarding": "involvedObject",
    "related": "related",
    "note": "message",
    "reason": "reason",
    "type": "type",
    "action": "action",
    "reportingController": "reportingComponent",
    "reportingInstance": "reportingInstance",
    "eventTime": "eventTime",
    "series": "series",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
}
AS_EVENTS_V1 = {core: new for new, core in AS_CORE.items()}
_KEPT = ("apiVersion", "kind", "metadata")


def served_as_v1(resource: Resource) -> bool:
    return (resource.group, resource.kind) == (GROUP, "Event")


def to_core(event: Object) -> Object:
    """An events.k8s.io/v1 Event as the store keeps it."""
    unknown = sorted(set(event) - set(AS_CORE) - set(_KEPT))
    if unknown:
        raise ApiError(400, f"events.k8s.io/v1 Event: unknown field {unknown[0]!a}")
    core: dict[str, Any] = {k: event[k] for k in _KEPT if k in event}
    core.update({AS_CORE[k]: v for k, v in event.items() if k in AS_CORE})
    return {**core, "apiVersion": "v1", "kind": "Event"}


def to_events_v1(event: Object) -> Object:
    """A stored Event's fields as events.k8s.io/v1 names them (what it has no field for is
    not shown; the caller sets apiVersion and kind)."""
    shown: dict[str, Any] = {"metadata": event["metadata"]} if "metadata" in event else {}
    shown.update({AS_EVENTS_V1[k]: v for k, v in event.items() if k in AS_EVENTS_V1})
    return shown


# Times as the API server writes them back, whatever form a client sent (the Python client
# sends `+00:00`, Go's parsers want `Z`): metav1.MicroTime and metav1.Time.
MICRO_TIMES = ("eventTime",)
TIMES = ("firstTimestamp", "lastTimestamp")


def _time(event: Object, field: str, text: Any, micro: bool) -> str:
    try:
        when = datetime.fromisoformat(str(text))
    except ValueError:
        raise invalid(
            "Event", event["metadata"].get("name", ""), field, f"not a time: {text!r}"
        ) from None
    when = when.replace(tzinfo=when.tzinfo or UTC).astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def with_canonical_times(event: Object) -> Object:
    """A core v1 Event with its times written as the API server writes them."""
    out = dict(event)
    for field in (*MICRO_TIMES, *TIMES):
        if out.get(field):
            out[field] = _time(event, field, out[field], field in MICRO_TIMES)
    series = out.get("series")
    if isinstance(series, dict) and series.get("lastObservedTime"):
        out["series"] = {
            **series,
            "lastObservedTime": _time(event, "series.lastObservedTime",
                                      series["lastObservedTime"], True),
        }  # fmt: skip
    return out
