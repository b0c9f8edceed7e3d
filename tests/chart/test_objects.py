"""What the chart renders for each values set: objects, counts and the wiring between them."""

from __future__ import annotations

import base64

import pytest
import yaml

from slonk.base import paths
from slonk.config.render import conf_server, render
from slonk.config.spec import parse_spec

APP_VERSION = yaml.safe_load((paths.chart_dir() / "Chart.yaml").read_text())["appVersion"]
LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)


def _names(manifest, kind: str) -> list[str]:
    return sorted(r.name for r in manifest._records if r.kind == kind)


def _container(statefulset):
    return statefulset.spec.template.spec.containers[0]


def _volume(statefulset, name: str):
    return next(v for v in statefulset.spec.template.spec.volumes if v.name == name)


def _spec(manifest):
    return parse_spec(yaml.safe_load(manifest.get("ConfigMap/slonk-cluster").data["cluster.yaml"]))


def test_defaults_render_one_cluster(default_manifest):
    m = default_manifest
    assert _names(m, "StatefulSet") == [
        "slonk-controller",
        "slonk-cpu",
        "slonk-login",
        "slonk-mariadb",
        "slonk-slurmdbd",
    ]
    assert _names(m, "Service") == [
        "slonk-controller",
        "slonk-cpu-0",
        "slonk-cpu-1",
        "slonk-login",
        "slonk-mariadb",
        "slonk-pods",
        "slonk-slurmdbd",
    ]
    assert _names(m, "Secret") == ["slonk-accounting-db", "slonk-munge", "slonk-ssh-host-keys"]
    assert _names(m, "PersistentVolumeClaim") == ["slonk-home"]
    assert _names(m, "ConfigMap") == ["slonk-cluster"]
    assert _names(m, "ServiceAccount") == ["slonk", "slonk-controller"]
    assert _names(m, "PodDisruptionBudget") == ["slonk-cpu", "slonk-cpu-busy"]
    nodes = set(_spec(m).node_names())
    for record in m._records:
        # A node's Service is its name and selector alone (tests/chart/test_node_services.py).
        labels = record.manifest["metadata"].get("labels", {})
        assert all(key in labels for key in LABELS) or record.name in nodes, record.name


def test_every_node_service_selects_its_pod(gpu_manifest):
    nodes = [n for n in _names(gpu_manifest, "Service") if n[-1].isdigit()]
    assert len(nodes) == 2 + 4 + 3
    for node in nodes:
        service = gpu_manifest.get(f"Service/{node}")
        assert service.spec.clusterIP == "None"
        assert service.spec.publishNotReadyAddresses is True
        assert service.spec.selector == {"statefulset.kubernetes.io/pod-name": node}
    assert nodes == sorted(_spec(gpu_manifest).node_names())


def test_pods_run_slonk_init_by_role(default_manifest):
    for name, role in [("controller", "controller"), ("cpu", "worker"), ("login", "login")]:
        container = _container(default_manifest.get(f"StatefulSet/slonk-{name}"))
        assert list(container.command) == ["slonk", "init", "--role", role]
        assert container.image == f"localhost/slonk/{role}:{APP_VERSION}"  # as built
        env = {e.name: e.get("value") or e.valueFrom.fieldRef.fieldPath for e in container.env}
        # Slurm runs configless: `kubectl exec` sessions fetch the configuration from where
        # `slonk init` points the pod's services (conf_server, from cluster.yaml).
        assert env == {
            "POD_NAME": "metadata.name",
            "POD_NAMESPACE": "metadata.namespace",
            "SLURM_CONF_SERVER": conf_server(_spec(default_manifest)),
        }
        mounts = {v.name: v.mountPath for v in container.volumeMounts}
        assert mounts["cluster"] == "/etc/slonk"
        assert mounts["munge-key"] == "/var/run/secrets/slonk/munge"
        assert mounts["home"] == "/home"


def test_no_pod_is_privileged_by_default(default_manifest):
    for name in ("controller", "login"):
        container = _container(default_manifest.get(f"StatefulSet/slonk-{name}"))
        assert "privileged" not in container.securityContext
    worker = _container(default_manifest.get("StatefulSet/slonk-cpu"))
    assert "privileged" not in worker.securityContext
    assert "SYS_ADMIN" in worker.securityContext.capabilities.add


def test_controller_keeps_its_state_on_a_volume(default_manifest):
    controller = default_manifest.get("StatefulSet/slonk-controller")
    mounts = {v.name: v.mountPath for v in _container(controller).volumeMounts}
    assert mounts["state"] == "/var/spool/slurmctld"
    assert controller.spec.volumeClaimTemplates[0].metadata.name == "state"


def test_generated_secrets_are_kept_and_usable(default_manifest):
    munge = default_manifest.get("Secret/slonk-munge")
    assert munge.metadata.annotations["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(munge.data["munge.key"])) == 1024
    ssh = default_manifest.get("Secret/slonk-ssh-host-keys")
    key = base64.b64decode(ssh.data["ssh_host_ecdsa_key"]).decode()
    assert key.startswith("-----BEGIN EC PRIVATE KEY-----")
    assert default_manifest.get("PersistentVolumeClaim/slonk-home").spec.accessModes == [
        "ReadWriteMany"
    ]


def test_login_service(default_manifest, gpu_manifest, nfs_manifest):
    default = default_manifest.get("Service/slonk-login").spec
    assert (default.type, default.ports[0].port, default.ports[0].targetPort) == (
        "ClusterIP",
        22,
        "ssh",
    )
    lb = gpu_manifest.get("Service/slonk-login").spec
    assert lb.type == "LoadBalancer"
    assert lb.loadBalancerSourceRanges == ["10.0.0.0/8"]
    node_port = nfs_manifest.get("Service/slonk-login").spec
    assert (node_port.type, node_port.ports[0].nodePort) == ("NodePort", 30022)
    assert nfs_manifest.get("StatefulSet/slonk-login").spec.replicas == 2


def test_gpu_pools(gpu_manifest):
    h100 = gpu_manifest.get("StatefulSet/slonk-h100")
    assert h100.spec.replicas == 4
    assert h100.spec.template.spec.nodeSelector == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"
    }
    assert h100.spec.template.spec.tolerations[0].key == "nvidia.com/gpu"
    resources = _container(h100).resources
    assert resources.limits == {"nvidia.com/gpu": 8}
    assert resources.requests == {"cpu": "96", "memory": "1048576Mi"}
    a100 = _container(gpu_manifest.get("StatefulSet/slonk-a100")).resources
    assert a100.limits == {"memory": "510Gi", "nvidia.com/gpu": 4}
    assert a100.requests == {"cpu": "60", "memory": "500Gi"}
    assert "resources" not in _container(gpu_manifest.get("StatefulSet/slonk-cpu")).resources.get(
        "limits", {}
    )
    assert _names(gpu_manifest, "PodDisruptionBudget") == [
        f"slonk-{pool}{busy}" for pool in ("a100", "cpu", "h100") for busy in ("", "-busy")
    ]


def test_configmap_spec_renders_slurm_config(gpu_manifest):
    """The chart's cluster.yaml is exactly what the init layer renders from."""
    conf = render(_spec(gpu_manifest))
    slurm = conf["slurm.conf"].splitlines()
    assert "ClusterName=gpus" in slurm
    assert "SlurmctldHost=slonk-controller-0(slonk-controller.hpc.svc.cluster.local)" in slurm
    assert (
        "NodeName=slonk-h100-[0-3] CPUs=96 RealMemory=1048576 Gres=gpu:h100:8 "
        "Features=h100,nvlink State=UNKNOWN"
    ) in slurm
    # A job of a whole node's CPUs without --mem fits either pool: a100's 524288 MiB / 64 CPUs.
    assert (
        "PartitionName=gpu Nodes=h100,a100 Default=NO MaxTime=7-00:00:00 DefMemPerCPU=8192 "
        "PriorityTier=10 State=UP"
    ) in slurm
    assert conf["gres.conf"].splitlines()[1:] == [
        # in pool name order, as Helm ranges over the nodepools map
        "NodeName=slonk-a100-[0-2] Name=gpu Type=a100 File=/dev/nvidia[0-3]",
        "NodeName=slonk-h100-[0-3] Name=gpu Type=h100 File=/dev/nvidia[0-7]",
    ]
    assert conf["topology.conf"].splitlines()[1:] == [
        "SwitchName=leaf-a Nodes=slonk-cpu-[0-1]",
        "SwitchName=leaf-b Nodes=slonk-a100-[0-2],slonk-h100-[0-3]",
        "SwitchName=slonk-spine Switches=leaf-a,leaf-b",
    ]


def test_existing_secrets_and_claims_are_used_not_made(existing_manifest):
    m = existing_manifest
    assert _names(m, "Secret") == []
    assert _names(m, "PersistentVolumeClaim") == []
    assert _names(m, "ServiceAccount") == []
    assert _names(m, "PodDisruptionBudget") == []
    assert "slonk-login" not in _names(m, "StatefulSet") + _names(m, "Service")
    controller = m.get("StatefulSet/slonk-controller")
    assert _volume(controller, "munge-key").secret.secretName == "site-munge"
    assert _volume(controller, "home").persistentVolumeClaim.claimName == "site-home"
    assert _volume(controller, "state").persistentVolumeClaim.claimName == "site-slurmctld-state"
    assert "volumeClaimTemplates" not in controller.spec
    assert controller.spec.template.spec.serviceAccountName == "site-slurm"
    worker = m.get("StatefulSet/slonk-cpu")
    assert _container(worker).securityContext == {"privileged": True}


def test_nfs_home_and_image_settings(nfs_manifest):
    worker = nfs_manifest.get("StatefulSet/slonk-cpu")
    assert _volume(worker, "home").nfs == {
        "server": "nfs.internal",
        "path": "/export/home",
        "readOnly": False,
    }
    assert _names(nfs_manifest, "PersistentVolumeClaim") == []
    assert _container(worker).image == "slonk/worker:1.2.3"
    login = nfs_manifest.get("StatefulSet/slonk-login")
    assert _volume(login, "ssh-host-keys").secret.secretName == "slonk-ssh-host-keys"


@pytest.mark.parametrize("fixture", ["default_manifest", "gpu_manifest"])
def test_workers_are_not_rolled_under_running_jobs(request, fixture):
    manifest = request.getfixturevalue(fixture)
    for name in _names(manifest, "StatefulSet"):
        if name not in ("slonk-controller", "slonk-login", "slonk-mariadb", "slonk-slurmdbd"):
            assert manifest.get(f"StatefulSet/{name}").spec.updateStrategy.type == "OnDelete"
