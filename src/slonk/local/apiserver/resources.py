"""The kinds the fake serves, and the discovery documents kubectl reads before anything else.

kubectl asks /api and /apis for aggregated discovery first; answered with the legacy
documents (plain application/json) it falls back to /api/v1 and /apis/<group>/<version>,
as it does against any server without aggregation."""

from __future__ import annotations

from dataclasses import dataclass

ALL_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")
READ_VERBS = ("get", "list", "watch")
VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-slonk-fake",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23",
    "compiler": "gc",
    "platform": "linux/amd64",
}


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    name: str  # plural, as in the URL
    kind: str
    namespaced: bool
    verbs: tuple[str, ...] = ALL_VERBS
    short_names: tuple[str, ...] = ()
    singular: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


@dataclass(frozen=True)
class Subresource:
    parent_group: str
    parent: str
    name: str
    group: str  # of the kind it reads and writes
    version: str
    kind: str
    verbs: tuple[str, ...]


RESOURCES = (
    Resource("", "v1", "namespaces", "Namespace", False, READ_VERBS, ("ns",)),
    Resource("", "v1", "nodes", "Node", False, ALL_VERBS, ("no",)),
    Resource("", "v1", "pods", "Pod", True, ALL_VERBS, ("po",)),
    Resource("", "v1", "events", "Event", True, ALL_VERBS, ("ev",)),
    Resource("apps", "v1", "statefulsets", "StatefulSet", True, ALL_VERBS, ("sts",)),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", True),
    Resource("events.k8s.io", "v1", "events", "Event", True, ALL_VERBS, ("ev",)),
    Resource(
        "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, READ_VERBS, ("pdb",)
    ),
)
SUBRESOURCES = (
    Subresource(
        "apps", "statefulsets", "scale", "autoscaling", "v1", "Scale", ("get", "patch", "update")
    ),
    Subresource(
        "apps", "statefulsets", "status", "apps", "v1", "StatefulSet", ("get", "patch", "update")
    ),
    Subresource("", "pods", "status", "", "v1", "Pod", ("get", "patch", "update")),
    Subresource("", "pods", "eviction", "policy", "v1", "Eviction", ("create",)),
    Subresource("", "nodes", "status", "", "v1", "Node", ("get", "patch", "update")),
)


def find(group: str, version: str, name: str) -> Resource | None:
    return next(
        (r for r in RESOURCES if (r.group, r.version, r.name) == (group, version, name)), None
    )


def subresource(parent: Resource, name: str) -> Subresource | None:
    wanted = (parent.group, parent.name, name)
    return next((s for s in SUBRESOURCES if (s.parent_group, s.parent, s.name) == wanted), None)


def groups() -> dict[str, list[str]]:
    """{group: its versions}, the core group as ""."""
    found: dict[str, list[str]] = {}
    for r in RESOURCES:
        if r.version not in found.setdefault(r.group, []):
            found[r.group].append(r.version)
    return found


def api_versions(address: str) -> dict[str, object]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    }


def api_group_list() -> dict[str, object]:
    entries = []
    for group, versions in groups().items():
        if not group:
            continue
        listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        entries.append({"name": group, "versions": listed, "preferredVersion": listed[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": entries}


def api_group(group: str) -> dict[str, object] | None:
    versions = groups().get(group)
    if not group or not versions:
        return None
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": listed,
        "preferredVersion": listed[0],
    }


def resource_list(group: str, version: str) -> dict[str, object] | None:
    served = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
    if not served:
        return None
    entries: list[dict[str, object]] = []
    for r in served:
        entries.append(
            {
                "name": r.name,
                "singularName": r.singular or r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(r.verbs),
                **({"shortNames": list(r.short_names)} if r.short_names else {}),
            }
        )
        for s in SUBRESOURCES:
            if (s.parent_group, s.parent) == (r.group, r.name):
                entries.append(
                    {
                        "name": f"{r.name}/{s.name}",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "group": s.group,
                        "version": s.version,
                        "kind": s.kind,
                        "verbs": list(s.verbs),
                    }
                )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": entries,
    }
