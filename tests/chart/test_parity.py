"""One contract, two readers: every cross-field rule the chart's templates enforce (a `fail`
in templates/*.tpl), the pods' spec parser enforces too, naming the same key.

Each case changes valid values so that the chart fails, and changes the cluster.yaml the chart
renders from valid values in the way the chart would have rendered the bad values without its
check; `parse_spec` must then fail naming the same key path (cluster.yaml's own path where it
differs: `slurm.slurmConf` is `slurmConf`, `ldap.dev` is `ldapServer`). Where the schema can
state a rule (a key's shape), Helm refuses through it before the templates run: the case then
checks that the schema names the key. A `fail` only the chart can check (values that never reach
cluster.yaml) is listed with the reason.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slonk.base import paths
from slonk.config import contract
from slonk.config.spec import SpecError, parse_spec
from slonk.kube import chart

from .conftest import VALUES
from .test_contract import _names

LONG = "p" * 57
POOL = {"replicas": 10, "cpus": 1, "memoryMiB": 100}
GROUP = {"name": "research", "gid": 3000}
USER = {"name": "alice", "uid": 2001, "gid": 3000, "groups": ["research"]}
MAPPING = {"group": "research", "account": "a"}
SITE_LDAP = {
    "enabled": True,
    "uris": ["ldap://ldap.example.org"],
    "userBase": "ou=people,dc=example,dc=org",
    "groupBase": "ou=groups,dc=example,dc=org",
}
# Valid values under which every key a case touches reaches cluster.yaml.
BASE: dict[str, Any] = {
    "users": [USER],
    "groups": [GROUP],
    "ldap": {"dev": {"enabled": True, "users": [USER], "groups": [GROUP]}},
}
SITE: dict[str, Any] = {"ldap": SITE_LDAP}
# Where a values key lands in cluster.yaml, where the two differ.
SPEC_PATH = {
    "slurm.slurmConf": "slurmConf",
    "slurm.extraLines": "extraLines",
    "ldap.dev.": "ldapServer.",
}

Change = Callable[[dict[str, Any]], object]


def _merge(into: dict[str, Any], change: dict[str, Any]) -> None:
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _put(change: dict[str, Any]) -> Change:
    """The same change, merged into values or into cluster.yaml."""
    return lambda document: _merge(document, change)


def _add(path: str, item: Any) -> Change:
    """Append an item to the list at a dotted path."""

    def change(document: dict[str, Any]) -> None:
        node: Any = document
        for key in path.split("."):
            node = node[key]
        node.append(copy.deepcopy(item))

    return change


def _dup(path: str, index: int = 0, **fields: Any) -> Change:
    """Append a copy of a list's item, with fields changed."""

    def change(document: dict[str, Any]) -> None:
        node: Any = document
        for key in path.split("."):
            node = node[key]
        node.append({**node[index], **fields})

    return change


# (the chart's `fail` format it exercises, base values, values change, cluster.yaml change,
# the key both errors name, as a values path)
CASES: list[tuple[str, dict[str, Any], Change, Change, str]] = [
    (
        "%s: a list, the form before chart 0.4.0; write a map keyed by name instead: %s: %s",
        BASE,
        _put({"nodepools": [{"name": "cpu", **POOL}]}),
        _put({"nodepools": [{"name": "cpu", **POOL}]}),
        "nodepools",
    ),
    (
        "nodepools.%s: %q is reserved for slonk's own pods",
        BASE,
        _put({"nodepools": {"login": POOL}}),
        _put({"nodepools": {"login": POOL}}),
        "nodepools.login",
    ),
    (
        "partitions.%s: %q is Slurm's keyword for the defaults of the partitions after it, not a "
        "partition",
        BASE,
        _put({"partitions": {"Default": {"pools": ["cpu"]}}}),
        _put({"partitions": {"Default": {"pools": ["cpu"]}}}),
        "partitions.Default",
    ),
    (
        "nodepools.%s: StatefulSet name %q is longer than 52 characters (Kubernetes would make "
        "none of its pods)",
        BASE,
        _put({"nodepools": {LONG: POOL}}),
        _put({"nodepools": {LONG: POOL}}),
        f"nodepools.{LONG}",
    ),
    (
        "nodepools.%s: %q is not a DNS-1123 label (lowercase letters, digits and '-', at most "
        "63 characters)",
        BASE,
        _put({"nodepools": {"a, namespace: x": POOL}}),
        _put({"nodepools": {"a, namespace: x": POOL}}),
        "nodepools.a, namespace: x",
    ),
    (
        "partitions.%s.pools[%d]: unknown nodepool %q",
        BASE,
        _put({"partitions": {"main": {"pools": ["tpu"]}}}),
        _put({"partitions": {"main": {"pools": ["tpu"]}}}),
        "partitions.main.pools[0]",
    ),
    (
        "partitions.%s.default: only one partition can be the default (%s is)",
        BASE,
        _put({"partitions": {"b": {"pools": ["cpu"], "default": True}}}),
        _put({"partitions": {"b": {"pools": ["cpu"], "default": True}}}),
        "partitions.main.default",
    ),
    # Without the check, the chart renders what the values say: no URI, an empty base.
    (
        "ldap.%s: required when ldap.enabled is true (or enable ldap.dev)",
        SITE,
        _put({"ldap": {"uris": []}}),
        _put({"ldap": {"uris": []}}),
        "ldap.uris",
    ),
    (
        "ldap.%s: required when ldap.enabled is true (or enable ldap.dev)",
        SITE,
        _put({"ldap": {"groupBase": ""}}),
        _put({"ldap": {"groupBase": ""}}),
        "ldap.groupBase",
    ),
    (
        "ldap.uris[%d]: %q: port %d is not a TCP port",
        SITE,
        _put({"ldap": {"uris": ["ldap://ldap.example.org:70000"]}}),
        _put({"ldap": {"uris": ["ldap://ldap.example.org:70000"]}}),
        "ldap.uris[0]",
    ),
    (
        "release name %q: must be a DNS-1123 label of at most 41 characters (it prefixes every "
        "Slurm node name, and StatefulSet names of at most 52)",
        BASE,
        _put({}),
        _put({"release": "Slonk"}),
        "release",
    ),
    (
        "slurm.extraLines[%d]: %s is set by slonk from the spec",
        BASE,
        _put({"slurm": {"extraLines": ["nodename=x"]}}),
        _put({"extraLines": ["nodename=x"]}),
        "slurm.extraLines[0]",
    ),
    (
        "slurm.extraLines[%d]: %s is set by %s already",
        BASE,
        _put({"slurm": {"extraLines": ["Prolog=/a", "prolog=/b"]}}),
        _put({"extraLines": ["Prolog=/a", "prolog=/b"]}),
        "slurm.extraLines[1]",
    ),
    (
        "%s.%s: set by slonk from the spec; change the spec instead",
        BASE,
        _put({"slurm": {"slurmConf": {"nodeName": "x"}}}),
        _put({"slurmConf": {"nodeName": "x"}}),
        "slurm.slurmConf.nodeName",
    ),
    (
        "%s.%s: set by slonk from the spec; change the spec instead",
        BASE,
        _put({"partitions": {"main": {"options": {"Nodes": "ALL"}}}}),
        _put({"partitions": {"main": {"options": {"Nodes": "ALL"}}}}),
        "partitions.main.options.Nodes",
    ),
    (
        "%s.%s: same setting as %s (Slurm ignores case)",
        BASE,
        _put({"slurm": {"slurmConf": {"MaxJobCount": 1, "maxJobCount": 2}}}),
        _put({"slurmConf": {"MaxJobCount": 1, "maxJobCount": 2}}),
        "slurm.slurmConf.maxJobCount",
    ),
    (
        "%s: the key holds a control character",
        BASE,
        _put({"slurm": {"slurmConf": {"A\nB": 1}}}),
        _put({"slurmConf": {"A\nB": 1}}),
        "slurm.slurmConf.A\nB",
    ),
    (
        "%s: %q holds a control character (a newline, tab, ...)",
        SITE,
        _put({"ldap": {"userFilter": "(uid=*)\n"}}),
        _put({"ldap": {"userFilter": "(uid=*)\n"}}),
        "ldap.userFilter",
    ),
    (
        "%s: %v is beyond 2147483647",
        BASE,
        _put({"slurm": {"slurmConf": {"MaxJobCount": 2**31}}}),
        _put({"slurmConf": {"MaxJobCount": 2**31}}),
        "slurm.slurmConf.MaxJobCount",
    ),
    (
        "accounts.maxId: must be >= %d, got %d",
        BASE,
        _put({"accounts": {"minId": 2000, "maxId": 1500}}),
        _put({"accounts": {"minId": 2000, "maxId": 1500}}),
        "accounts.maxId",
    ),
    (
        "%s: %s %d is outside %d-%d",
        BASE,
        _put({"accounts": {"maxId": 2500}}),
        _put({"accounts": {"maxId": 2500}}),
        "groups[0].gid",
    ),
    (
        "%sgroups[%d].name: duplicate group '%s'",
        BASE,
        _dup("groups", gid=3001),
        _dup("groups", gid=3001),
        "groups[1].name",
    ),
    (
        "accounting.groupAccounts[%d].group: duplicate group '%s'",
        BASE,
        _put({"accounting": {"groupAccounts": [MAPPING, {**MAPPING, "account": "b"}]}}),
        _put({"accounting": {"groupAccounts": [MAPPING, {**MAPPING, "account": "b"}]}}),
        "accounting.groupAccounts[1].group",
    ),
    (
        "accounting.database.name: %q is MariaDB's own: slurmdbd's account would rule the server",
        BASE,
        _put({"accounting": {"database": {"name": "mysql"}}}),
        _put({"accounting": {"database": {"name": "mysql"}}}),
        "accounting.database.name",
    ),
    (
        "accounting.database.user: %q is MariaDB's own: slurmdbd's account would rule the server",
        BASE,
        _put({"accounting": {"database": {"user": "root"}}}),
        _put({"accounting": {"database": {"user": "root"}}}),
        "accounting.database.user",
    ),
    (
        "%sgroups[%d].gid: duplicate gid %s",
        BASE,
        _dup("ldap.dev.groups", name="other"),
        _dup("ldapServer.groups", name="other"),
        "ldap.dev.groups[1].gid",
    ),
    (
        "%susers[%d].groups[%d]: unknown group '%s': declare it in groups",
        BASE,
        _add("users", {**USER, "name": "bob", "uid": 2002, "groups": ["ops"]}),
        _add("users", {**USER, "name": "bob", "uid": 2002, "groups": ["ops"]}),
        "users[1].groups[0]",
    ),
    (
        "%susers[%d].name: duplicate user '%s'",
        BASE,
        _dup("users", uid=2002),
        _dup("users", uid=2002),
        "users[1].name",
    ),
    (
        "%susers[%d].uid: duplicate uid %s",
        BASE,
        _dup("ldap.dev.users", name="bob"),
        _dup("ldapServer.users", name="bob"),
        "ldap.dev.users[1].uid",
    ),
    (
        "metrics.port: %d is %s's port, in the same pods",
        BASE,
        _put({"metrics": {"port": 6818}}),
        _put({"metrics": {"port": 6818}}),
        "metrics.port",
    ),
    (
        "metrics.port: %d is %s's port, in the same pods",
        BASE,
        _put({"metrics": {"port": 22}}),
        _put({"metrics": {"port": 22}}),
        "metrics.port",
    ),
]

# A `fail` that only the chart can check, and why.
CHART_ONLY = dict(
    [
        (
            "%s: %s is set by the chart",
            "labels of the PodMonitor and dashboard objects: never in cluster.yaml",
        ),
        (
            "workers.fuseResource: %q is workers.gpuResource too; name the resource of the "
            "device plugin that offers /dev/fuse",
            "the pods' resources: never in cluster.yaml",
        ),
        (
            "hooks.git.repo: required when hooks.enabled is true",
            "the repository is the git-sync sidecar's: it never reaches cluster.yaml",
        ),
        (
            "slurm.slurmConf.%s: write it SrunPortRange (the NetworkPolicies read that key)",
            "the NetworkPolicies read srun's ports; Slurm takes any case",
        ),
        (
            "slurm.extraLines[%d]: set SrunPortRange in slurm.slurmConf (the NetworkPolicies "
            "read it there)",
            "the same: only the NetworkPolicies need the key in slurmConf",
        ),
        (
            "slurm.slurmConf.SrunPortRange: %q must be FIRST-LAST (ports)",
            "the NetworkPolicies open these ports; slurmctld checks its own setting",
        ),
        (
            "slurm.slurmConf.SrunPortRange: %q must be FIRST-LAST with 1024 <= FIRST <= LAST "
            "<= 65535",
            "the same",
        ),
        (
            "login.service.loadBalancerSourceRanges: only a LoadBalancer enforces them "
            "(login.service.type is %s); remove them or restrict ssh with "
            "networkPolicy.login.sshFrom",
            "a Service setting: never in cluster.yaml",
        ),
        (
            "%s: %s is missing; every other capability is dropped, and slonk's init and its "
            "daemons need it (see values.yaml)",
            "a pod security setting: never in cluster.yaml",
        ),
        (
            "accounting.database.passwordSecret: required with accounting.database.host %q (a "
            "Secret with key `password` holding the database user's password)",
            "the password is a Secret's: it never reaches cluster.yaml",
        ),
        (
            "accounting.database.tls.caSecret: required with accounting.database.tls.enabled "
            "(a Secret with key `ca.crt` that verifies the database's certificate)",
            "the CA is a Secret's: it never reaches cluster.yaml",
        ),
        (
            "scratch: set existingClaim or nfs, not both",
            "volumes are the pods': never in cluster.yaml",
        ),
        (
            "scratch.existingClaim: %q is /home's claim (home.existingClaim); scratch is a "
            "volume of its own",
            "the same",
        ),
        (
            "controller.backup.enabled: both controllers must mount one state volume; set "
            "controller.persistence.existingClaim to a claim both can mount at once "
            "(ReadWriteMany): a volumeClaimTemplate would give each pod a volume of its own",
            "the claim is the StatefulSet's: it never reaches cluster.yaml",
        ),
        (
            "restapi.fromNamespaces: %q is the release's own namespace, where its workers run "
            "users' jobs; the login pods reach the API already",
            "the namespaces are the NetworkPolicies': they never reach cluster.yaml",
        ),
        (
            "accounting.database.tls.enabled: only for a site's database (set "
            "accounting.database.host); slurmdbd reaches the chart's MariaDB inside the cluster",
            "a choice of pods: cluster.yaml names the database's host either way",
        ),
        (
            "workers.terminationGracePeriodSeconds: removed; a worker pod's grace is now "
            "workers.drainTimeoutSeconds (for its jobs to end) + workers.stopMarginSeconds (to "
            "stop slurmd): set those instead",
            "a removed key: cluster.yaml never held it",
        ),
        (
            "metrics.serviceMonitor: removed; Prometheus now finds the exporters through a "
            "PodMonitor, metrics.podMonitor (same keys): set that instead, and check that your "
            "Prometheus selects PodMonitors (its podMonitorSelector)",
            "a removed key: cluster.yaml never held it",
        ),
    ]
)


def _spec_path(path: str) -> str:
    for values_key, spec_key in SPEC_PATH.items():
        if path.startswith(values_key):
            return spec_key + path.removeprefix(values_key)
    return path


def _cluster_yaml(values: dict[str, Any]) -> dict[str, Any]:
    rendered = chart.render(chart.default_chart(), values)
    configmap = yaml.safe_load(rendered["slonk/templates/cluster-configmap.yaml"])
    return yaml.safe_load(configmap["data"]["cluster.yaml"])


@pytest.mark.parametrize(
    ("fail", "base", "values_change", "spec_change", "key"),
    CASES,
    ids=[case[-1][:40] for case in CASES],
)
def test_the_pods_refuse_what_the_chart_refuses_naming_the_same_key(
    fail, base, values_change, spec_change, key
):
    spec = _cluster_yaml(base)
    parse_spec(spec)  # the base is valid to both

    values = copy.deepcopy(base)
    values_change(values)
    with pytest.raises(chart.ChartError) as chart_error:
        release = "Slonk" if key == "release" else "slonk"
        chart.render(chart.default_chart(), values, release=release)
    # Where the schema can say it, it refuses first, naming the key its own way.
    assert _names(str(chart_error.value), key) or f"{key} name" in str(chart_error.value), (
        chart_error.value
    )

    spec_change(spec)
    with pytest.raises(SpecError) as spec_error:
        parse_spec(spec)
    assert str(spec_error.value).startswith(f"{_spec_path(key)}: "), spec_error.value


def _fails() -> set[str]:
    """The format of every `fail` in the chart's templates."""
    found = set()
    for template in (chart.default_chart() / "templates").iterdir():
        text = template.read_text()
        found |= set(re.findall(r'\bfail \(printf "((?:[^"\\]|\\.)*)"', text))
        found |= set(re.findall(r'\bfail "((?:[^"\\]|\\.)*)"', text))
    return {f.replace('\\"', '"') for f in found}


def test_every_fail_of_the_chart_is_a_parity_case_or_chart_only():
    covered = {case[0] for case in CASES}
    assert _fails() == covered | set(CHART_ONLY)


# Mount paths: where the chart mounts what slonk's code reads (slonk.base.paths).
PATH_CONSTANTS = {
    name: value
    for name, value in vars(paths).items()
    if isinstance(value, Path) and value.is_absolute()
}
# Secrets and volumes whose files slonk reads: each a constant, or a file under one.
MOUNTED = (
    "CLUSTER_SPEC",
    "MUNGE_SECRET",
    "SSH_SECRET_DIR",
    "LDAP_ADMIN_SECRET",
    "LDAP_BIND_SECRET",
    "LDAP_CA_SECRET",
    "LDAP_DATA",
    "ACCOUNTING_PASSWORD",
    "ACCOUNTING_CA",
    "DATABASE_DATA",
    "HOME",
    "GIT_ROOT",
    "STATE_SAVE",
)
# git-sync's own files (its image reads them, not slonk).
GIT_SYNC = "git-sync"


def _mounts(values: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(container, mount path, whether the volume holds files: a Secret or a ConfigMap)."""
    docs = yaml.safe_load_all(chart.manifest(chart.render(chart.default_chart(), values)))
    found = []
    for doc in docs:
        if not doc or doc["kind"] not in ("StatefulSet", "Deployment"):
            continue
        pod = doc["spec"]["template"]["spec"]
        files = {v["name"] for v in pod.get("volumes", []) if "secret" in v or "configMap" in v}
        found += [
            (c["name"], m["mountPath"], m["name"] in files)
            for c in pod["containers"]
            for m in c.get("volumeMounts", [])
        ]
    return found


def _containers(values: dict[str, Any]) -> list[dict[str, Any]]:
    docs = yaml.safe_load_all(chart.manifest(chart.render(chart.default_chart(), values)))
    return [
        c
        for d in docs
        if d and d["kind"] in ("StatefulSet", "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]


ALL_MOUNTS = [["ldap.yaml", "hooks.yaml", "accounting-external.yaml"], ["ldap-dev.yaml"]]


@pytest.fixture(scope="module")
def every_mount() -> list[tuple[str, str, bool]]:
    """The chart's mounts with every one on: site LDAP with secrets, hooks with
    credentials, and the development directory."""
    return [
        m for files in ALL_MOUNTS for m in _mounts(chart.user_values([VALUES / f for f in files]))
    ]


def test_every_mount_slonk_reads_is_a_paths_constant(every_mount):
    """A volume is mounted at its constant; a Secret's or ConfigMap's at its constant's
    directory (the constant names the file in it)."""
    constants = {str(p) for p in PATH_CONSTANTS.values()}
    directories = {str(p.parent) for p in PATH_CONSTANTS.values()}
    mounts = set()
    for container, path, files in every_mount:
        if container == GIT_SYNC:
            continue
        mounts.add(path)
        assert path in constants or (files and path in directories), (container, path)
    for name in MOUNTED:
        constant = PATH_CONSTANTS[name]
        assert str(constant) in mounts or str(constant.parent) in mounts, name


def test_git_sync_publishes_where_slonk_reads():
    containers = _containers(chart.user_values([VALUES / "hooks.yaml"]))
    sidecar = next(c for c in containers if c["name"] == GIT_SYNC)
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["GITSYNC_ROOT"] == str(paths.GIT_ROOT)
    assert {m["mountPath"] for m in sidecar["volumeMounts"]} >= {str(paths.GIT_ROOT)}


def test_the_spec_names_the_files_the_chart_mounts():
    spec = _cluster_yaml(chart.user_values([VALUES / "ldap.yaml"]))
    assert spec["ldap"]["bindPasswordFile"] == str(paths.LDAP_BIND_SECRET)
    assert spec["ldap"]["caFile"] == str(paths.LDAP_CA_SECRET)
    rendered = chart.render(chart.default_chart(), {})
    configmap = yaml.safe_load(rendered["slonk/templates/cluster-configmap.yaml"])
    assert list(configmap["data"]) == [paths.CLUSTER_SPEC.name]


# Schema-only rules: every bound, enumeration and pattern the schema states on a key that
# reaches cluster.yaml, the pods' parser states too (the settings' own rules aside: one rule
# writes both). Each probe breaks one rule in valid values (under which every such key
# reaches cluster.yaml) and in the cluster.yaml they render.
PROBE_BASE: dict[str, Any] = {
    "users": [USER],
    "groups": [GROUP],
    "ldap": SITE_LDAP,
    "hooks": {"enabled": True, "git": {"repo": "https://git.example.org/hooks.git"}},
    "nodepools": {
        "cpu": {
            "gpus": {"count": 1, "type": "h100"},
            "weight": 1,
            "features": ["f"],
            "topology": {"switch": "s1", "block": "b1"},
        }
    },
    "partitions": {"main": {"defaultTime": 5, "priorityTier": 1, "preemptMode": "OFF"}},
    "health": {
        "active": {
            "enabled": True,
            "commands": {"diag": {"command": "dcgmi diag -r 1", "timeoutSeconds": 60}},
        },
        "trends": {"enabled": True},
    },
}
# cluster.yaml's path of a values key, where the two differ.
SPEC_KEYS = {
    "slurm.slurmctldPort": "slurmctldPort",
    "slurm.slurmdPort": "slurmdPort",
    "slurm.confinement": "confinement",
    "slurm.topology": "topology",
    "slurm.extraLines": "extraLines",
    "ldap.dev": "ldapServer",
}
# The one item a probe descends into: the example pool and partition, a list's first item.
ITEM = {"nodepools": "cpu", "partitions": "main", "commands": "diag"}


def _schema_leaves(
    schema: dict[str, Any], node: dict[str, Any], path: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], dict[str, Any]]]:
    while "$ref" in node:
        node = {
            **schema["$defs"][node["$ref"].rsplit("/", 1)[1]],
            **{k: v for k, v in node.items() if k != "$ref"},
        }
    for key, child in node.get("properties", {}).items():
        yield from _schema_leaves(schema, child, (*path, key))
    if path and path[-1] in ITEM and isinstance(node.get("additionalProperties"), dict):
        yield from _schema_leaves(schema, node["additionalProperties"], (*path, ITEM[path[-1]]))
    if isinstance(node.get("items"), dict):
        yield from _schema_leaves(schema, node["items"], (*path, 0))
    yield path, node


def _breaking(rule: dict[str, Any]) -> list[Any]:
    values: list[Any] = []
    if "minimum" in rule:
        values.append(rule["minimum"] - 1)
    if "maximum" in rule:
        values.append(rule["maximum"] + 1)
    if "exclusiveMinimum" in rule:
        values.append(rule["exclusiveMinimum"])
    if "enum" in rule:
        values.append("bogus")
    if "maxLength" in rule:
        values.append("a" * (rule["maxLength"] + 1))
    if rule.get("minItems"):
        values.append([])
    if "pattern" in rule:
        values.append("-not (this) shape-")
    return values


def _at(document: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        document = document[key]
    return document


def _spec_keys(path: tuple[str | int, ...]) -> tuple[str | int, ...]:
    dotted = ".".join(map(str, path))
    for values_key, spec_key in SPEC_KEYS.items():
        if dotted == values_key or dotted.startswith(values_key + "."):
            return (*spec_key.split("."), *path[len(values_key.split(".")) :])
    return path


def _generic(path: tuple[str | int, ...]) -> str:
    """A probe's path as a setting's values path: the example pool or partition is `*`."""
    return ".".join("*" if i and path[i - 1] in ITEM else str(key) for i, key in enumerate(path))


def _probes() -> Iterator[tuple[str, tuple[str | int, ...], tuple[str | int, ...], Any]]:
    """Every schema rule but the settings' own (written from the rules the pods apply, and
    probed without Helm in tests/unit/test_contract.py)."""
    schema = json.loads((chart.default_chart() / "values.schema.json").read_text())
    spec = _cluster_yaml(PROBE_BASE)
    generated = {setting.values for setting in contract.settings()}
    for path, rule in _schema_leaves(schema, schema):
        if _generic(path) in generated:
            continue
        spec_path = _spec_keys(path)
        try:
            _at(spec, spec_path)
        except (KeyError, IndexError, TypeError):
            continue  # never reaches cluster.yaml
        for value in _breaking(rule):
            yield ".".join(map(str, path)), path, spec_path, value


def _refused(render: Callable[[], object], error: type[Exception]) -> bool:
    try:
        render()
    except error:
        return True
    return False


def test_the_schema_and_the_pods_agree_on_every_bound():
    spec = _cluster_yaml(PROBE_BASE)
    parse_spec(spec)
    disagree, probed = [], 0
    for name, path, spec_path, value in _probes():
        values, bad_spec = copy.deepcopy(PROBE_BASE), copy.deepcopy(spec)
        node = values
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
        node[path[-1]] = value
        _at(bad_spec, spec_path[:-1])[spec_path[-1]] = value
        by_chart = _refused(
            lambda v=values: chart.render(chart.default_chart(), v), chart.ChartError
        )
        by_pods = _refused(lambda s=bad_spec: parse_spec(s), SpecError)
        probed += 1
        if by_chart != by_pods:
            disagree.append((name, value, "chart" if by_chart else "pods"))
    assert probed > 30  # the walk found the keys
    assert disagree == [], disagree
