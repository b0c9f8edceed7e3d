"""Local mode's firewall is the chart's NetworkPolicies, not a second copy of them: for every
pair of endpoints (each pod, and the host on the bridge, which is outside the cluster) and a
sample of ports, the rules derived for a pod let through exactly what slonk.kube.netpol says its
policies let through."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
import yaml

from slonk.kube import chart, netpol
from slonk.local import firewall
from slonk.local.manifests import Plan, plan
from slonk.local.network import pod_addresses
from slonk.local.release import LOCAL_VALUES, NAMESPACE, RELEASE

DATABASE, SLURMDBD, CONTROLLER = "slonk-mariadb-0", "slonk-slurmdbd-0", "slonk-controller-0"
LOGIN, WORKER = "slonk-login-0", "slonk-cpu-0"
# Every daemon's port, the ends of the pinned SrunPortRange, and some no one serves; each
# with its neighbours (a range's edges).
PORTS = (22, 53, 389, 3306, 6443, 6817, 6818, 6819, 9341, 60001, 63000, 1234, 65534)
# Outside the cluster: the metadata servers workers' egress excepts, a link-local DNS cache,
# the Internet.
OUTSIDE = [
    netpol.Endpoint(ip)
    for ip in ("169.254.169.254", "100.100.100.200", "169.254.20.10", "192.0.2.7")
]


@pytest.fixture(scope="module")
def objects() -> Plan:
    """What `slonk local up` renders with no values of the user's."""
    rendered = chart.render(
        chart.default_chart(), chart.user_values([LOCAL_VALUES]), RELEASE, NAMESPACE
    )
    return plan([d for d in yaml.safe_load_all(chart.manifest(rendered)) if d], NAMESPACE)


@pytest.fixture(scope="module")
def pods(objects: Plan) -> dict[str, netpol.Endpoint]:
    return firewall.endpoints(objects, pod_addresses([p.name for p in objects.pods], {}))


@pytest.fixture(scope="module")
def lets(objects, pods):
    """lets(subject pod, peer, port, protocol, direction): whether the rules derived for the
    pod let that flow through."""
    everyone = firewall.Peers([*pods.values(), firewall.HOST], NAMESPACE)

    def check(subject: str, peer: netpol.Endpoint, port: int, protocol: str, direction: str):
        policies = objects.network_policies
        found = firewall.allows(policies, pods[subject], everyone, direction, 4)
        return found is None or any(a.admits(peer.ip, port, protocol) for a in found)

    return check


@pytest.mark.parametrize("direction", ["Ingress", "Egress"])
def test_the_rules_let_through_what_the_policies_do(objects, pods, lets, direction):
    assert objects.network_policies, "the default rendering has NetworkPolicies"
    ports = {*PORTS, *(n for p in pods.values() for n in p.ports.values())}
    differ = [
        (subject, peer.ip, port, protocol)
        for subject in pods
        for peer in [*pods.values(), firewall.HOST, *OUTSIDE]
        for port in {p + step for p in ports for step in (-1, 0, 1)}
        for protocol in ("TCP", "UDP")
        if lets(subject, peer, port, protocol, direction)
        != netpol.side_allows(
            objects.network_policies, pods[subject], peer, port, protocol, direction, NAMESPACE
        )
    ]
    assert not differ


def test_the_database_takes_slurmdbd_alone(pods, lets):
    let_in = {
        name: lets(DATABASE, peer, 3306, "TCP", "Ingress")
        for name, peer in [*pods.items(), ("host", firewall.HOST)]
    }
    assert {name for name, let in let_in.items() if let} == {SLURMDBD}


def test_slurmctld_takes_the_release_pods_but_not_the_outside(pods, lets):
    def in_(peer: netpol.Endpoint) -> bool:
        return lets(CONTROLLER, peer, 6817, "TCP", "Ingress")

    assert all(in_(pods[name]) for name in (CONTROLLER, SLURMDBD, LOGIN, WORKER))
    assert not in_(pods[DATABASE])
    assert not in_(firewall.HOST)


def test_anyone_reaches_the_login_pods_sshd_and_the_metrics(pods, lets):
    for peer in [*pods.values(), firewall.HOST]:
        assert lets(LOGIN, peer, 22, "TCP", "Ingress")
        assert lets(WORKER, peer, 9341, "TCP", "Ingress")
    # The login pod's egress: not the database, not the host's side (the fake API server).
    assert not lets(LOGIN, pods[DATABASE], 3306, "TCP", "Egress")
    assert not lets(LOGIN, firewall.HOST, 6443, "TCP", "Egress")


def test_a_pod_no_policy_selects_is_open():
    lone = netpol.Endpoint("10.73.0.10", NAMESPACE, {"app": "other"})
    nobody = firewall.Peers([], NAMESPACE)
    assert firewall.allows([], lone, nobody, "Ingress", 4) is None
    tables = firewall.ruleset([], lone, nobody, 4)
    assert "-A INPUT" not in tables and "-A OUTPUT" not in tables


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_the_kernel_takes_every_pods_tables(objects):
    """iptables-restore (and ip6tables-restore) load each derived table as written."""
    netns = f"slonk-fwtest-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        tables = firewall.rulesets(objects, pod_addresses([p.name for p in objects.pods], {}))
        for pod, (v4, v6) in tables.items():
            for command, table in (("iptables-restore", v4), ("ip6tables-restore", v6)):
                loaded = subprocess.run(
                    ["ip", "netns", "exec", netns, command],
                    input=table, capture_output=True, text=True, check=False,
                )  # fmt: skip
                assert loaded.returncode == 0, f"{pod} {command}: {loaded.stderr}"
    finally:
        subprocess.run(["ip", "netns", "delete", netns], check=True)
