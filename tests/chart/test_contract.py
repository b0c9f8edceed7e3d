"""The chart refuses every value the pods would refuse, naming the key.

Written from the attacker's side: each case is a value that, if it reached a pod, would add a
line or an option to slurm.conf, a command line or a URL. The chart must refuse it (its
schema or its `slonk.validate`), and so must the pods' spec parser when the same value
reaches cluster.yaml by another road (a hand-edited ConfigMap, an older chart). Both errors
name the offending key.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml

from slonk.config import active_checks, patterns
from slonk.config.spec import RESERVED_POOL_NAMES, SpecError, parse_spec
from slonk.kube import chart

POOL = {"replicas": 2, "cpus": 2, "memoryMiB": 2048}
PARTITION = {"pools": ["cpu"], "default": True}
# Values under which every key the cases touch reaches cluster.yaml.
BASE_VALUES: dict[str, Any] = {
    "nodepools": {"cpu": POOL},
    "partitions": {"main": PARTITION},
    "ldap": {"dev": {"enabled": True}},
}
# Where a values key lands in cluster.yaml, where the two differ.
SPEC_PATH = {
    "slurm.slurmConf": "slurmConf",
    "slurm.cgroupConf": "cgroupConf",
    "slurm.extraLines": "extraLines",
    "slurm.slurmctldPort": "slurmctldPort",
    "slurm.slurmdPort": "slurmdPort",
    "slurm.priority": "priority",
    "accounting.slurmdbd.port": "accounting.port",
}

# (values key, hostile value, the key both errors must name)
HOSTILE = [
    ("clusterName", "slonk\nNodeName=evil", None),
    ("clusterDomain", "cluster.local\nNodeName=evil CPUs=1", None),
    ("clusterDomain", "cluster.local NodeName=evil", None),
    ("partitions.main\n", {"pools": ["cpu"]}, None),
    ("partitions.main Nodes=ALL", {"pools": ["cpu"]}, None),
    ("partitions.main.maxTime", "INFINITE\nNodeName=evil CPUs=1", None),
    ("partitions.main.maxTime", "INFINITE AllowGroups=root", None),
    ("partitions.main.maxTime", -5, None),
    ("partitions.main.defaultTime", "1:00 Hidden=YES", None),
    ("partitions.main.preemptMode", "OFF AllowGroups=root", None),
    ("partitions.main.state", "UP\nNodeName=evil", None),
    (
        "partitions.main.options",
        {"AllowGroups": "root Nodes=ALL"},
        "partitions.main.options.AllowGroups",
    ),
    ("partitions.main.options", {"Nodes": "ALL"}, "partitions.main.options.Nodes"),
    ("partitions.main.options", {"nodes": "ALL"}, "partitions.main.options.nodes"),
    ("partitions.main.options", {"Default": "YES"}, "partitions.main.options.Default"),
    ("slurm.slurmConf", {"clustername": "evil"}, "slurm.slurmConf.clustername"),
    ("slurm.slurmConf", {"ControlMachine": "evil"}, "slurm.slurmConf.ControlMachine"),
    ("slurm.slurmConf", {"slurmctldhost": "evil"}, "slurm.slurmConf.slurmctldhost"),
    ("slurm.slurmConf", {"INCLUDE": "/etc/passwd"}, "slurm.slurmConf.INCLUDE"),
    ("slurm.slurmConf", {"SlurmctldPort": 1}, "slurm.slurmConf.SlurmctldPort"),
    # slurmctld logs to stderr (kubectl logs); config-watch reads it to know a reconfigure ran.
    ("slurm.slurmConf", {"SlurmctldLogFile": "/tmp/x"}, "slurm.slurmConf.SlurmctldLogFile"),
    ("slurm.slurmConf", {"MaxJobCount": "5 NodeName=evil"}, "slurm.slurmConf.MaxJobCount"),
    ("slurm.slurmConf", {"MaxJobCount": "5\nNodeName=evil"}, "slurm.slurmConf.MaxJobCount"),
    ("slurm.slurmConf", {"MaxJobCount": "5\r"}, "slurm.slurmConf.MaxJobCount"),
    ("slurm.slurmConf", {"MaxJobCount": "5\\"}, "slurm.slurmConf.MaxJobCount"),
    ("slurm.slurmConf", {"Prolog": "/bin/x#"}, "slurm.slurmConf.Prolog"),
    ("slurm.slurmConf", {"Prolog": '"/bin/x"'}, "slurm.slurmConf.Prolog"),
    ("slurm.slurmConf", {"MaxJobCount": 1, "maxjobcount": 2}, "slurm.slurmConf.maxjobcount"),
    ("slurm.slurmConf", {"Max Job": 1}, "slurm.slurmConf.Max Job"),
    (
        "slurm.cgroupConf",
        {"ConstrainCores": "yes\nAllowedDevicesFile=/x"},
        "slurm.cgroupConf.ConstrainCores",
    ),
    ("slurm.extraLines", ["MaxJobCount=5 NodeName=evil"], "slurm.extraLines[0]"),
    ("slurm.extraLines", ["nodename=evil"], "slurm.extraLines[0]"),
    ("slurm.extraLines", ["PartitionName=x Nodes=ALL"], "slurm.extraLines[0]"),
    ("slurm.extraLines", ["Include /etc/passwd"], "slurm.extraLines[0]"),
    ("slurm.extraLines", ["A=1\nB=2"], "slurm.extraLines[0]"),
    ("slurm.extraLines", ["MaxJobCount=5\\"], "slurm.extraLines[0]"),
    ("slurm.slurmctldPort", 70000, None),
    ("slurm.slurmConf", {"SlurmctldAddr": "evil.example.org"}, "slurm.slurmConf.SlurmctldAddr"),
    ("slurm.extraLines", ["SelectType=select/linear", "selecttype=x"], "slurm.extraLines[1]"),
    ("partitions.DEFAULT", {"pools": ["cpu"]}, None),
    ("partitions.default", {"pools": ["cpu"]}, None),
    ("partitions.main.options", {"Priority": 1000}, "partitions.main.options.Priority"),
    ("partitions.main.priorityTier", 70000, None),
    ("nodepools.default", POOL, None),
    ("nodepools.cpu.cpus", 70000, None),
    ("nodepools.cpu.cpus", 10**20, None),
    ("nodepools.cpu.memoryMiB", 2**40, None),
    ("health.intervalSeconds", 1e21, None),
    ("nodepools.ldap", POOL, None),
    ("nodepools.cpu.replicas", 100_000_000, None),
    ("nodepools.cpu.features", ["gpu\nNodeName=evil"], "nodepools.cpu.features[0]"),
    ("nodepools.cpu.features", ["a b"], "nodepools.cpu.features[0]"),
    ("nodepools.cpu.gpus", {"count": 1, "type": "h100 Foo=bar"}, "nodepools.cpu.gpus.type"),
    ("nodepools.cpu.topology", {"switch": "s1\nSwitchName=evil"}, "nodepools.cpu.topology.switch"),
    ("nodepools.cpu.topology", {"block": "b1 Nodes=ALL"}, "nodepools.cpu.topology.block"),
    ("health.checks.interfaces.names", ["eth0; reboot"], "health.checks.interfaces.names[0]"),
    ("health.checks.interfaces.names", ["$(reboot)"], "health.checks.interfaces.names[0]"),
    ("health.checks.interfaces.rdmaDevices", ["-x"], "health.checks.interfaces.rdmaDevices[0]"),
    ("health.checks.gpu.nvidiaSmi", "--help", None),
    ("health.checks.gpu.nvidiaSmi", "nvidia-smi; reboot", None),
    ("health.checks.gpu.dmesg", "dmesg | sh", None),
    ("health.checks.storage.paths", ["/home/../etc"], "health.checks.storage.paths[0]"),
    ("health.checks.storage.paths", ["home"], "health.checks.storage.paths[0]"),
    ("health.checks.scratch.path", "/tmp\n", None),
    ("health.checks.scratch.path", "/tmp/", None),
    ("ldap.userBase", "ou=people\nuid=evil", None),
    ("ldap.userFilter", "(objectClass=posixAccount)\n", None),
    # Accounting names reach slurm.conf, slurmdbd.conf, sacctmgr's arguments and SQL.
    ("accounting.defaultAccount", "research\nAccountingStorageEnforce=none", None),
    ("accounting.defaultAccount", "research where name=root", None),
    ("accounting.defaultAccount", "a=b", None),
    ("accounting.defaultAccount", "a,b", None),
    ("accounting.defaultAccount", "-i", None),
    (
        "accounting.groupAccounts",
        [{"group": "physics", "account": "x set parent=root"}],
        "accounting.groupAccounts[0].account",
    ),
    (
        "accounting.groupAccounts",
        [{"group": "phy sics", "account": "physics"}],
        "accounting.groupAccounts[0].group",
    ),
    (
        "accounting.groupAccounts",
        [{"group": "physics", "account": "a"}, {"group": "physics", "account": "b"}],
        "accounting.groupAccounts[1].group",
    ),
    ("accounting.database.name", "slurm`; DROP DATABASE mysql; --", None),
    ("accounting.database.user", "slurm'@'%", None),
    ("accounting.database.host", "db.example.org\nStorageHost=evil", None),
    ("accounting.database.host", "db.example.org StoragePass=x", None),
    ("accounting.database.port", 70000, None),
    ("accounting.slurmdbd.port", 0, None),
    ("slurm.priority.decayHalfLife", "7-0\nPriorityType=priority/basic", None),
    ("slurm.priority.maxAge", "7-0 PriorityFlags=NO_FAIR_TREE", None),
    # Slurm refuses a zero half-life and dies on an overflowing one: every daemon stops.
    ("slurm.priority.decayHalfLife", "0", None),
    ("slurm.priority.decayHalfLife", "0-0", None),
    ("slurm.priority.decayHalfLife", "9999999999", None),
    ("slurm.priority.maxAge", "99999-0", None),
    ("slurm.priority.weights.fairshare", 200_000_000, None),
    ("slurm.priority.weights.age", -1, None),
]
# Values that never reach cluster.yaml (the git-sync sidecar's): the chart alone refuses them.
HOSTILE_CHART_ONLY = [
    ("hooks.git.ref", "--upload-pack=touch /tmp/pwned"),
    ("hooks.git.ref", "main\n"),
    ("hooks.git.repo", "ext::sh -c touch% /tmp/pwned"),
    ("hooks.git.repo", "-oProxyCommand=touch /tmp/pwned"),
    ("hooks.git.repo", "https://example.org/hooks.git --upload-pack=x"),
    # Image references reach podman's command line in local mode: no option, space or line.
    ("images.worker", "--privileged"),
    ("images.worker", "-f json"),
    ("images.controller", "slonk/controller\n"),
    ("images.login", "Slonk/Login"),
    ("images.registry", "-v=/:/host"),
    ("images.registry", "localhost extra"),
    ("images.tag", "--rm"),
    ("images.tag", "1.0 --privileged"),
    ("images.tag", "x" * 129),
    ("hooks.git.image", "--privileged"),
    ("hooks.git.image", "registry.k8s.io/git-sync:v4 --rm"),
    # Names of Secrets and claims are written into manifests: a name, nothing more.
    ("ssh.trustedUserCAKeys", "x, defaultMode: 0777"),
    ("ssh.existingSecret", "Not A Name"),
    ("munge.existingSecret", "x}\n"),
    ("home.existingClaim", "x, readOnly: false"),
    ("ldap.bindPasswordSecret", "x, optional: true"),
    ("accounting.database.passwordSecret", "x, items: []"),
    ("serviceAccount.name", "default\nkind: ClusterRoleBinding"),
    ("images.pullSecrets", ["x}, {name: y"]),
]


def _keys(path: str) -> list[str | int]:
    return [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", path)]


def _set(document: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = _keys(path)
    node: Any = document
    for key in parents:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    node[last] = value


def _spec_path(path: str) -> str:
    for values_key, spec_key in SPEC_PATH.items():
        if path.startswith(values_key):
            return spec_key + path.removeprefix(values_key)
    return path


def _chart_error(values: dict[str, Any]) -> str:
    with pytest.raises(chart.ChartError) as caught:
        chart.render(chart.default_chart(), values)
    return str(caught.value)


def _names(message: str, path: str) -> bool:
    """The schema names a key as a JSON pointer (or, for a bad key name, the key itself),
    the templates as a dotted path."""
    keys = [str(k) for k in _keys(path)]
    pointer = "/" + "/".join(keys)
    quoted = json.dumps(keys[-1])[1:-1]  # as the schema's messages quote a key
    names = (path, f"'{pointer}'", f"'{pointer}/", f"propertyName '{quoted}'")
    return any(name in message for name in names)


@pytest.fixture(scope="module")
def base_spec() -> dict[str, Any]:
    rendered = chart.render(chart.default_chart(), BASE_VALUES)
    configmap = yaml.safe_load(rendered["slonk/templates/cluster-configmap.yaml"])
    return yaml.safe_load(configmap["data"]["cluster.yaml"])


@pytest.mark.parametrize(("key", "value", "named"), HOSTILE, ids=lambda x: repr(x)[:40])
def test_the_chart_refuses_what_the_pods_refuse(key, value, named, base_spec):
    named = named or key
    values = copy.deepcopy(BASE_VALUES)
    _set(values, key, value)
    message = _chart_error(values)
    assert _names(message, named), message

    spec = copy.deepcopy(base_spec)
    _set(spec, _spec_path(key), value)
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    assert str(caught.value).startswith(_spec_path(named)), caught.value


@pytest.mark.parametrize(("key", "value"), HOSTILE_CHART_ONLY, ids=lambda x: repr(x)[:40])
def test_the_chart_refuses_hostile_git_settings(key, value):
    values = copy.deepcopy(BASE_VALUES)
    _set(values, "hooks.enabled", True)
    _set(values, "hooks.git.repo", "https://git.example.org/hooks.git")
    _set(values, key, value)
    message = _chart_error(values)
    assert _names(message, key), message


def test_the_base_values_render_and_parse(base_spec):
    assert parse_spec(base_spec).partitions[0].name == "main"


# The schema states each shape again for Helm: it must be the very pattern the pods use (the
# settings' own patterns are written from their rules: slonk.config.contract).
ACTIVE = "/properties/health/properties/active/properties"
SCHEMA_PATTERNS = [
    ("/properties/clusterName", patterns.CLUSTER_NAME),
    ("/properties/slurm/properties/extraLines/items", patterns.EXTRA_LINE),
    ("/$defs/confMap/propertyNames", patterns.CONF_KEY),
    ("/$defs/confMap/additionalProperties", patterns.CONF_VALUE),
    ("/$defs/dnsLabel", patterns.DNS_LABEL),
    ("/$defs/slurmName", patterns.SLURM_NAME),
    ("/$defs/extendedResource", patterns.EXTENDED_RESOURCE),
    ("/properties/hooks/properties/git/properties/ref", patterns.GIT_REF),
    ("/properties/hooks/properties/git/properties/repo/anyOf/1", patterns.GIT_REPO),
    ("/properties/hooks/properties/git/properties/image", patterns.IMAGE),
    ("/properties/images/properties/registry", patterns.IMAGE_REGISTRY),
    ("/properties/images/properties/tag", patterns.IMAGE_TAG),
    ("/properties/images/properties/controller", patterns.IMAGE_NAME),
    ("/properties/images/properties/worker", patterns.IMAGE_NAME),
    ("/properties/images/properties/login", patterns.IMAGE_NAME),
    ("/properties/images/properties/database", patterns.IMAGE_NAME),
    (
        "/properties/accounting/properties/groupAccounts/items/properties/account",
        patterns.ACCOUNT_NAME,
    ),
    (
        "/properties/health/properties/checks/properties/gpu/properties/nvidiaSmi",
        patterns.COMMAND_LINE,
    ),
    ("/properties/health/properties/checks/properties/gpu/properties/dmesg", patterns.COMMAND_LINE),
    (
        "/properties/health/properties/checks/properties/interfaces/properties/names/items",
        patterns.INTERFACE,
    ),
    (
        "/properties/health/properties/checks/properties/interfaces/properties/rdmaDevices/items",
        patterns.RDMA_DEVICE,
    ),
    (
        "/properties/health/properties/checks/properties/storage/properties/paths/items",
        patterns.ABSOLUTE_PATH,
    ),
    (
        "/properties/health/properties/checks/properties/scratch/properties/path",
        patterns.ABSOLUTE_PATH,
    ),
    ("/properties/health/properties/checks/properties/gpu/properties/nvml", patterns.COMMAND_LINE),
    (f"{ACTIVE}/checks/properties/gpu-memory/properties/probe", patterns.COMMAND_LINE),
    (f"{ACTIVE}/commands/propertyNames", active_checks.COMMAND_NAME),
    (f"{ACTIVE}/commands/additionalProperties/properties/command", patterns.COMMAND_LINE),
]


def test_a_sites_commands_are_bounded_and_named_apart_from_slonks_checks(schema):
    commands = _at(schema, f"{ACTIVE}/commands")
    assert commands["maxProperties"] == active_checks.MAX_COMMANDS
    assert set(commands["propertyNames"]["not"]["enum"]) == set(active_checks.ACTIVE_CHECKS)


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return json.loads((chart.default_chart() / "values.schema.json").read_text())


def _at(schema: dict[str, Any], pointer: str) -> Any:
    node: Any = schema
    for key in pointer.strip("/").split("/"):
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


@pytest.mark.parametrize(("pointer", "pattern"), SCHEMA_PATTERNS, ids=lambda x: x[-50:])
def test_the_schema_uses_the_pods_patterns(schema, pointer, pattern):
    assert _at(schema, pointer)["pattern"] == pattern
    if pattern in patterns.MAX_LENGTH:
        assert _at(schema, pointer).get("maxLength") == patterns.MAX_LENGTH[pattern]


def test_values_yaml_names_every_reserved_pool_name():
    text = (chart.default_chart() / "values.yaml").read_text()
    said = text[text.index("are reserved") - 200 : text.index("are reserved")]
    assert set(re.findall(r"`([a-z]+)`", said)) >= set(RESERVED_POOL_NAMES)


@pytest.mark.parametrize(
    "value",
    ["line\nbreak", "tab\there", "nul\x00", "del\x7f", "cr\r", 2**31, -(2**31), 1e21, float("nan")],
)
def test_unsafe_values_are_found_anywhere(value):
    path, _ = patterns.first_unsafe_value({"a": [{"b": value}]})
    assert path == "a[0].b"
    assert patterns.first_unsafe_value({"a": [{"b": "fine: text, #1", "c": 2**31 - 1}]}) is None


@pytest.mark.parametrize(
    ("slurm", "message"),
    [
        (
            {"extraLines": ["SrunPortRange=1025-1030"]},
            "slurm.extraLines[0]: SrunPortRange is set by slurmConf.SrunPortRange already",
        ),
        (
            {"slurmConf": {"SrunPortRange": None}, "extraLines": ["SrunPortRange=1025-1030"]},
            "slurm.extraLines[0]: set SrunPortRange in",
        ),
        (
            {"slurmConf": {"SrunPortRange": None, "srunportrange": "80-90"}},
            "slurm.slurmConf.srunportrange: write it SrunPortRange",
        ),
        (
            {"slurmConf": {"MaxJobCount": 5}, "extraLines": ["maxjobcount=6"]},
            "slurm.extraLines[0]: maxjobcount is set by slurmConf.MaxJobCount already",
        ),
    ],
)
def test_the_network_policies_and_slurm_agree_on_srun_ports(slurm, message):
    """The chart pins srun's ports in its policies from slurmConf.SrunPortRange: no other
    spelling or line may give Slurm other ports."""
    values = copy.deepcopy(BASE_VALUES)
    values["slurm"] = slurm
    assert message in _chart_error(values)
