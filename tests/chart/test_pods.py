"""Every pod the chart makes takes its PriorityClass and its pod securityContext from its
component's values, and no pod template is left without them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml

from slonk.kube import chart

from .conftest import VALUES

COMPONENT = "app.kubernetes.io/component"
# Where each component's pod settings live in values.
SETTINGS = {
    "controller": ("controller",),
    "login": ("login",),
    "worker": ("workers",),
    "ldap": ("ldap", "dev"),
    "slurmdbd": ("accounting", "slurmdbd"),
    "mariadb": ("accounting", "database"),
}
# Accounting's pods have no podSecurityContext in values: the runtime's default filter, fixed.
FIXED_POD_SECURITY = {"seccompProfile": {"type": "RuntimeDefault"}}
# The pods where srun listens (login: srun and salloc; workers: srun in a job), which reserve
# SrunPortRange from the kernel's own choice of ports.
SRUN_PODS = ("login", "worker")
RESERVED_PORTS = "net.ipv4.ip_local_reserved_ports"
# With these, the chart renders every kind of pod it has (the directory, git-sync beside slurmd).
EVERY_POD = ["ldap-dev.yaml", "hooks.yaml"]


def _docs(files: list[str], extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    values = chart.user_values([VALUES / f for f in files])
    rendered = chart.render(
        chart.default_chart(), chart.deep_merge(values, extra or {}), namespace="hpc"
    )
    return [d for d in yaml.safe_load_all(chart.manifest(rendered)) if d]


def _pod_templates(node: Any) -> Iterator[dict[str, Any]]:
    """Every pod template (or Pod) anywhere in a document: whatever has a spec with containers,
    so a new kind of workload is found without being named here."""
    if isinstance(node, dict):
        if isinstance(node.get("spec"), dict) and "containers" in node["spec"]:
            yield node
        for value in node.values():
            yield from _pod_templates(value)
    elif isinstance(node, list):
        for value in node:
            yield from _pod_templates(value)


def _pods(docs: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(object name, component, pod spec) of every pod template."""
    return [
        (doc["metadata"]["name"], template["metadata"]["labels"][COMPONENT], template["spec"])
        for doc in docs
        for template in _pod_templates(doc)
    ]


def _settings(values: dict[str, Any], component: str) -> dict[str, Any]:
    for key in SETTINGS[component]:
        values = values[key]
    return values


def test_every_pod_runs_under_the_default_seccomp_filter_with_no_priority_class():
    pods = _pods(_docs(EVERY_POD))
    assert {component for _, component, _ in pods} == set(SETTINGS)
    for name, component, spec in pods:
        reserved = [{"name": RESERVED_PORTS, "value": "60001-63000"}]
        assert spec["securityContext"] == {
            "seccompProfile": {"type": "RuntimeDefault"},
            **({"sysctls": reserved} if component in SRUN_PODS else {}),
        }, name
        assert "priorityClassName" not in spec, name
        for container in spec["containers"]:  # git-sync included: the pod's filter covers it
            own = container.get("securityContext", {}).get("seccompProfile")
            assert (own or spec["securityContext"]["seccompProfile"]) == {
                "type": "RuntimeDefault"
            }, f"{name}: {container['name']}"


def test_every_pod_takes_its_components_priority_class_and_security_context():
    values = chart.user_values([VALUES / f for f in [*EVERY_POD, "pod-security.yaml"]])
    pods = _pods(_docs([*EVERY_POD, "pod-security.yaml"]))
    assert {component for _, component, _ in pods} == set(SETTINGS)
    for name, component, spec in pods:
        settings = _settings(values, component)
        assert spec["priorityClassName"] == settings["priorityClassName"], name
        # null (the directory's here) removes the default: no securityContext at all.
        expected = settings.get("podSecurityContext", FIXED_POD_SECURITY)
        if component in SRUN_PODS:
            reserved = {"name": RESERVED_PORTS, "value": "60001-63000"}
            expected = {**expected, "sysctls": [*expected.get("sysctls", []), reserved]}
        assert spec.get("securityContext") == expected, name


def test_a_reservation_of_srun_ports_in_values_is_kept_and_none_without_a_range():
    own = {"name": "net/ipv4/ip_local_reserved_ports", "value": "1000-1010"}
    docs = _docs([], {"workers": {"podSecurityContext": {"sysctls": [own]}}})
    contexts = {component: spec["securityContext"] for _, component, spec in _pods(docs)}
    assert contexts["worker"]["sysctls"] == [own]
    assert contexts["login"]["sysctls"] == [{"name": RESERVED_PORTS, "value": "60001-63000"}]
    docs = _docs([], {"slurm": {"slurmConf": {"SrunPortRange": None}}})
    assert not any("sysctls" in spec["securityContext"] for _, _, spec in _pods(docs))


@pytest.mark.parametrize("kube_version", ["1.29", "1.33"])
def test_pod_settings_render_valid_kubernetes(kube_version):
    for doc in _docs([*EVERY_POD, "pod-security.yaml"]):
        kubernetes_validate.validate(doc, kube_version, strict=True)


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        (
            {"controller": {"podSecurityContext": {"runAsNonRoot": True}}},
            "at '/controller/podSecurityContext': additional properties 'runAsNonRoot' not allowed",
        ),
        (
            {"workers": {"podSecurityContext": {"runAsUser": 1000}}},
            "at '/workers/podSecurityContext': additional properties 'runAsUser' not allowed",
        ),
        (
            {"login": {"podSecurityContext": {"fsGroupChangePolicy": "Never"}}},
            "at '/login/podSecurityContext/fsGroupChangePolicy'",
        ),
        (
            {"login": {"podSecurityContext": {"fsGroup": -1}}},
            "at '/login/podSecurityContext/fsGroup'",
        ),
        (
            {
                "workers": {
                    "podSecurityContext": {"sysctls": [{"name": "net/../x y", "value": "1"}]}
                }
            },
            "at '/workers/podSecurityContext/sysctls/0/name'",
        ),
        (
            {"ldap": {"dev": {"podSecurityContext": {"seccompProfile": {"type": "Off"}}}}},
            "at '/ldap/dev/podSecurityContext/seccompProfile/type'",
        ),
        ({"workers": {"priorityClassName": "Batch_Jobs"}}, "at '/workers/priorityClassName'"),
        # A value that would write its own keys into the pod spec.
        (
            {"login": {"priorityClassName": "x\n      hostNetwork: true"}},
            "at '/login/priorityClassName'",
        ),
        ({"ldap": {"dev": {"priorityClassName": "a" * 254}}}, "at '/ldap/dev/priorityClassName'"),
    ],
)
def test_bad_pod_settings_fail_with_the_key_path(extra, where):
    with pytest.raises(chart.ChartError) as refused:
        _docs(EVERY_POD, extra)
    assert where in str(refused.value)
