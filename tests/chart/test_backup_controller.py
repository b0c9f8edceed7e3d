"""A backup slurmctld in the chart (values controller.backup): the controller's StatefulSet
runs two pods on one state claim, spread over Kubernetes nodes; Slurm lists both controllers
by their own names, and every pod's clients try both."""

from __future__ import annotations

import yaml

from slonk.config.render import conf_server
from slonk.config.spec import parse_spec

from .test_security import _container, _docs, _get, _slurm_conf
from .test_validity import _template_error

CLAIM = "slurmctld-state"
ON = {"controller": {"persistence": {"existingClaim": CLAIM}, "backup": {"enabled": True}}}
DOMAIN = "hpc.svc.cluster.local"
SERVERS = f"slonk-controller-0.slonk-pods.{DOMAIN}:6817,slonk-controller-1.slonk-pods.{DOMAIN}:6817"


def _env(docs, statefulset: str) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in _container(docs, statefulset)["env"]}


def test_off_by_default_one_controller_behind_its_service():
    docs = _docs()
    controller = _get(docs, "StatefulSet", "slonk-controller")["spec"]
    assert controller["replicas"] == 1
    assert "topologySpreadConstraints" not in controller["template"]["spec"]
    assert not [
        d
        for d in docs
        if d["kind"] == "PodDisruptionBudget" and "controller" in d["metadata"]["name"]
    ]
    hosts = [line for line in _slurm_conf(docs) if line.startswith("SlurmctldHost")]
    assert hosts == [f"SlurmctldHost=slonk-controller-0(slonk-controller.{DOMAIN})"]
    assert not any(line.startswith("SlurmctldTimeout") for line in _slurm_conf(docs))
    assert _env(docs, "slonk-controller")["SLURM_CONF_SERVER"] == f"slonk-controller.{DOMAIN}:6817"


def test_two_controllers_on_one_claim_on_different_nodes():
    docs = _docs(ON)
    controller = _get(docs, "StatefulSet", "slonk-controller")["spec"]
    assert controller["replicas"] == 2
    assert "volumeClaimTemplates" not in controller
    pod = controller["template"]["spec"]
    state = next(v for v in pod["volumes"] if v["name"] == "state")
    assert state == {"name": "state", "persistentVolumeClaim": {"claimName": CLAIM}}
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "DoNotSchedule"
    assert spread["nodeTaintsPolicy"] == "Honor"  # a tainted node is no place to spread to
    assert spread["labelSelector"]["matchLabels"] == controller["selector"]["matchLabels"]
    budget = _get(docs, "PodDisruptionBudget", "slonk-controller")["spec"]
    assert budget == {"maxUnavailable": 1, "selector": controller["selector"]}


def test_slurm_lists_both_and_every_client_tries_both():
    docs = _docs(
        {
            **ON,
            "controller": {**ON["controller"], "backup": {"enabled": True, "takeoverSeconds": 7}},
        }
    )
    conf = _slurm_conf(docs)
    assert [line for line in conf if line.startswith("SlurmctldHost")] == [
        f"SlurmctldHost=slonk-controller-{i}(slonk-controller-{i}.slonk-pods.{DOMAIN})"
        for i in (0, 1)
    ]
    assert "SlurmctldTimeout=7" in conf
    spec = parse_spec(
        yaml.safe_load(_get(docs, "ConfigMap", "slonk-cluster")["data"]["cluster.yaml"])
    )
    assert spec.controller_names == ("slonk-controller-0", "slonk-controller-1")
    # The pods' environment (kubectl exec sessions) and slonk init's, from one rule each.
    assert conf_server(spec) == SERVERS
    for statefulset in ("slonk-controller", "slonk-login", "slonk-cpu"):
        assert _env(docs, statefulset)["SLURM_CONF_SERVER"] == SERVERS, statefulset


def test_a_backup_without_a_shared_claim_is_refused(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"controller": {"backup": {"enabled": True}}}))
    error = _template_error("-f", str(values))
    assert "controller.backup.enabled: both controllers must mount one state volume" in error
    assert "controller.persistence.existingClaim" in error


def test_takeover_seconds_is_bounded(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                **ON,
                "controller": {
                    **ON["controller"],
                    "backup": {"enabled": True, "takeoverSeconds": 3},
                },
            }
        )
    )
    assert "takeoverSeconds" in _template_error("-f", str(values))
