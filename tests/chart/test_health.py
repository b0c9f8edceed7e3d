"""Health values: slurm.conf runs slonk's checks; only the controller may touch the API,
and only as far as recycling needs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from slonk.base import paths
from slonk.config.render import render
from slonk.config.spec import HEALTH_CHECKS
from slonk.kube import chart

from .test_objects import _container, _names, _spec

EPILOG = "Epilog=/run/slonk/bin/epilog"  # always: it clears what a job's user left in scratch


def _rules(manifest, kind, name):
    return [dict(rule) for rule in manifest.get(f"{kind}/{name}").rules]


def test_slurm_runs_the_checks(default_manifest):
    lines = render(_spec(default_manifest))["slurm.conf"].splitlines()
    assert "HealthCheckProgram=/run/slonk/bin/health" in lines
    assert "HealthCheckInterval=300" in lines
    assert "HealthCheckNodeState=ANY,CYCLE" in lines  # a few nodes at a time
    # The agent watches the machine beside the jobs: Slurm forks nothing before each one,
    # and after it only the Epilog that clears what the job's user left (slonk.health.leftovers).
    assert [line for line in lines if line.startswith(("Prolog=", "Epilog="))] == [EPILOG]


def test_gpu_pools_watch_their_gpus_and_may_read_the_kernel_log(gpu_manifest):
    lines = render(_spec(gpu_manifest))["slurm.conf"].splitlines()
    assert [line for line in lines if line.startswith(("Prolog=", "Epilog="))] == [EPILOG]
    slurmd = _container(gpu_manifest.get("StatefulSet/slonk-h100"))
    assert "SYSLOG" in slurmd.securityContext.capabilities.add


@pytest.mark.parametrize(
    ("check", "phases", "programs"),
    [
        ("storage", ("boot", "prolog"), ["Prolog=/run/slonk/bin/prolog", EPILOG]),
        ("scratch", ("epilog", "watch"), [EPILOG]),
        ("storage", ("watch",), [EPILOG]),
    ],
)
def test_a_check_put_in_a_job_phase_makes_slurm_fork_its_program(
    default_manifest, check, phases, programs
):
    spec = _spec(default_manifest)
    assert spec.health is not None
    checks = {**spec.health.checks, check: replace(spec.health.checks[check], phases=phases)}
    spec = replace(spec, health=replace(spec.health, checks=checks))
    lines = render(spec)["slurm.conf"].splitlines()
    assert [line for line in lines if line.startswith(("Prolog=", "Epilog="))] == programs


# Both record node events on pods (here) and Nodes (in `default`): slonk.metrics.node_events.
EVENTS = [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
# What each part of the controller calls (slonk.align.kube, slonk.align.syncer's Lease,
# slonk.kube.api): the chart grants exactly the union of the enabled parts'.
SYNCER_ROLE = [
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["list", "watch"]},
    {
        "apiGroups": ["apps"],
        "resources": ["statefulsets/scale"],
        "resourceNames": ["slonk-cpu"],
        "verbs": ["patch"],
    },
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["slonk-syncer"],
        "verbs": ["get", "update"],
    },
]


def _roles(values):
    rendered = chart.render(chart.default_chart(), values, namespace="hpc")
    return {
        (d["kind"], d["metadata"]["name"]): d["rules"]
        for d in yaml.safe_load_all(chart.manifest(rendered))
        if d and d["kind"] in ("Role", "ClusterRole")
    }


@pytest.mark.parametrize(
    ("syncer", "recycle", "taint", "pods", "nodes"),
    [
        (
            True,
            True,
            True,
            ["get", "delete", "list", "watch", "patch"],
            ["list", "watch", "get", "patch"],
        ),
        (True, False, False, ["list", "watch", "patch"], ["list", "watch"]),
        (False, True, True, ["get", "delete"], ["get", "patch"]),
        (False, True, False, ["get", "delete"], None),
    ],
)
def test_the_controller_gets_exactly_what_its_enabled_parts_call(
    syncer, recycle, taint, pods, nodes
):
    values = {
        "syncer": {"enabled": syncer},
        "health": {"recycle": {"enabled": recycle, "taintNodes": taint}},
    }
    roles = _roles(values)
    role = [{"apiGroups": [""], "resources": ["pods"], "verbs": pods}, *EVENTS]
    role += SYNCER_ROLE if syncer else []
    assert roles[("Role", "slonk-controller")] == role
    # A Node's Events are in `default`: there, events/create alone.
    assert roles[("Role", "hpc-slonk-controller-node-events")] == EVENTS
    cluster = roles.get(("ClusterRole", "hpc-slonk-controller"))
    assert cluster == (
        None if nodes is None else [{"apiGroups": [""], "resources": ["nodes"], "verbs": nodes}]
    )


def test_only_the_controller_gets_a_token(default_manifest):
    controller = default_manifest.get("StatefulSet/slonk-controller").spec.template.spec
    assert controller.serviceAccountName == "slonk-controller"
    assert controller.get("automountServiceAccountToken") is None  # Kubernetes' default: true
    for name in ("slonk-cpu", "slonk-login"):
        pod = default_manifest.get(f"StatefulSet/{name}").spec.template.spec
        assert pod.automountServiceAccountToken is False
    binding = default_manifest.get("ClusterRoleBinding/hpc-slonk-controller")
    assert dict(binding.subjects[0]) == {
        "kind": "ServiceAccount",
        "name": "slonk-controller",
        "namespace": "hpc",
    }


def test_without_recycling_no_pod_has_api_access(no_recycle_manifest):
    for kind in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        assert _names(no_recycle_manifest, kind) == []
    controller = no_recycle_manifest.get("StatefulSet/slonk-controller").spec.template.spec
    assert controller.serviceAccountName == "slonk"
    assert controller.automountServiceAccountToken is False


def test_the_values_file_shows_slonks_own_defaults():
    """values.yaml documents the checks' defaults; they must be the ones slonk applies."""
    values = yaml.safe_load((paths.chart_dir() / "values.yaml").read_text())["health"]["checks"]
    assert set(values) == set(HEALTH_CHECKS)
    for name, shown in values.items():
        default = HEALTH_CHECKS[name]
        assert tuple(shown.pop("phases")) == default.phases, name
        if "timeoutSeconds" in shown:
            assert shown.pop("timeoutSeconds") == default.timeout_seconds, name
        assert shown.items() <= dict(default.options).items(), name


def test_node_events_go_to_default_for_a_release_elsewhere_only():
    def documents(namespace):
        rendered = chart.render(chart.default_chart(), {}, namespace=namespace)
        return [d for d in yaml.safe_load_all(chart.manifest(rendered)) if d]

    binding = next(
        d
        for d in documents("hpc")
        if d["metadata"]["name"] == "hpc-slonk-controller-node-events"
        and d["kind"] == "RoleBinding"
    )
    assert binding["metadata"]["namespace"] == "default"
    assert binding["roleRef"]["name"] == "hpc-slonk-controller-node-events"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "slonk-controller", "namespace": "hpc"}
    ]
    # In `default` the release's own Role has events/create already.
    assert not [d for d in documents("default") if "node-events" in d["metadata"]["name"]]
