"""One home for each default. values.yaml states its defaults for Helm users to read; every
one that reaches cluster.yaml must be the pods' own default (the model's field default, or the
health catalogue's): a cluster.yaml without the key must parse to the same spec."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from slonk.config.spec import SpecError, parse_spec
from slonk.kube import chart

# Values that turn on every section of cluster.yaml, each with values.yaml's defaults.
ALL_ON: dict[str, Any] = {
    "ldap": {
        "enabled": True,
        "uris": ["ldap://ldap.example.org"],
        "userBase": "ou=people,dc=example,dc=org",
        "groupBase": "ou=groups,dc=example,dc=org",
    },
    "hooks": {"enabled": True, "git": {"repo": "https://git.example.org/hooks.git"}},
}
# Keys the chart always writes whose absence in cluster.yaml means "off", not a default,
# and the values' example pool and partition (data, not defaults).
NOT_DEFAULTS = {
    "health": "a section left out is off",
    "hooks": "the same",
    "ldap": "the same",
    "accounting": "the same (a spec from before accounting)",
    "metrics": "the same (no metrics service)",
    "health.enabled": "no health section: a spec from before health checks",
    "slurmConf": "holds SrunPortRange only",
    "slurmConf.SrunPortRange": "the chart pins srun's ports for its NetworkPolicies; a spec "
    "without it leaves them to Slurm",
    "hooks.prolog": "the chart writes every phase; a phase not given runs nothing",
    "hooks.epilog": "the same",
    "partitions.main.default": "the example partition is the default one",
    "partitions.main.pools": "the example partition's pools",
    "partitions.main": "the example partition",
    "partitions": "the example partition",
    "nodepools": "the example pool",
}


def _cluster_yaml(values: dict[str, Any]) -> dict[str, Any]:
    rendered = chart.render(chart.default_chart(), values)
    configmap = yaml.safe_load(rendered["slonk/templates/cluster-configmap.yaml"])
    return yaml.safe_load(configmap["data"]["cluster.yaml"])


def _keys(node: Any, path: str = "") -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            at = f"{path}.{key}" if path else key
            yield at
            yield from _keys(value, at)


def _without(document: dict[str, Any], path: str) -> dict[str, Any]:
    copied = copy.deepcopy(document)
    *parents, last = path.split(".")
    node = copied
    for key in parents:
        node = node[key]
    del node[last]
    return copied


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    return _cluster_yaml(ALL_ON)


def test_every_default_values_yaml_writes_is_the_pods_default(rendered):
    spec = parse_spec(rendered)
    differ = []
    for path in _keys(rendered):
        if path in NOT_DEFAULTS:
            continue
        try:
            without = parse_spec(_without(rendered, path))
        except SpecError:
            continue  # required: values.yaml's value is no default
        if without != spec:
            differ.append(path)
    assert differ == [], differ


def test_the_exceptions_are_written(rendered):
    assert set(NOT_DEFAULTS) <= set(_keys(rendered))
