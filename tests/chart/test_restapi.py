"""The REST API in the chart (values: restapi): slurmrestd's pod with no secret and the
fewest capabilities, the JWT key made once and kept for slurmctld and slurmdbd alone, users'
tokens in Slurm's configuration, and who may reach the API."""

from __future__ import annotations

import base64

import pytest
import yaml

from slonk.base import paths
from slonk.config.spec import parse_spec
from slonk.kube import chart

from .netpol import Endpoint, allowed
from .test_security import OUTSIDE, STRANGER, _container, _docs, _get, _pods, _policies, _slurm_conf
from .test_validity import _template_error

ON = {"restapi": {"enabled": True, "fromNamespaces": ["portal"]}}
PORTAL = Endpoint("10.244.7.7", "portal", {"app": "ondemand"})


@pytest.fixture(scope="module")
def docs():
    return _docs(ON)


def _mounts(docs, statefulset: str) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in _container(docs, statefulset)["volumeMounts"]}


def test_off_by_default_with_nothing_rendered():
    docs = _docs()
    assert not [
        d for d in docs if "restapi" in d["metadata"]["name"] or "jwt" in d["metadata"]["name"]
    ]
    assert not any(line.startswith("AuthAlt") for line in _slurm_conf(docs))
    assert "jwt-key" not in _mounts(docs, "slonk-controller")


def test_slurmrestd_runs_with_no_secret_and_three_capabilities(docs):
    container = _container(docs, "slonk-restapi")
    assert container["command"] == ["slonk", "init", "--role", "restapi"]
    assert container["image"].startswith("localhost/slonk/controller:")
    assert container["ports"] == [{"name": "http", "containerPort": 6820}]
    assert _mounts(docs, "slonk-restapi") == {"cluster": str(paths.CLUSTER_SPEC.parent)}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["KILL", "SETGID", "SETUID"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod = _get(docs, "StatefulSet", "slonk-restapi")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    service = _get(docs, "Service", "slonk-restapi")["spec"]
    assert service["ports"] == [{"name": "http", "port": 6820, "targetPort": "http"}]
    spec = parse_spec(
        yaml.safe_load(_get(docs, "ConfigMap", "slonk-cluster")["data"]["cluster.yaml"])
    )
    assert spec.restapi is not None and spec.restapi.port == 6820


def test_the_jwt_key_is_made_once_kept_and_given_to_its_verifiers_alone(docs):
    secret = _get(docs, "Secret", "slonk-jwt")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(secret["data"]["jwt_hs256.key"])) == 32
    text = (paths.chart_dir() / "templates" / "secrets.yaml").read_text()
    assert '"key" "jwt_hs256.key" "value" (randBytes 32)' in text  # slonk.keptSecret: kept
    for statefulset in ("slonk-controller", "slonk-slurmdbd"):
        assert _mounts(docs, statefulset)["jwt-key"] == str(paths.JWT_SECRET.parent)
    for statefulset in ("slonk-login", "slonk-cpu", "slonk-restapi", "slonk-mariadb"):
        assert "jwt-key" not in _mounts(docs, statefulset), statefulset
    conf = _slurm_conf(docs)
    assert "AuthAltTypes=auth/jwt" in conf
    assert f"AuthAltParameters=jwt_key={paths.JWT_KEY},max_token_lifespan=3600" in conf
    own = _docs({"restapi": {"enabled": True, "jwt": {"existingSecret": "site-jwt"}}})
    assert not [d for d in own if d["kind"] == "Secret" and d["metadata"]["name"] == "slonk-jwt"]
    volumes = _get(own, "StatefulSet", "slonk-controller")["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "jwt-key",
        "secret": {"secretName": "site-jwt", "defaultMode": 0o400},
    } in volumes


FLOWS = [
    # Users on the login pods, and the namespaces the values name.
    ("login", "restapi", 6820, True),
    ("portal", "restapi", 6820, True),
    # Never users' jobs, anyone else in the namespace, or the outside.
    ("cpu", "restapi", 6820, False),
    ("stranger", "restapi", 6820, False),
    ("outside", "restapi", 6820, False),
    ("login", "restapi", 22, False),
    # slurmrestd passes requests to slurmctld and slurmdbd, and reaches nothing else.
    ("restapi", "controller", 6817, True),
    ("restapi", "slurmdbd", 6819, True),
    ("restapi", "mariadb", 3306, False),
    ("restapi", "cpu", 6818, False),
    ("restapi", "outside", 443, False),
]


@pytest.mark.parametrize(("source", "destination", "port", "expected"), FLOWS)
def test_who_may_reach_the_api(docs, source, destination, port, expected):
    named = {"outside": OUTSIDE, "stranger": STRANGER, "portal": PORTAL}
    src, dst = (named.get(n) or _pods(docs)[n] for n in (source, destination))
    assert allowed(_policies(docs), src, dst, port, "TCP") is expected


@pytest.mark.parametrize("key", ["AuthAltTypes", "authaltparameters"])
def test_slurm_conf_cannot_change_how_tokens_are_verified(key):
    error = _template_error("--set", f"slurm.slurmConf.{key}=auth/none")
    assert f"slurm.slurmConf.{key}: set by slonk from the spec" in error


def test_the_notes_show_how_to_call_it():
    def notes(values):
        rendered = chart.render(chart.default_chart(), values, namespace="hpc")
        return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))

    assert "REST API" not in notes({})
    said = notes(ON)
    assert "http://slonk-restapi.hpc:6820/slurm/v0.0.42/jobs" in said
    assert '"$jwt" |\n    curl -H @- http://slonk-restapi' in said  # off the command line


def test_the_release_s_own_namespace_is_refused_as_a_client():
    error = _template_error(
        "--set", "restapi.enabled=true", "--set", "restapi.fromNamespaces={portal,default}"
    )
    assert 'restapi.fromNamespaces: "default" is the release\'s own namespace' in error


def test_a_new_spec_starts_a_new_rest_pod():
    def digest(values):
        sts = _get(_docs(values), "StatefulSet", "slonk-restapi")
        return sts["spec"]["template"]["metadata"]["annotations"]["slonk.io/cluster-spec"]

    assert isinstance(digest(ON), str)  # quoted: hex digits alone would read as a number
    assert digest(ON) == digest(ON)
    assert digest(ON) != digest({**ON, "accounting": {"enabled": False}})


def test_tokens_live_at_most_the_setting():
    conf = _slurm_conf(_docs({"restapi": {"enabled": True, "maxTokenLifespanSeconds": 600}}))
    assert f"AuthAltParameters=jwt_key={paths.JWT_KEY},max_token_lifespan=600" in conf
