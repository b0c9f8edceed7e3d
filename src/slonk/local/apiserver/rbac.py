"""The chart's RBAC as an authorizer: a request is allowed only if a rule bound to its
ServiceAccount grants its verb on its apiGroup, resource (with subresource, e.g.
`statefulsets/scale`) and, where the rule names some, resourceNames, in the namespace its
binding holds in. The admin (the operator's kubeconfig) may do everything."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slonk.local.apiserver.status import ApiError

ADMIN = "admin"  # the identity of `slonk local kubeconfig`'s token


@dataclass(frozen=True)
class Request:
    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""  # "" for cluster-scoped resources and all-namespace lists
    name: str = ""

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def _grants(rule: Mapping[str, Any], request: Request) -> bool:
    if rule.get("namespace") not in (None, request.namespace or None):
        return False
    groups, verbs = rule.get("apiGroups") or [], rule.get("verbs") or []
    if "*" not in groups and request.group not in groups:
        return False
    if "*" not in verbs and request.verb not in verbs:
        return False
    wanted, main = request.full_resource, request.resource
    resources = rule.get("resources") or []
    matched = (
        "*" in resources
        or wanted in resources
        or (request.subresource and f"{main}/*" in resources)
        or (request.subresource and f"*/{request.subresource}" in resources)
    )
    names = rule.get("resourceNames") or []
    return bool(matched) and (not names or request.name in names)


class Authorizer:
    def __init__(self, rules: Mapping[str, Sequence[Mapping[str, Any]]], namespace: str) -> None:
        self.rules, self.namespace = rules, namespace

    def check(self, account: str, request: Request) -> None:
        """403 naming the account, verb and resource unless a rule grants the request."""
        if account == ADMIN:
            return
        if any(_grants(rule, request) for rule in self.rules.get(account, ())):
            return
        user = f"system:serviceaccount:{self.namespace}:{account}"
        where = (
            f' in the namespace "{request.namespace}"'
            if request.namespace
            else " at the cluster scope"
        )
        named = f' "{request.name}"' if request.name else ""
        raise ApiError(
            403,
            f"{request.full_resource}{named} is forbidden: "
            f'User "{user}" cannot {request.verb} resource "{request.full_resource}" in API '
            f'group "{request.group}"{where} (not granted by the chart\'s RBAC)',
            kind=request.resource,
            name=request.name,
        )
