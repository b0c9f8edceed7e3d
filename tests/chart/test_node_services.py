"""Every Slurm node's Service (services.yaml writes them in flow style, computed once per pool)
is the object the chart's block-style templates describe: named and selecting its pod, labelled
as its StatefulSet, with the ports its pod names. And `slonk.chart.documents` splits and orders
the manifest as Helm does."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from slonk import chart

from .conftest import VALUES

# (values files, values over them)
VALUE_SETS = [
    ([], {}),
    (["gpu-pools.yaml"], {}),
    (["gpu-pools.yaml", "metrics.yaml"], {}),
    (["existing.yaml"], {}),
    (["gpu-pools.yaml"], {"metrics": {"enabled": False}, "slurm": {"slurmdPort": 7000}}),
]
POD_NAME = "statefulset.kubernetes.io/pod-name"


def _objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    manifest = chart.manifest(chart.render(chart.default_chart(), values, release="hpc1"))
    return [d for d in yaml.safe_load_all(manifest) if d]


def _expected_ports(pool: dict[str, Any]) -> list[dict[str, Any]]:
    """The Service's ports: the pod's slurmd and metrics ports, by name."""
    container = pool["spec"]["template"]["spec"]["containers"][0]
    return [
        {"name": port["name"], "port": port["containerPort"], "targetPort": port["name"]}
        for port in container["ports"]
        if port["name"] in ("slurmd", "metrics")
    ]


@pytest.mark.parametrize(("files", "over"), VALUE_SETS, ids=lambda v: str(v))
def test_each_node_service_is_its_pods(files, over):
    objects = _objects(chart.deep_merge(chart.user_values([VALUES / f for f in files]), over))
    workers = {
        d["metadata"]["name"]: d
        for d in objects
        if d["kind"] == "StatefulSet"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    }
    services = {d["metadata"]["name"]: d for d in objects if d["kind"] == "Service"}
    expected = {
        f"{name}-{i}": pool
        for name, pool in workers.items()
        for i in range(pool["spec"]["replicas"])
    }
    assert expected, "the values set has no worker"
    assert {n for n, s in services.items() if POD_NAME in s["spec"]["selector"]} == set(expected)
    for node, pool in expected.items():
        assert services[node] == {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": node, "labels": pool["metadata"]["labels"]},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {POD_NAME: node},
                "ports": _expected_ports(pool),
            },
        }


def test_node_service_labels_are_strings_in_flow_style():
    """The flow mapping keeps the quoted version a string, as the block style did."""
    values = {"nodepools": {"cpu": {"replicas": 1}}}
    (service,) = [d for d in _objects(values) if d["metadata"]["name"] == "hpc1-cpu-0"]
    assert all(isinstance(v, str) for v in service["metadata"]["labels"].values())


def test_documents_split_on_separator_lines_only_and_keep_helms_order():
    rendered = {
        "c/templates/a.yaml": "---\n# only a comment\n---\nkind: StatefulSet\nx: '---'\n---  \n\n",
        "c/templates/b.yaml": "kind: Service\nmetadata: {name: s}\n---\n---\nkind: Secret\n----\n",
        "c/templates/NOTES.txt": "kind: Secret\n",
    }
    assert chart.documents(rendered) == [
        ("c/templates/b.yaml", "kind: Secret\n----"),
        ("c/templates/b.yaml", "kind: Service\nmetadata: {name: s}"),
        ("c/templates/a.yaml", "kind: StatefulSet\nx: '---'"),
    ]
    assert chart.kind_of("apiVersion: v1\nkind: Service\n") == "Service"
    assert chart.kind_of("metadata: {kind: x}") == ""
