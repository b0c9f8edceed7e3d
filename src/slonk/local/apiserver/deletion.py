"""DeleteOptions, from a DELETE's body, its query or an Eviction's deleteOptions, and which of
them the fake honours: preconditions; it deletes in the background (what kubectl asks by
default), runs no dry run, and stops a pod with its own terminationGracePeriodSeconds; any
other is refused, never ignored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slonk.local.apiserver.selectors import flag
from slonk.local.apiserver.status import ApiError
from slonk.local.apiserver.store import Object


def from_query(query: Mapping[str, str]) -> dict[str, Any]:
    """The options a DELETE may give in its query rather than its body."""
    options: dict[str, Any] = {}
    if "propagationPolicy" in query:
        options["propagationPolicy"] = query["propagationPolicy"]
    if "orphanDependents" in query:
        options["orphanDependents"] = flag(query["orphanDependents"])
    if "gracePeriodSeconds" in query:
        try:
            options["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
        except ValueError:
            raise ApiError(400, "gracePeriodSeconds must be an integer") from None
    return options


def check(body: Any, current: Object, kind: str) -> None:
    """Preconditions that do not hold fail (409), as Kubernetes'; DeleteOptions the fake would
    not honour are refused, never ignored: it deletes in the background (what kubectl asks by
    default), runs no dry run, and stops a pod with its own terminationGracePeriodSeconds."""
    if body is not None and not isinstance(body, dict):
        raise ApiError(400, "DeleteOptions must be an object")
    options = body or {}
    wanted = options.get("preconditions") or {}
    if not isinstance(wanted, dict):
        raise ApiError(400, "DeleteOptions.preconditions must be an object")
    for field in ("uid", "resourceVersion"):
        if wanted.get(field) and wanted[field] != current["metadata"].get(field):
            raise ApiError(
                409,
                f"Precondition failed: {field} in precondition: {wanted[field]}, "
                f"{field} in object meta: {current['metadata'].get(field)}",
            )
    policy = options.get("propagationPolicy")
    if policy not in (None, "Background") or options.get("orphanDependents"):
        asked = policy or "Orphan (orphanDependents)"
        raise ApiError(400, f"the fake API server deletes in the Background only, not {asked}")
    if options.get("dryRun"):
        raise ApiError(400, "the fake API server does no dry runs: it would have deleted")
    grace = options.get("gracePeriodSeconds")
    own = current.get("spec", {}).get("terminationGracePeriodSeconds", 30)
    if kind == "Pod" and grace is not None and grace != own:
        raise ApiError(
            400,
            f"the fake API server stops a pod with its spec's terminationGracePeriodSeconds "
            f"({own} s), not gracePeriodSeconds {grace}",
        )
