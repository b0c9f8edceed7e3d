"""The chart's copy of the cluster contract is written from the model, and kept current."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shutil
from dataclasses import MISSING
from pathlib import Path

import pytest
import yaml

from slonk.base import paths
from slonk.config import contract, model
from slonk.config.model import Rule, rules
from slonk.config.spec import SpecError, parse_spec

CHART = paths.chart_dir()
BASE = {"clusterName": "c", "release": "r"}


@pytest.fixture
def chart(tmp_path: Path) -> Path:
    assert CHART is not None
    copy = tmp_path / "slonk"
    shutil.copytree(CHART, copy)
    return copy


def _schema_at(schema: dict, dotted: str) -> dict:
    node = schema
    for key in dotted.split("."):
        node = contract._schema_child(schema, node, key)
    return node


def test_every_model_class_with_rules_has_its_place_in_values():
    ruled = [c for c in vars(model).values() if dataclasses.is_dataclass(c) and rules(c)]
    assert set(ruled) <= set(contract.SECTIONS)


def test_the_chart_states_what_the_model_rules():
    assert CHART is not None
    assert contract.stale(CHART) == {}


def test_a_bound_changed_in_the_chart_alone_is_found_and_named(chart, capsys):
    schema_file = chart / contract.SCHEMA
    schema = json.loads(schema_file.read_text())
    _schema_at(schema, "health.checks.gpu.timeoutSeconds")["maximum"] = 60
    schema_file.write_text(contract.format_schema(schema) + "\n")
    assert contract.main(["--check", str(chart)]) == 1
    out = capsys.readouterr()
    written = '"timeoutSeconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 20,'
    assert f"+                {written}" in out.out
    assert "values.schema.json differ from slonk.config" in out.err
    assert contract.main([str(chart)]) == 0  # written back from the model
    assert contract.stale(chart) == {}


def test_a_default_changed_in_values_yaml_alone_is_found(chart):
    values = chart / contract.VALUES
    values.write_text(values.read_text().replace("  watchSeconds: 10\n", "  watchSeconds: 11\n"))
    assert list(contract.stale(chart)) == [contract.VALUES]


def test_every_setting_has_its_node_in_the_schema():
    assert CHART is not None
    schema = json.loads((CHART / contract.SCHEMA).read_text())
    checked = 0
    for setting in contract.settings():
        node = _schema_at(schema, setting.values)
        assert {k: node[k] for k in setting.schema()} == setting.schema(), setting.values
        checked += 1
    assert checked > 40


@pytest.mark.parametrize(
    ("rule", "value", "refusal"),
    [
        (Rule("k", int, minimum=1), 0, "must be >= 1, got 0"),
        (Rule("k", int, maximum=9), 10, "must be <= 9, got 10"),
        (Rule("k", float, above=0), 0, "must be > 0"),
        (Rule("k", float, above=0, maximum=20, why="w"), 21, "must be > 0 and at most 20 (w)"),
        (Rule("k", str, choices=("a", "b")), "c", "must be one of a, b"),
        (Rule("k", int, minimum=1, maximum=9), 5, None),
    ],
)
def test_a_rule_says_why_it_refuses(rule, value, refusal):
    assert rule.refuse(value) == refusal


def test_the_pods_and_the_schema_read_one_rule():
    (timeout,) = [s for s in contract.settings() if s.values == "health.checks.gpu.timeoutSeconds"]
    assert timeout.schema()["maximum"] == timeout.rule.maximum == 20
    health = {"enabled": True, "checks": {"gpu": {"timeoutSeconds": 21}}}
    refused = r"health\.checks\.gpu\.timeoutSeconds: must be > 0 and at most 20"
    with pytest.raises(SpecError, match=refused):
        parse_spec({**BASE, "health": health})


def test_values_yaml_shows_defaults_from_the_model():
    assert CHART is not None
    values = yaml.safe_load((CHART / contract.VALUES).read_text())
    shown = 0
    for setting in contract.settings():
        if "*" in setting.values or setting.default in (MISSING, None):
            continue
        node = values
        for key in setting.values.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            assert node == setting.default, setting.values
            shown += 1
    assert shown > 30


# cluster.yaml's path of a values path, where the chart's clusterSpec moves it.
SPEC_PATHS = {
    "slurm.priority.": "priority.",
    "slurm.": "",
    "workers.drainTimeoutSeconds": "drainTimeoutSeconds",
    "workers.ssh.enabled": "ssh.workers",
    "accounting.slurmdbd.port": "accounting.port",
    "accounting.database.tls.enabled": "accounting.database.tls",
    "controller.backup.": "backupController.",
}
# A cluster.yaml in which every section a setting lives in is read.
EVERY_SECTION: dict = {
    **BASE,
    "nodepools": {"cpu": {"replicas": 1, "cpus": 1, "memoryMiB": 1, "gpus": {"count": 1}}},
    "partitions": {"main": {"pools": ["cpu"]}},
    "ldap": {"uris": ["ldap://ldap"], "userBase": "ou=people", "groupBase": "ou=groups"},
    "hooks": {"prolog": "prolog"},
    "health": {
        "enabled": True,
        "active": {
            "enabled": True,
            "commands": {"diag": {"command": "dcgmi diag -r 1", "timeoutSeconds": 60}},
        },
        "trends": {"enabled": True},
    },
    "metrics": {},
    "accounting": {"host": "slurmdbd", "database": {"host": "mariadb"}},
}


def _spec_path(values: str) -> list[str]:
    for prefix, replaced in SPEC_PATHS.items():
        if values.startswith(prefix):
            values = replaced + values.removeprefix(prefix)
            break
    names = {"nodepools": "cpu", "partitions": "main", "commands": "diag"}
    keys = values.split(".")
    return [names[keys[i - 1]] if key == "*" else key for i, key in enumerate(keys)]


def _breaking(rule: Rule) -> list[object]:
    if rule.pattern is not None:  # text, or where Slurm reads one an integer of its shape
        return [True, ["a list"], "-not (this) shape-"]
    wrong_type = "text" if rule.kind is not str else 7
    values = [wrong_type, True] if rule.kind is not bool else [wrong_type]
    if rule.choices:
        values.append("bogus")
    for bound, step in ((rule.minimum, -1), (rule.maximum, 1)):
        if bound is not None:
            values.append(int(bound) + step)
    if rule.above is not None:
        values.append(rule.above)
    return values


def test_the_pods_refuse_what_each_setting_refuses_naming_its_key():
    """The schema's side is written from the same rules; this is the pods' (no chart render:
    tests/chart/test_parity.py probes the schema's other rules through Helm)."""
    parse_spec(EVERY_SECTION)
    probed = 0
    for setting in contract.settings():
        path = _spec_path(setting.values)
        for value in _breaking(setting.rule):
            spec = copy.deepcopy(EVERY_SECTION)
            node = spec
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = value
            with pytest.raises(SpecError, match=rf"^{re.escape('.'.join(path))}: "):
                parse_spec(spec)
            probed += 1
    assert probed > 180


def test_a_default_is_written_back_and_the_chart_s_own_comment_kept(chart):
    values = chart / contract.VALUES
    text = values.read_text()
    values.write_text(text.replace("  watchSeconds: 10\n", "  watchSeconds: 11  # x\n"))
    assert contract.main([str(chart)]) == 0
    assert "  watchSeconds: 10  # x\n" in values.read_text()
