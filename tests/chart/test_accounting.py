"""Accounting in the chart: slurmdbd's pod, the chart's MariaDB or a site's database, the
password Secret made once and kept, and who may reach either."""

from __future__ import annotations

import base64
import re

import pytest
import yaml

from slonk.base import paths
from slonk.config.spec import parse_spec

from .netpol import allowed
from .test_security import BASE, DNS, OUTSIDE, STRANGER, _container, _docs, _get, _pods, _policies
from .test_validity import _template_error

EXTERNAL = {
    "accounting": {
        "database": {
            "host": "mariadb.db.example.org",
            "port": 3307,
            "passwordSecret": "site-accounting-db",
            "tls": {"enabled": True, "caSecret": "site-accounting-ca"},
        }
    }
}


@pytest.fixture(scope="module")
def docs():
    return _docs()


@pytest.fixture(scope="module")
def external_docs():
    return _docs(EXTERNAL)


def _names(docs, kind):
    return sorted(d["metadata"]["name"] for d in docs if d["kind"] == kind)


def _mounts(container):
    return {m["name"]: m["mountPath"] for m in container["volumeMounts"]}


def _volumes(docs, statefulset):
    spec = _get(docs, "StatefulSet", statefulset)["spec"]["template"]["spec"]
    return {v["name"]: v for v in spec["volumes"]}


def test_slurmdbd_and_the_database_run_by_default(docs):
    slurmdbd = _container(docs, "slonk-slurmdbd")
    assert slurmdbd["command"] == ["slonk", "init", "--role", "slurmdbd"]
    assert slurmdbd["image"].startswith("localhost/slonk/controller:")
    assert slurmdbd["ports"] == [{"name": "slurmdbd", "containerPort": 6819}]
    assert _mounts(slurmdbd) == {
        "cluster": str(paths.CLUSTER_SPEC.parent),
        "munge-key": str(paths.MUNGE_SECRET.parent),
        "password": str(paths.ACCOUNTING_PASSWORD.parent),
    }
    volumes = _volumes(docs, "slonk-slurmdbd")
    assert volumes["munge-key"]["secret"]["secretName"] == "slonk-munge"  # the controller's
    password = {"secretName": "slonk-accounting-db", "defaultMode": 0o400}
    assert volumes["password"]["secret"] == password
    mariadb = _container(docs, "slonk-mariadb")
    assert mariadb["command"] == ["slonk", "init", "--role", "database"]
    assert mariadb["image"].startswith("localhost/slonk/database:")
    assert _mounts(mariadb) == {
        "cluster": str(paths.CLUSTER_SPEC.parent),
        "password": str(paths.ACCOUNTING_PASSWORD.parent),
        "data": str(paths.DATABASE_DATA),
    }
    service = _get(docs, "Service", "slonk-slurmdbd")["spec"]
    assert service["ports"] == [{"name": "slurmdbd", "port": 6819, "targetPort": "slurmdbd"}]
    assert service["selector"]["app.kubernetes.io/component"] == "slurmdbd"
    service = _get(docs, "Service", "slonk-mariadb")["spec"]
    assert service["ports"] == [{"name": "mysql", "port": 3306, "targetPort": "mysql"}]
    cluster = _get(docs, "ConfigMap", "slonk-cluster")["data"]["cluster.yaml"]
    spec = parse_spec(yaml.safe_load(cluster))
    assert spec.accounting is not None
    assert spec.accounting.host == "slonk-slurmdbd.hpc.svc.cluster.local"
    assert spec.accounting.database.host == "slonk-mariadb.hpc.svc.cluster.local"


def test_the_generated_password_is_kept(docs):
    secret = _get(docs, "Secret", "slonk-accounting-db")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password)
    text = (paths.chart_dir() / "templates" / "accounting.yaml").read_text()
    assert 'include "slonk.keptSecret" (dict "root" . "name" $password' in text  # made once


@pytest.mark.parametrize("statefulset", ["slonk-slurmdbd", "slonk-mariadb"])
def test_accounting_pods_keep_only_what_their_daemons_need(docs, statefulset):
    context = _container(docs, statefulset)["securityContext"]
    assert context == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": BASE},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod = _get(docs, "StatefulSet", statefulset)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False


def test_pod_settings_come_from_values():
    values = {
        "accounting": {
            "slurmdbd": {
                "resources": {"requests": {"cpu": "1"}},
                "priorityClassName": "accounting",
                "nodeSelector": {"pool": "services"},
                "tolerations": [{"key": "services", "operator": "Exists"}],
            },
            "database": {
                "resources": {"limits": {"memory": "8Gi"}},
                "affinity": {"podAntiAffinity": {}},
                "persistence": {"size": "1Ti", "storageClass": "fast"},
            },
        }
    }
    docs = _docs(values)
    dbd = _get(docs, "StatefulSet", "slonk-slurmdbd")["spec"]["template"]["spec"]
    # Merged over the defaults, as every values map is.
    assert dbd["containers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "256Mi"}
    assert dbd["priorityClassName"] == "accounting"
    assert dbd["nodeSelector"] == {"pool": "services"}
    assert dbd["tolerations"] == [{"key": "services", "operator": "Exists"}]
    maria = _get(docs, "StatefulSet", "slonk-mariadb")["spec"]
    assert maria["template"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "8Gi"}
    assert maria["template"]["spec"]["affinity"] == {"podAntiAffinity": {}}
    claim = maria["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == "fast"
    assert claim["resources"]["requests"]["storage"] == "1Ti"


def test_a_sites_database_over_tls(external_docs):
    docs = external_docs
    assert "slonk-mariadb" not in _names(docs, "StatefulSet") + _names(docs, "Service")
    assert "slonk-accounting-db" not in _names(docs, "Secret")
    slurmdbd = _container(docs, "slonk-slurmdbd")
    assert _mounts(slurmdbd)["database-ca"] == str(paths.ACCOUNTING_CA.parent)
    volumes = _volumes(docs, "slonk-slurmdbd")
    assert volumes["password"]["secret"]["secretName"] == "site-accounting-db"
    assert volumes["database-ca"]["secret"]["secretName"] == "site-accounting-ca"
    cluster = yaml.safe_load(_get(docs, "ConfigMap", "slonk-cluster")["data"]["cluster.yaml"])
    assert cluster["accounting"]["database"] == {
        "host": "mariadb.db.example.org", "port": 3307, "name": "slurm_acct_db",
        "user": "slurm", "tls": True,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--set", "accounting.database.host=db.example.org"],
            "accounting.database.passwordSecret: required with accounting.database.host "
            '"db.example.org"',
        ),
        (
            ["--set", "accounting.database.host=db.example.org", "--set",
             "accounting.database.passwordSecret=pw", "--set",
             "accounting.database.tls.enabled=true"],
            "accounting.database.tls.caSecret: required with accounting.database.tls.enabled",
        ),
        (
            ["--set", "accounting.database.tls.enabled=true", "--set",
             "accounting.database.tls.caSecret=ca"],
            "accounting.database.tls.enabled: only for a site's database",
        ),
        (
            ["--set", "accounting.database.name=x;drop"],
            "/accounting/database/name",
        ),
    ],
)  # fmt: skip
def test_bad_accounting_values_fail_naming_the_key(args, message):
    assert message in _template_error(*args)


def test_accounting_off_makes_nothing_of_it():
    docs = _docs({"accounting": {"enabled": False}})
    everything = " ".join(d["metadata"]["name"] for d in docs)
    assert "slurmdbd" not in everything and "mariadb" not in everything
    cluster = yaml.safe_load(_get(docs, "ConfigMap", "slonk-cluster")["data"]["cluster.yaml"])
    assert "accounting" not in cluster


FLOWS = [
    # slurmdbd: slurmctld, and sacct/sacctmgr/sshare on the login pods and in jobs.
    ("controller", "slurmdbd", 6819, True),
    ("login", "slurmdbd", 6819, True),
    ("cpu", "slurmdbd", 6819, True),
    ("login", "slurmdbd", 22, False),
    ("stranger", "slurmdbd", 6819, False),
    ("outside", "slurmdbd", 6819, False),
    # MariaDB: slurmdbd alone.
    ("slurmdbd", "mariadb", 3306, True),
    ("controller", "mariadb", 3306, False),
    ("login", "mariadb", 3306, False),
    ("cpu", "mariadb", 3306, False),
    ("stranger", "mariadb", 3306, False),
    # Their own way out: DNS, and slurmdbd to its database only.
    ("slurmdbd", "dns", 53, True),
    ("slurmdbd", "outside", 443, False),
    ("slurmdbd", "outside", 3306, False),
    # slurmdbd sends slurmctld every association change; slurmctld asks for none it lacks.
    ("slurmdbd", "controller", 6817, True),
    ("slurmdbd", "controller", 22, False),
    ("mariadb", "outside", 443, False),
    ("mariadb", "dns", 53, False),
]


def _endpoint(docs, name):
    return {"outside": OUTSIDE, "stranger": STRANGER, "dns": DNS}.get(name) or _pods(docs)[name]


@pytest.mark.parametrize(("source", "destination", "port", "expected"), FLOWS)
def test_who_may_reach_accounting(docs, source, destination, port, expected):
    src, dst = _endpoint(docs, source), _endpoint(docs, destination)
    assert allowed(_policies(docs), src, dst, port, "TCP") is expected


def test_slurmdbd_reaches_a_sites_database_on_its_port(external_docs):
    pods = _pods(external_docs)
    policies = _policies(external_docs)
    assert allowed(policies, pods["slurmdbd"], OUTSIDE, 3307, "TCP")
    assert not allowed(policies, pods["slurmdbd"], OUTSIDE, 3306, "TCP")
    assert not allowed(policies, pods["login"], OUTSIDE, 3307, "TCP")


def test_every_accounting_pod_is_selected_by_a_policy(docs):
    pods = _pods(docs)
    for name in ("slurmdbd", "mariadb"):
        assert not allowed(_policies(docs), STRANGER, pods[name], 1234), name
