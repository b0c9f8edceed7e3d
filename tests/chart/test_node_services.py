"""Every Slurm node's Service (services.yaml writes them in flow style, computed once per pool)
is named as its pod and selects it, whatever the pool and release are called. And
`slonk.kube.chart.documents` splits and orders the manifest as Helm does."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from slonk.config.spec import parse_spec
from slonk.kube import chart

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
        f"{name}-{i}" for name, pool in workers.items() for i in range(pool["spec"]["replicas"])
    }
    assert expected, "the values set has no worker"
    assert {n for n, s in services.items() if POD_NAME in s["spec"]["selector"]} == expected
    for node in expected:
        assert services[node] == {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": node},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {POD_NAME: node},
            },
        }


@pytest.mark.parametrize("pool", ["cpu", "on", "1", "no", "1e3", "null"])
def test_labels_are_strings_whatever_the_pool_is_named(pool):
    """A pool named like a YAML boolean or number still labels its objects with a string:
    Kubernetes refuses any other label value."""
    pools = {"cpu": {"replicas": 0}, pool: {"replicas": 1, "cpus": 2, "memoryMiB": 1024}}
    objects = _objects({"nodepools": pools})
    for d in objects:
        assert all(isinstance(v, str) for v in d["metadata"].get("labels", {}).values())
    (service,) = [d for d in objects if d["metadata"]["name"] == f"hpc1-{pool}-0"]
    assert service["spec"]["selector"] == {POD_NAME: f"hpc1-{pool}-0"}
    (config,) = [d for d in objects if d["kind"] == "ConfigMap" and "cluster.yaml" in d["data"]]
    assert parse_spec(yaml.safe_load(config["data"]["cluster.yaml"])).pool(pool).replicas == 1


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


def test_a_pool_name_cannot_write_into_a_service_without_the_schema(tmp_path):
    """`helm --skip-schema-validation` skips values.schema.json: the name goes into the
    Services' text, so the templates refuse it themselves."""
    unchecked = tmp_path / "slonk"
    shutil.copytree(chart.default_chart(), unchecked)
    (unchecked / "values.schema.json").unlink()
    pools = {"cpu": {"replicas": 0}, "a, namespace: x": {"replicas": 1, "cpus": 2, "memoryMiB": 1}}
    with pytest.raises(chart.ChartError, match=r"nodepools\.a, namespace: x: .* DNS-1123 label"):
        chart.render(unchecked, {"nodepools": pools})


NAMED = ("name", "namespace", "serviceAccountName")


def _strings_wanted(node: Any) -> Iterator[Any]:
    """Every value Kubernetes wants a string for that a release or namespace name reaches:
    names, namespaces, accounts, label values (labels, label selectors, a Service's
    selector), the namespaces a PodMonitor watches."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in NAMED or key == "matchNames":
                yield from value if key == "matchNames" else [value]
            elif key in ("labels", "matchLabels") or (
                key == "selector" and "matchLabels" not in value
            ):
                yield from value.values()
            yield from _strings_wanted(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings_wanted(item)


@pytest.mark.parametrize("name", ["on", "1"])
def test_a_release_or_namespace_named_like_a_boolean_or_a_number_stays_a_string(name):
    """YAML reads an unquoted `on` as true and `1` as a number: Kubernetes refuses a name or a
    label that is no string."""
    values = {"metrics": {"podMonitor": {"enabled": True}}, "accounting": {"enabled": True}}
    for release, namespace in ((name, "hpc"), ("slonk", name)):
        rendered = chart.render(chart.default_chart(), values, release=release, namespace=namespace)
        for doc in (d for d in yaml.safe_load_all(chart.manifest(rendered)) if d):
            wrong = [v for v in _strings_wanted(doc) if not isinstance(v, str)]
            assert not wrong, (release, namespace, doc["kind"], wrong)
