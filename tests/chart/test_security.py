"""The chart's network policies (who may talk to whom) and its pods' security contexts."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from slonk.config.render import render
from slonk.config.spec import parse_spec
from slonk.kube import chart

from .netpol import Endpoint, allowed
from .test_validity import _template_error

OUTSIDE = Endpoint("203.0.113.7")
STRANGER = Endpoint("10.244.9.9", "hpc", {"app.kubernetes.io/name": "something-else"})
OTHER_NAMESPACE = Endpoint("10.244.8.8", "web", {"app.kubernetes.io/name": "slonk"})
DNS = Endpoint("10.244.0.53", "kube-system", {"k8s-app": "kube-dns"})
# The clouds' instance metadata: the machine's own credentials, to any process that asks.
METADATA = Endpoint("169.254.169.254")
METADATA_V6 = Endpoint("fd00:ec2::254")
NODE_LOCAL_DNS = Endpoint("169.254.20.10")


def _docs(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    rendered = chart.render(chart.default_chart(), values or {}, namespace="hpc")
    return [d for d in yaml.safe_load_all(chart.manifest(rendered)) if d]


def _get(docs, kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _policies(docs) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "NetworkPolicy"]


def _pods(docs) -> dict[str, Endpoint]:
    """One endpoint per StatefulSet, as its pods look to the network: labels and named ports."""
    pods = {}
    for i, sts in enumerate(d for d in docs if d["kind"] == "StatefulSet"):
        template = sts["spec"]["template"]
        ports = {
            p["name"]: p["containerPort"]
            for c in template["spec"]["containers"]
            for p in c.get("ports", [])
        }
        name = sts["metadata"]["name"].removeprefix("slonk-")
        pods[name] = Endpoint(f"10.244.1.{i}", "hpc", template["metadata"]["labels"], ports)
    return pods


def _slurm_conf(docs) -> list[str]:
    spec = yaml.safe_load(_get(docs, "ConfigMap", "slonk-cluster")["data"]["cluster.yaml"])
    return render(parse_spec(spec))["slurm.conf"].splitlines()


def _container(docs, statefulset: str) -> dict[str, Any]:
    return _get(docs, "StatefulSet", statefulset)["spec"]["template"]["spec"]["containers"][0]


@pytest.fixture(scope="module")
def default_docs():
    return _docs()


@pytest.fixture(scope="module")
def dev_docs():
    return _docs({"ldap": {"dev": {"enabled": True}}})


# (source, destination, port, protocol, allowed) in the default rendering.
DEFAULT_FLOWS = [
    # slurmctld: from the release's pods, on its port only.
    ("login", "controller", 6817, "TCP", True),
    ("cpu", "controller", 6817, "TCP", True),
    ("controller", "controller", 6817, "TCP", True),
    ("cpu", "controller", 22, "TCP", False),
    ("outside", "controller", 6817, "TCP", False),
    ("stranger", "controller", 6817, "TCP", False),
    ("other-namespace", "controller", 6817, "TCP", False),
    # slurmd: from the release's pods; any port between workers (jobs' own traffic).
    ("controller", "cpu", 6818, "TCP", True),
    ("login", "cpu", 6818, "TCP", True),
    ("cpu", "cpu", 6818, "TCP", True),
    ("cpu", "cpu", 41000, "TCP", True),
    ("cpu", "cpu", 41000, "UDP", True),
    ("login", "cpu", 41000, "TCP", False),
    ("controller", "cpu", 60001, "TCP", True),
    ("controller", "cpu", 41000, "TCP", False),
    ("outside", "cpu", 6818, "TCP", False),
    ("stranger", "cpu", 6818, "TCP", False),
    # Login pods: ssh from anyone; srun's ports from the controller and workers.
    ("outside", "login", 22, "TCP", True),
    ("stranger", "login", 22, "TCP", True),
    ("outside", "login", 2222, "TCP", False),
    ("controller", "login", 60001, "TCP", True),
    ("cpu", "login", 63000, "TCP", True),
    ("cpu", "login", 63001, "TCP", False),
    ("cpu", "login", 59999, "TCP", False),
    ("outside", "login", 60001, "TCP", False),
    ("stranger", "login", 60001, "TCP", False),
    # Out of the login pods: DNS, slurmctld, slurmd; nothing else.
    ("login", "dns", 53, "UDP", True),
    ("login", "dns", 53, "TCP", True),
    ("login", "outside", 443, "TCP", False),
    ("login", "stranger", 80, "TCP", False),
    ("login", "controller", 22, "TCP", False),
    ("login", "login", 22, "TCP", False),
    # The controller and workers keep their egress (jobs, git, the Kubernetes API), but for
    # the instance metadata, out of users' jobs' reach.
    ("cpu", "outside", 443, "TCP", True),
    ("cpu", "dns", 53, "UDP", True),
    ("cpu", "node-local-dns", 53, "UDP", True),
    ("cpu", "stranger", 8080, "TCP", True),
    ("cpu", "metadata", 80, "TCP", False),
    ("cpu", "metadata-v6", 80, "TCP", False),
    ("controller", "outside", 443, "TCP", True),
]


def _endpoint(docs, name: str) -> Endpoint:
    named = {
        "outside": OUTSIDE,
        "stranger": STRANGER,
        "other-namespace": OTHER_NAMESPACE,
        "dns": DNS,
        "metadata": METADATA,
        "metadata-v6": METADATA_V6,
        "node-local-dns": NODE_LOCAL_DNS,
    }
    return named.get(name) or _pods(docs)[name]


@pytest.mark.parametrize(("source", "destination", "port", "protocol", "expected"), DEFAULT_FLOWS)
def test_who_may_talk_to_whom(default_docs, source, destination, port, protocol, expected):
    src, dst = _endpoint(default_docs, source), _endpoint(default_docs, destination)
    assert allowed(_policies(default_docs), src, dst, port, protocol) is expected


@pytest.mark.parametrize("fixture", ["default_docs", "dev_docs"])
def test_every_pod_is_selected_by_a_policy(request, fixture):
    docs = request.getfixturevalue(fixture)
    for name, pod in _pods(docs).items():
        assert not allowed(_policies(docs), STRANGER, pod, 1234), name


@pytest.mark.parametrize(
    ("source", "destination", "port", "expected"),
    [
        ("login", "ldap", 389, True),
        ("cpu", "ldap", 389, True),
        ("controller", "ldap", 389, True),
        ("stranger", "ldap", 389, False),
        ("outside", "ldap", 389, False),
        ("login", "ldap", 22, False),
        ("ldap", "outside", 443, False),
        ("ldap", "dns", 53, True),
    ],
)
def test_only_the_release_reads_the_development_directory(
    dev_docs, source, destination, port, expected
):
    src, dst = _endpoint(dev_docs, source), _endpoint(dev_docs, destination)
    assert allowed(_policies(dev_docs), src, dst, port) is expected


@pytest.mark.parametrize(
    ("uris", "ldap_to", "flows"),
    [
        (
            ["ldap://ldap1.example.org", "ldap://ldap2.example.org:3389"],
            [],
            {("203.0.113.7", 389): True, ("203.0.113.7", 3389): True, ("203.0.113.7", 636): False},
        ),
        (
            ["ldaps://[2001:db8::1]:1636", "ldaps://ldap.example.org"],
            [],
            {("203.0.113.7", 1636): True, ("203.0.113.7", 636): True, ("203.0.113.7", 389): False},
        ),
        (
            ["ldaps://ldap.example.org"],
            [{"ipBlock": {"cidr": "192.0.2.0/24"}}],
            {("192.0.2.10", 636): True, ("203.0.113.7", 636): False},
        ),
    ],
)
def test_login_pods_reach_the_site_directory_on_its_ports(uris, ldap_to, flows):
    docs = _docs(
        {
            "ldap": {"enabled": True, "uris": uris, "userBase": "ou=p", "groupBase": "ou=g"},
            "networkPolicy": {"login": {"ldapTo": ldap_to}},
        }
    )
    login = _pods(docs)["login"]
    for (address, port), expected in flows.items():
        assert allowed(_policies(docs), login, Endpoint(address), port) is expected, (address, port)


def test_ssh_from_and_extra_rules():
    docs = _docs(
        {
            "networkPolicy": {
                "dnsTo": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                        }
                    }
                ],
                "login": {
                    "sshFrom": [
                        {"ipBlock": {"cidr": "198.51.100.0/24", "except": ["198.51.100.128/25"]}}
                    ],
                    "extraEgress": [
                        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443}]}
                    ],
                },
                "controller": {
                    "extraIngress": [
                        {
                            "from": [
                                {
                                    "namespaceSelector": {
                                        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                                    }
                                }
                            ],
                            "ports": [{"port": 9100}],
                        }
                    ]
                },
            }
        }
    )
    policies, pods = _policies(docs), _pods(docs)
    login, controller = pods["login"], pods["controller"]
    assert allowed(policies, Endpoint("198.51.100.7"), login, 22)
    assert not allowed(policies, Endpoint("198.51.100.200"), login, 22)
    assert not allowed(policies, OUTSIDE, login, 22)
    assert allowed(policies, login, OUTSIDE, 443)
    assert allowed(policies, login, DNS, 53, "UDP")
    assert not allowed(policies, login, OUTSIDE, 53, "UDP")
    scraper = Endpoint("10.244.7.7", "monitoring", {"app": "prometheus"})
    assert allowed(policies, scraper, controller, 9100)
    assert not allowed(policies, scraper, controller, 6817)


def test_policies_follow_the_ports_in_values():
    docs = _docs(
        {
            "slurm": {
                "slurmctldPort": 7817,
                "slurmdPort": 7818,
                "slurmConf": {"SrunPortRange": "40000-40009"},
            }
        }
    )
    policies, pods = _policies(docs), _pods(docs)
    assert allowed(policies, pods["cpu"], pods["controller"], 7817)
    assert not allowed(policies, pods["cpu"], pods["controller"], 6817)
    assert allowed(policies, pods["login"], pods["cpu"], 7818)
    assert allowed(policies, pods["cpu"], pods["login"], 40009)
    assert not allowed(policies, pods["cpu"], pods["login"], 40010)
    assert "SrunPortRange=40000-40009" in _slurm_conf(docs)


def test_srun_ports_pinned_by_default_and_ephemeral_on_request(default_docs):
    assert "SrunPortRange=60001-63000" in _slurm_conf(default_docs)
    docs = _docs({"slurm": {"slurmConf": {"SrunPortRange": None}}})
    assert not [line for line in _slurm_conf(docs) if line.startswith("SrunPortRange")]
    policies, pods = _policies(docs), _pods(docs)
    assert allowed(policies, pods["cpu"], pods["login"], 45123)
    assert allowed(policies, pods["controller"], pods["login"], 45123)
    assert not allowed(policies, OUTSIDE, pods["login"], 45123)


def _sysctls(docs, statefulset: str) -> dict[str, str]:
    context = _get(docs, "StatefulSet", statefulset)["spec"]["template"]["spec"]["securityContext"]
    return {s["name"]: s["value"] for s in context.get("sysctls", [])}


def test_time_wait_is_capped_at_half_the_srun_ports_on_request(default_docs):
    """Off by default: Kubernetes refuses the sysctl unless the kubelets allow it."""
    cap = "net.ipv4.tcp_max_tw_buckets"
    assert cap not in _sysctls(default_docs, "slonk-login")
    docs = _docs({"slurm": {"capTimeWait": True, "slurmConf": {"SrunPortRange": "40000-40009"}}})
    for statefulset in ("slonk-login", "slonk-cpu"):
        assert _sysctls(docs, statefulset) == {
            "net.ipv4.ip_local_reserved_ports": "40000-40009",
            cap: "5",
        }
    assert _sysctls(docs, "slonk-controller") == {}
    own = {"sysctls": [{"name": "net/ipv4/tcp_max_tw_buckets", "value": "64"}]}
    docs = _docs({"slurm": {"capTimeWait": True}, "login": {"podSecurityContext": own}})
    assert _sysctls(docs, "slonk-login")["net/ipv4/tcp_max_tw_buckets"] == "64"
    assert cap not in _sysctls(docs, "slonk-login")
    docs = _docs({"slurm": {"capTimeWait": True, "slurmConf": {"SrunPortRange": None}}})
    assert _sysctls(docs, "slonk-login") == {}


def _notes(values: dict[str, Any]) -> str:
    rendered = chart.render(chart.default_chart(), values, namespace="hpc")
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def test_every_install_without_the_time_wait_cap_is_told_what_it_leaves_open():
    """The hole the cap closes is open by default (the kubelets must allow the sysctl): each
    `helm install` and `upgrade` says so, and stops saying it once the cap is on or srun's
    ports are not pinned."""
    assert "slurm.capTimeWait is off" in _notes({})
    assert "capTimeWait" not in _notes({"slurm": {"capTimeWait": True}})
    assert "capTimeWait" not in _notes({"slurm": {"slurmConf": {"SrunPortRange": None}}})


def test_workers_egress_is_open_without_exceptions():
    docs = _docs({"networkPolicy": {"workers": {"egressExcept": []}}})
    workers = _get(docs, "NetworkPolicy", "slonk-workers")
    assert workers["spec"]["policyTypes"] == ["Ingress"]
    assert allowed(_policies(docs), _pods(docs)["cpu"], METADATA, 80)


def test_policies_can_be_turned_off():
    docs = _docs({"networkPolicy": {"enabled": False}, "ldap": {"dev": {"enabled": True}}})
    assert _policies(docs) == []


def test_no_login_policy_without_login_pods():
    docs = _docs({"login": {"replicas": 0}, "accounting": {"enabled": False}})
    assert [p["metadata"]["name"] for p in _policies(docs)] == ["slonk-controller", "slonk-workers"]


BASE = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]


@pytest.mark.parametrize(
    ("statefulset", "added"),
    [
        ("slonk-controller", BASE),
        ("slonk-login", sorted([*BASE, "AUDIT_WRITE", "NET_BIND_SERVICE", "SYS_CHROOT"])),
    ],
)
def test_controller_and_login_keep_only_what_their_daemons_need(default_docs, statefulset, added):
    context = _container(default_docs, statefulset)["securityContext"]
    assert context == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": added},
        "seccompProfile": {"type": "RuntimeDefault"},
        "readOnlyRootFilesystem": False,
    }
    assert "privileged" not in context and "runAsNonRoot" not in context


def test_development_directory_is_confined(dev_docs):
    context = _container(dev_docs, "slonk-ldap")["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {
        "drop": ["ALL"],
        "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID"],
    }
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}


def test_workers_drop_every_capability_they_do_not_list(default_docs):
    context = _container(default_docs, "slonk-cpu")["securityContext"]
    assert context["capabilities"]["drop"] == ["ALL"]
    # workers.capabilities, then sshd's (workers.ssh is on by default; tests/chart/test_ssh.py;
    # SYS_PTRACE, which ssh needs too, is in the list already)
    sshd = ["AUDIT_WRITE", "NET_BIND_SERVICE", "SYS_CHROOT"]
    own = [*BASE, "SYS_ADMIN", "SYS_NICE", "SYS_PTRACE", "SYS_RESOURCE", "SYSLOG"]
    assert context["capabilities"]["add"] == [*own, *sshd]
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in context


APPARMOR = "container.apparmor.security.beta.kubernetes.io/slurmd"


def _worker_annotations(values: dict) -> dict:
    worker = _get(_docs(values), "StatefulSet", "slonk-cpu")["spec"]["template"]["metadata"]
    return worker.get("annotations") or {}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        # With confinement (the default), init remounts the cgroup tree: a profile that lets it.
        ({}, "unconfined"),
        ({"workers": {"appArmorProfile": {"type": "RuntimeDefault"}}}, "runtime/default"),
        (
            {"workers": {"appArmorProfile": {"type": "Localhost", "localhostProfile": "slurmd"}}},
            "localhost/slurmd",
        ),
        ({"workers": {"appArmorProfile": None}}, None),  # the runtime's
        # Without confinement, slurmstepd still mounts each job's own /tmp and /dev/shm.
        ({"slurm": {"confinement": "none"}}, "unconfined"),
        # Neither: nothing to mount.
        ({"slurm": {"confinement": "none", "slurmConf": {"JobContainerType": None}}}, None),
        ({"slurm": {"confinement": "none", "slurmConf": {"jobcontainertype": None}}}, None),
        ({"workers": {"privileged": True}}, None),  # privileged containers run unconfined
    ],
)
def test_workers_apparmor_profile_lets_them_mount(values, expected):
    annotations = _worker_annotations(values)
    assert annotations.get(APPARMOR) == expected


def test_a_pools_own_annotations_stay_beside_the_profile():
    values = {"nodepools": {"cpu": {"podAnnotations": {"site/owner": "hpc"}}}}
    assert _worker_annotations(values) == {"site/owner": "hpc", APPARMOR: "unconfined"}


def test_security_contexts_are_values():
    docs = _docs(
        {
            "login": {
                "securityContext": {"seccompProfile": {"type": "Unconfined"}},
                "priorityClassName": "interactive",
            },
            "workers": {"capabilities": [*BASE, "SYS_NICE"], "priorityClassName": "batch"},
        }
    )
    login = _get(docs, "StatefulSet", "slonk-login")["spec"]["template"]["spec"]
    assert login["containers"][0]["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert login["containers"][0]["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert login["priorityClassName"] == "interactive"
    worker = _get(docs, "StatefulSet", "slonk-cpu")["spec"]["template"]["spec"]
    assert "SYS_NICE" in worker["containers"][0]["securityContext"]["capabilities"]["add"]
    assert worker["priorityClassName"] == "batch"


def test_load_balancer_source_ranges_only_on_a_load_balancer():
    ranges = ["10.0.0.0/8", "2001:db8::/32"]
    docs = _docs(
        {"login": {"service": {"type": "LoadBalancer", "loadBalancerSourceRanges": ranges}}}
    )
    assert _get(docs, "Service", "slonk-login")["spec"]["loadBalancerSourceRanges"] == ranges
    error = _template_error(
        "--set",
        "login.service.type=NodePort",
        "--set",
        "login.service.loadBalancerSourceRanges={10.0.0.0/8}",
    )
    assert "login.service.loadBalancerSourceRanges: only a LoadBalancer enforces them" in error


GOOD_CIDRS = [
    "0.0.0.0/0",
    "10.0.0.0/8",
    "192.168.1.1/32",
    "255.255.255.255/32",
    "::/0",
    "2001:db8::/32",
    "fe80::1/128",
    "2001:db8:0:0:0:0:0:1/64",
    "::1/128",
    "1::/16",
]
BAD_CIDRS = [
    "10.0.0.0",
    "10.0.0.0/33",
    "10.0.0.256/8",
    "010.0.0.0/8",
    "10.0.0/8",
    " 10.0.0.0/8",
    "10.0.0.0/8 ",
    "10.0.0.0/8\n",
    "10.0.0.0/8,0.0.0.0/0",
    "::/129",
    "2001:db8::g/32",
    "2001:db8:::1/64",
    "1:2:3:4:5:6:7:8:9/64",
    "example.org/8",
    "",
    "0.0.0.0/0\x00",
    "-10.0.0.0/8",
]


@pytest.mark.parametrize("cidr", GOOD_CIDRS)
def test_load_balancer_source_ranges_accept_cidrs(cidr):
    docs = _docs(
        {"login": {"service": {"type": "LoadBalancer", "loadBalancerSourceRanges": [cidr]}}}
    )
    assert _get(docs, "Service", "slonk-login")["spec"]["loadBalancerSourceRanges"] == [cidr]


@pytest.mark.parametrize("cidr", BAD_CIDRS)
def test_load_balancer_source_ranges_refuse_anything_else(cidr):
    with pytest.raises(chart.ChartError) as refused:
        _docs(
            {
                "login": {
                    "service": {
                        "type": "LoadBalancer",
                        "loadBalancerSourceRanges": ["10.0.0.0/8", cidr],
                    }
                }
            }
        )
    assert "at '/login/service/loadBalancerSourceRanges/1'" in str(refused.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--set", "controller.securityContext.runAsNonRoot=true"],
            "at '/controller/securityContext': additional properties 'runAsNonRoot' not allowed",
        ),
        (
            ["--set", "login.securityContext.privileged=true"],
            "at '/login/securityContext': additional properties 'privileged' not allowed",
        ),
        (
            ["--set", "login.securityContext.capabilities.add={SYS_ADMN}"],
            "at '/login/securityContext/capabilities/add/0'",
        ),
        (["--set", "workers.capabilities={CAP_SYS_ADMIN}"], "at '/workers/capabilities/0'"),
        (["--set", "workers.seccompProfile.type=Off"], "at '/workers/seccompProfile/type'"),
        (
            ["--set", "workers.capabilities={CHOWN,DAC_OVERRIDE,FOWNER,KILL,SETGID,SYS_ADMIN}"],
            "workers.capabilities: SETUID is missing",
        ),
        (
            ["--set", "login.securityContext.capabilities.add={SETUID,SETGID,SYS_CHROOT}"],
            "login.securityContext.capabilities.add: CHOWN is missing",
        ),
        (
            ["--set", "controller.securityContext.capabilities.add=null"],
            "controller.securityContext.capabilities.add: CHOWN is missing",
        ),
        (
            ["--set", "slurm.slurmConf.SrunPortRange=60001"],
            'slurm.slurmConf.SrunPortRange: "60001" must be FIRST-LAST',
        ),
        (
            ["--set", "slurm.slurmConf.SrunPortRange=63000-60001"],
            'slurm.slurmConf.SrunPortRange: "63000-60001" must be FIRST-LAST with 1024 <= FIRST',
        ),
        (["--set", "slurm.slurmConf.SrunPortRange=22-1000"], "with 1024 <= FIRST"),
        (["--set", "slurm.slurmConf.SrunPortRange=60001-99999"], "LAST <= 65535"),
        (
            ["--set", "networkPolicy.login.sshFrom[0].ipBlock.cidr=10.0.0.0/40"],
            "at '/networkPolicy/login/sshFrom/0/ipBlock/cidr'",
        ),
        (
            ["--set", "networkPolicy.login.sshFrom[0].ipBlok.cidr=10.0.0.0/8"],
            "at '/networkPolicy/login/sshFrom/0': additional properties 'ipBlok' not allowed",
        ),
        (
            [
                "--set",
                "ldap.enabled=true,ldap.uris={ldap://ldap.example.org:70000},"
                "ldap.userBase=ou=p,ldap.groupBase=ou=g",
            ],
            'ldap.uris[0]: "ldap://ldap.example.org:70000": port 70000 is not a TCP port',
        ),
        (
            ["--set", "networkPolicy.enable=false"],
            "at '/networkPolicy': additional properties 'enable' not allowed",
        ),
    ],
)
def test_bad_security_values_fail_with_the_key_path(args, message):
    assert message in _template_error(*args)


def test_a_container_that_keeps_its_runtimes_capabilities_needs_no_list():
    docs = _docs({"login": {"securityContext": {"capabilities": {"drop": [], "add": []}}}})
    assert _container(docs, "slonk-login")["securityContext"]["capabilities"] == {
        "drop": [],
        "add": [],
    }


def test_privileged_workers_keep_no_capability_list():
    docs = _docs({"workers": {"privileged": True, "capabilities": []}})
    assert _container(docs, "slonk-cpu")["securityContext"] == {"privileged": True}


def test_every_generated_secret_is_made_once_and_kept():
    """Each Secret slonk generates comes from one helper (slonk.keptSecret): found on an
    upgrade with `lookup` and kept, left by uninstall. Template mode has no cluster to look
    in, so the helper's text is what is checked."""
    on = {
        "restapi": {"enabled": True},
        "accounting": {"enabled": True},
        "ldap": {"dev": {"enabled": True}},
    }
    secrets = [d for d in _docs(on) if d["kind"] == "Secret"]
    assert len(secrets) == 5
    for secret in secrets:
        assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    helpers = (chart.default_chart() / "templates" / "_helpers.tpl").read_text()
    kept = helpers[helpers.index('define "slonk.keptSecret"') :]
    assert 'lookup "v1" "Secret" .root.Release.Namespace .name' in kept
    assert "(and $existing (index $existing.data .key)) | default .value" in kept
    templates = (chart.default_chart() / "templates").glob("*.yaml")
    assert not [t.name for t in templates if "lookup" in t.read_text()]  # none elsewhere
