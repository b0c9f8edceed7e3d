"""Safe removal of worker pods, as the chart renders it: each worker's preStop hook and grace
from workers.drainTimeoutSeconds + stopMarginSeconds, the same timeout in cluster.yaml, and per
pool two PodDisruptionBudgets that never select the same pod (the eviction API answers 500 for
a pod two budgets select): busy pods none may be evicted, the others maxUnavailable."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from slonk.config.spec import SpecError, parse_spec
from slonk.kube import chart

from .conftest import VALUES
from .test_contract import _names

BUSY = "slonk.io/busy"


def _objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = chart.manifest(chart.render(chart.default_chart(), values, namespace="hpc"))
    return [d for d in yaml.safe_load_all(rendered) if d]


def _workers(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d
        for d in objects
        if d["kind"] == "StatefulSet"
        and d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    }


def _budgets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in objects if d["kind"] == "PodDisruptionBudget"}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes' LabelSelector semantics, for the operators the chart uses."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression["values"]
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator not in ("In", "NotIn"):
            raise AssertionError(f"no test for operator {operator}")
    return True


def _cluster_yaml(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (configmap,) = [d for d in objects if d["kind"] == "ConfigMap"]
    return yaml.safe_load(configmap["data"]["cluster.yaml"])


@pytest.fixture(scope="module")
def gpu_objects() -> list[dict[str, Any]]:
    return _objects(chart.user_values([VALUES / "gpu-pools.yaml"]))


def test_every_worker_drains_before_it_stops_within_its_grace(gpu_objects):
    workers = _workers(gpu_objects)
    assert len(workers) == 3
    for statefulset in workers.values():
        pod = statefulset["spec"]["template"]["spec"]
        slurmd = pod["containers"][0]
        assert slurmd["name"] == "slurmd"
        assert slurmd["lifecycle"]["preStop"]["exec"]["command"] == [
            "slonk", "worker", "stop", "--timeout", "300",
        ]  # fmt: skip
        assert pod["terminationGracePeriodSeconds"] == 300 + 90
    assert parse_spec(_cluster_yaml(gpu_objects)).drain_timeout_seconds == 300
    others = [d for d in gpu_objects if d["kind"] == "StatefulSet" and d["metadata"]["name"]
              not in workers]  # fmt: skip
    assert all(
        "lifecycle" not in c for d in others for c in d["spec"]["template"]["spec"]["containers"]
    )


def test_the_timeout_and_margin_make_the_grace():
    objects = _objects({"workers": {"drainTimeoutSeconds": 30, "stopMarginSeconds": 15}})
    (worker,) = _workers(objects).values()
    pod = worker["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 45
    assert pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1] == "30"
    assert _cluster_yaml(objects)["drainTimeoutSeconds"] == 30


def test_busy_pods_have_a_budget_of_their_own_and_every_pod_exactly_one(gpu_objects):
    budgets = _budgets(gpu_objects)
    workers = _workers(gpu_objects)
    assert sorted(budgets) == sorted(
        f"{name}{suffix}" for name in workers for suffix in ("", "-busy")
    )
    for name, statefulset in workers.items():
        labels = statefulset["spec"]["template"]["metadata"]["labels"]
        assert budgets[f"{name}-busy"]["spec"]["maxUnavailable"] == 0
        assert budgets[name]["spec"]["maxUnavailable"] == 1
        for busy in (
            {BUSY: "true"},
            {BUSY: "false"},
            {},
        ):  # unlabelled: the syncer is not there yet
            pod = {**labels, **busy}
            selecting = [
                b for b, budget in budgets.items() if _selects(budget["spec"]["selector"], pod)
            ]
            assert selecting == [f"{name}-busy" if busy.get(BUSY) == "true" else name], busy


def test_the_budgets_follow_the_values():
    values = {"workers": {"podDisruptionBudget": {"maxUnavailable": "25%"}}}
    assert _budgets(_objects(values))["slonk-cpu"]["spec"]["maxUnavailable"] == "25%"
    assert _budgets(_objects({"workers": {"podDisruptionBudget": {"enabled": False}}})) == {}
    assert _budgets(_objects({"nodepools": {"cpu": {"replicas": 0}}})) == {}


def test_the_removed_grace_key_is_refused_naming_the_keys_that_replace_it():
    with pytest.raises(chart.ChartError) as caught:
        _objects({"workers": {"terminationGracePeriodSeconds": 60}})
    message = str(caught.value)
    assert "workers.terminationGracePeriodSeconds: removed" in message
    assert "workers.drainTimeoutSeconds" in message and "workers.stopMarginSeconds" in message
    # null takes it out (a GitOps overlay over a base file that set it).
    assert _objects({"workers": {"terminationGracePeriodSeconds": None}})


@pytest.mark.parametrize("key", ["drainTimeoutSeconds", "stopMarginSeconds"])
def test_a_negative_time_is_refused_by_the_chart(key):
    with pytest.raises(chart.ChartError) as caught:
        _objects({"workers": {key: -1}})
    assert _names(str(caught.value), f"workers.{key}"), caught.value


def test_a_negative_drain_timeout_is_refused_by_the_pods(gpu_objects):
    spec = copy.deepcopy(_cluster_yaml(gpu_objects))
    spec["drainTimeoutSeconds"] = -1
    with pytest.raises(SpecError, match=r"^drainTimeoutSeconds: must be >= 0"):
        parse_spec(spec)
