"""Kubernetes NetworkPolicy semantics, for asking the chart's policies who may talk to whom.

A connection is allowed when the policies selecting its source allow it out (or none selects
the source for Egress) and those selecting its destination let it in (likewise for Ingress).
The one home of these rules: the chart's tests ask them, and local mode's firewall
(slonk.local.firewall) is derived from them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

NAMESPACE_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Endpoint:
    """A pod (namespace set) or an address outside the cluster (namespace None)."""

    ip: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)  # named container ports


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        if not {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]:
            return False
    return True


def peer_matches(peer: Mapping[str, Any], endpoint: Endpoint, namespace: str) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        ip = ipaddress.ip_address(endpoint.ip)

        def inside(cidr: str) -> bool:
            net = ipaddress.ip_network(cidr, strict=False)
            return ip.version == net.version and ip in net

        return inside(block["cidr"]) and not any(inside(c) for c in block.get("except", []))
    if endpoint.namespace is None:
        return False
    if "namespaceSelector" in peer:
        ns_labels = {NAMESPACE_LABEL: endpoint.namespace}
        if not selects(peer["namespaceSelector"], ns_labels):
            return False
    elif endpoint.namespace != namespace:
        return False
    return "podSelector" not in peer or selects(peer["podSelector"], endpoint.labels)


def port_matches(entry: Mapping[str, Any], port: int, protocol: str, target: Endpoint) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    if "port" not in entry:
        return True
    wanted = entry["port"]
    if isinstance(wanted, str):
        return target.ports.get(wanted) == port
    return wanted <= port <= entry.get("endPort", wanted)


def selecting(
    policies: Iterable[Mapping[str, Any]], subject: Endpoint, direction: str, namespace: str
) -> list[Mapping[str, Any]]:
    """The policies that select `subject` for `direction` (Ingress or Egress): none, and it
    is open that way."""
    if subject.namespace != namespace:
        return []  # the chart's policies only select pods of its own namespace
    return [
        p
        for p in policies
        if direction in p["spec"].get("policyTypes", ["Ingress"])
        and selects(p["spec"]["podSelector"], subject.labels)
    ]


def rules(policy: Mapping[str, Any], direction: str) -> list[tuple[list[Any], list[Any]]]:
    """The policy's rules for `direction`, each as (peers, ports); empty: any."""
    peers_key, rules_key = ("from", "ingress") if direction == "Ingress" else ("to", "egress")
    return [
        (rule.get(peers_key) or [], rule.get("ports") or [])
        for rule in policy["spec"].get(rules_key) or []
    ]


def side_allows(
    policies: Iterable[Mapping[str, Any]],
    subject: Endpoint,
    peer: Endpoint,
    port: int,
    protocol: str,
    direction: str,
    namespace: str,
) -> bool:
    """Whether `subject`'s policies let `peer` in (Ingress) or out to `peer` (Egress)."""
    relevant = selecting(policies, subject, direction, namespace)
    if not relevant:
        return True
    target = subject if direction == "Ingress" else peer
    for policy in relevant:
        for peers, ports in rules(policy, direction):
            if peers and not any(peer_matches(p, peer, namespace) for p in peers):
                continue
            if ports and not any(port_matches(e, port, protocol, target) for e in ports):
                continue
            return True
    return False


def allowed(
    policies: Iterable[Mapping[str, Any]],
    source: Endpoint,
    destination: Endpoint,
    port: int,
    protocol: str = "TCP",
    namespace: str = "hpc",
) -> bool:
    policies = list(policies)
    return side_allows(
        policies, source, destination, port, protocol, "Egress", namespace
    ) and side_allows(policies, destination, source, port, protocol, "Ingress", namespace)
