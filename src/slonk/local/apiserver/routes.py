"""The API's URL layout: a resource URL as the Target a verb acts on, a discovery URL as its
document. Names must be DNS subdomains, so that no name reaches a file path or the store as
anything else."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from slonk.local.apiserver import events, resources
from slonk.local.apiserver.resources import Resource
from slonk.local.apiserver.status import ApiError

NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
Object = dict[str, Any]


@dataclass(frozen=True)
class Target:
    resource: Resource
    namespace: str
    name: str
    subresource: str

    @property
    def key(self) -> str:
        if events.served_as_v1(self.resource):
            return events.CORE_KEY
        return f"{self.resource.group}/{self.resource.name}"


def check_name(name: str) -> str:
    if not (len(name) <= 253 and NAME.fullmatch(name)):
        raise ApiError(400, f"invalid resource name {name!a}: a DNS subdomain is expected")
    return name


def route(path: str) -> Target | Object | None:
    """A resource URL as its target, a discovery URL as its document, None if unknown."""
    parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
    if parts[:1] == ["api"]:
        if len(parts) == 1:
            return resources.api_versions("")
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"]:
        if len(parts) == 1:
            return resources.api_group_list()
        if len(parts) == 2:
            return resources.api_group(parts[1])
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return resources.resource_list(group, version)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = check_name(rest[1]), rest[2:]
    resource = resources.find(group, version, rest[0])
    if resource is None or len(rest) > 3 or (namespace and not resource.namespaced):
        return None
    if resource.namespaced and not namespace and len(rest) > 1:
        return None  # a namespaced object is read in its namespace; all of them only listed
    name = check_name(rest[1]) if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if sub and resources.subresource(resource, sub) is None:
        return None
    return Target(resource, namespace, name, sub)
