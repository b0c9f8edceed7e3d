"""The chart's NetworkPolicies, enforced in local mode as a CNI would enforce them: iptables in
each pod's network namespace, derived from the rendered policies (slonk.kube.netpol's semantics)
and the pods' labels, addresses and named ports. Never a second copy of the rules: what the
chart lets through, and only that, gets through.

A pod selected for Ingress accepts, on top of loopback and connections it already has, only
what its policies' rules list; one selected for Egress likewise sends only that. The host (its
address on the bridge: `slonk local ssh`, Prometheus, the fake API server) is outside the
cluster: only a rule with no peers or an ipBlock lets it in. Selectors resolve to the pods'
addresses now, so every pod's rules are loaded again when the pod set or the policies change.
Refused connections are reset at once rather than dropped, so that nothing waits them out.
"""

from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slonk.kube import netpol
from slonk.kube.netpol import Endpoint
from slonk.local.manifests import Plan
from slonk.local.network import BRIDGE_ADDRESS, Network

HOST = Endpoint(ip=BRIDGE_ADDRESS)  # outside the cluster: no namespace, no labels
# direction: (iptables chain, its address flag, its interface flag)
CHAINS = {"Ingress": ("INPUT", "-s", "-i"), "Egress": ("OUTPUT", "-d", "-o")}
ANY = {4: "0.0.0.0/0", 6: "::/0"}
_network = functools.lru_cache(maxsize=None)(ipaddress.ip_network)


@dataclass(frozen=True)
class Allow:
    """One accepted flow: peers in `cidr` but not in `excepts`; `protocol` None for any, and
    then any port; ports (first, last), None for any."""

    cidr: str
    excepts: tuple[str, ...] = ()
    protocol: str | None = None
    ports: tuple[int, int] | None = None

    def admits(self, peer_ip: str, port: int, protocol: str) -> bool:
        ip = ipaddress.ip_address(peer_ip)

        def inside(cidr: str) -> bool:
            net = _network(cidr)
            return ip.version == net.version and ip in net

        return (
            inside(self.cidr)
            and not any(inside(c) for c in self.excepts)
            and self.protocol in (None, protocol)
            and (self.ports is None or self.ports[0] <= port <= self.ports[1])
        )


def endpoints(plan: Plan, addresses: Mapping[str, str]) -> dict[str, Endpoint]:
    """Every pod of the plan as netpol sees it: namespace, labels, address, named ports (of
    all its containers, as Kubernetes resolves a named port)."""
    ports: dict[str, dict[str, int]] = {}
    for statefulset in plan.statefulsets:
        containers = statefulset["spec"]["template"]["spec"]["containers"]
        named = {
            p["name"]: int(p["containerPort"])
            for c in containers
            for p in c.get("ports") or []
            if "name" in p
        }
        for ordinal in range(int(statefulset["spec"]["replicas"])):
            ports[f"{statefulset['metadata']['name']}-{ordinal}"] = named
    return {
        pod.name: Endpoint(addresses[pod.name], plan.namespace, pod.labels, ports.get(pod.name, {}))
        for pod in plan.pods
    }


@dataclass
class Peers:
    """What a selector peer can match (every pod, and the host), and what each one matched:
    resolved once, not once a pod (256 workers ask the same selectors)."""

    endpoints: Sequence[Endpoint]
    namespace: str
    _matched: dict[tuple[str, int], tuple[list[Endpoint], list[str]]] = field(default_factory=dict)

    def matching(self, peer: Mapping[str, Any], family: int) -> tuple[list[Endpoint], list[str]]:
        """The endpoints of `family` (4 or 6) the peer matches, and their addresses as the
        fewest networks."""
        key = (json.dumps(peer, sort_keys=True), family)
        if key not in self._matched:
            found = [
                e
                for e in self.endpoints
                if (":" in e.ip) == (family == 6) and netpol.peer_matches(peer, e, self.namespace)
            ]
            self._matched[key] = (found, _collapse([e.ip for e in found]))
        return self._matched[key]


def _peers(
    rule_peers: Sequence[Mapping[str, Any]],
    subject: Endpoint,
    peers: Peers,
    direction: str,
    family: int,
    named: bool,
) -> Iterator[tuple[str, tuple[str, ...], Endpoint]]:
    """(cidr, excepts, the endpoint whose named ports count) for each peer of one rule. A
    selector's pods are their addresses; an egress rule's named port (`named`: the rule has
    one) is each destination's, unknown for an ipBlock (then it matches nothing)."""
    outside = Endpoint(ANY[family])
    if not rule_peers:
        yield ANY[family], (), subject if direction == "Ingress" else outside
        return
    for peer in rule_peers:
        if "ipBlock" in peer:
            block = peer["ipBlock"]
            if ipaddress.ip_network(block["cidr"], strict=False).version == family:
                excepts = tuple(
                    str(ipaddress.ip_network(c, strict=False)) for c in block.get("except", [])
                )
                cidr = str(ipaddress.ip_network(block["cidr"], strict=False))
                yield cidr, excepts, subject if direction == "Ingress" else outside
            continue
        matched, networks = peers.matching(peer, family)
        if direction == "Ingress" or not named:
            yield from ((cidr, (), subject) for cidr in networks)
        else:
            yield from ((f"{e.ip}/{32 if family == 4 else 128}", (), e) for e in matched)


def _collapse(ips: Sequence[str]) -> list[str]:
    """Addresses (of one family) as the fewest networks: consecutive pods (a StatefulSet's)
    make a few rules, not one each."""
    v4 = ipaddress.collapse_addresses(ipaddress.IPv4Network(ip) for ip in ips if "." in ip)
    v6 = ipaddress.collapse_addresses(ipaddress.IPv6Network(ip) for ip in ips if ":" in ip)
    return [str(net) for net in (*v4, *v6)]


def _ports(
    entries: Sequence[Mapping[str, Any]], target: Endpoint
) -> Iterator[tuple[str | None, tuple[int, int] | None]]:
    """(protocol, port range) for each port entry of one rule; a named port `target` lacks
    matches nothing, as in Kubernetes."""
    if not entries:
        yield None, None
        return
    for entry in entries:
        protocol = entry.get("protocol", "TCP")
        if "port" not in entry:
            yield protocol, None
        elif isinstance(entry["port"], str):
            if (number := target.ports.get(entry["port"])) is not None:
                yield protocol, (number, number)
        else:
            yield protocol, (int(entry["port"]), int(entry.get("endPort", entry["port"])))


def allows(
    policies: Iterable[Mapping[str, Any]],
    subject: Endpoint,
    peers: Peers,
    direction: str,
    family: int,
) -> list[Allow] | None:
    """What `subject` lets through in `direction` for one address family: None when no policy
    selects it that way (everything)."""
    relevant = netpol.selecting(policies, subject, direction, peers.namespace)
    if not relevant:
        return None
    found: list[Allow] = []
    for policy in relevant:
        for rule_peers, entries in netpol.rules(policy, direction):
            named = any(isinstance(e.get("port"), str) for e in entries)
            for cidr, excepts, target in _peers(
                rule_peers, subject, peers, direction, family, named
            ):
                found += [Allow(cidr, excepts, p, r) for p, r in _ports(entries, target)]
    return list(dict.fromkeys(found))


def _iptables_lines(chain: str, address: str, number: int, allow: Allow) -> list[str]:
    """iptables-restore rules for one Allow: through a chain of its own (declared by
    ruleset) when it has exceptions, which return; the rest is accepted."""
    match = f"{address} {allow.cidr}"
    if allow.protocol is not None:
        match += f" -p {allow.protocol.lower()}"
        if allow.ports is not None:
            first, last = allow.ports
            span = f"{first}:{last}" if last != first else str(first)
            match += f" -m {allow.protocol.lower()} --dport {span}"
    if not allow.excepts:
        return [f"-A {chain} {match} -j ACCEPT"]
    own = f"{chain}-block{number}"
    return [
        *(f"-A {own} {address} {c} -j RETURN" for c in allow.excepts),
        f"-A {own} -j ACCEPT",
        f"-A {chain} {match} -j {own}",
    ]


def ruleset(
    policies: Sequence[Mapping[str, Any]], subject: Endpoint, peers: Peers, family: int
) -> str:
    """The pod's filter table for one family, as iptables-restore (ip6tables-restore) reads it."""
    chains = [":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
    rules: list[str] = []
    unreachable = "icmp-port-unreachable" if family == 4 else "icmp6-port-unreachable"
    for direction, (chain, address, interface) in CHAINS.items():
        found = allows(policies, subject, peers, direction, family)
        if found is None:
            continue
        rules += [
            f"-A {chain} {interface} lo -j ACCEPT",
            f"-A {chain} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        ]
        for number, allow in enumerate(found):
            chains += [f":{chain}-block{number} - [0:0]"] if allow.excepts else []
            rules += _iptables_lines(chain, address, number, allow)
        rules += [
            f"-A {chain} -p tcp -j REJECT --reject-with tcp-reset",
            f"-A {chain} -j REJECT --reject-with {unreachable}",
        ]
    return "\n".join(["*filter", *chains, *rules, "COMMIT", ""])


def rulesets(plan: Plan, addresses: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """{pod: (its IPv4 table, its IPv6 table)} for every pod of the plan, at `addresses`."""
    pods = endpoints(plan, addresses)
    peers = Peers([*pods.values(), HOST], plan.namespace)

    def table(pod: Endpoint, family: int) -> str:
        return ruleset(plan.network_policies, pod, peers, family)

    return {name: (table(pod, 4), table(pod, 6)) for name, pod in pods.items()}


def enforce(network: Network, plan: Plan, addresses: Mapping[str, str]) -> None:
    """Load every pod's rules into its namespace (replacing what it had)."""
    network.load_firewall(rulesets(plan, addresses))
