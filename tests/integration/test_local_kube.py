"""A real local cluster through its FAKE Kubernetes API and real `kubectl`: the pods run on
their own Nodes, the controller's ServiceAccount gets what the chart's RBAC grants and no
more, and scaling a StatefulSet stops and starts the highest ordinal's pod."""

from __future__ import annotations

import json
from pathlib import Path

from slonk.local.state import Cluster

from ..support.cluster import LocalCluster, cluster_of_its_own, wait_for

CONTROLLER = "slonk-controller-0"
WORKERS = ("slonk-cpu-0", "slonk-cpu-1")
SELECTOR = {"example.com/pool": "cpu"}
VALUES = {
    "nodepools": {"cpu": {"replicas": 2, "cpus": 2, "memoryMiB": 512, "nodeSelector": SELECTOR}},
    "login": {"replicas": 0},
    "ldap": {"dev": {"enabled": False}},
    # The Slurm pods alone: one Node each.
    "accounting": {"enabled": False},
}


class Kube(LocalCluster):
    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.local = Cluster(state_dir)

    def pods(self) -> dict[str, list[str]]:
        """`kubectl get pods -o wide`'s rows by pod name."""
        rows = self.kubectl("get", "pods", "-o", "wide").splitlines()[1:]
        return {row.split()[0]: row.split() for row in rows}


kube = cluster_of_its_own("kube", VALUES, Kube, idle=WORKERS)


def test_kubectl_shows_every_pod_running_on_its_own_node(kube: Kube) -> None:
    pods = wait_for("every pod Running", lambda: (p := kube.pods()) and all(
        row[2] == "Running" for row in p.values()) and p)  # fmt: skip
    assert sorted(pods) == sorted([CONTROLLER, *WORKERS])
    for name, row in pods.items():
        assert row[1] == "1/1" and row[5] == kube.local.address(name) and row[6] == f"local-{name}"
    labelled = kube.kubectl("get", "nodes", "-l", "example.com/pool=cpu", "-o", "name").split()
    assert labelled == [f"node/local-{w}" for w in WORKERS]


def test_the_controllers_account_has_the_charts_rights_and_no_more(kube: Kube) -> None:
    """From inside the controller pod, as the recycle loop and the syncer call it: the
    official client with the pod's ServiceAccount, over the bridge."""
    script = (
        "from kubernetes import client, config\n"
        "config.load_incluster_config()\n"
        "api = client.CoreV1Api()\n"
        "pod = api.read_namespaced_pod('slonk-cpu-0', 'default')\n"
        "print(pod.spec.node_name, pod.status.phase)\n"
        "print(len(api.list_node().items))\n"
        "try:\n"
        "    api.list_namespaced_event('default')\n"
        "except client.ApiException as err:\n"
        "    print(err.status)\n"
    )
    result = kube.local.run(CONTROLLER, ["python3", "-c", script])
    assert result.returncode == 0, result.stderr
    # Nodes for the syncer; Events it may create, never read.
    assert result.stdout.split() == ["local-slonk-cpu-0", "Running", "3", "403"]


def test_scaling_the_statefulset_stops_and_starts_the_highest_ordinal(kube: Kube) -> None:
    started = kube.slurmd_started("slonk-cpu-1")
    kube.kubectl("scale", "statefulset", "slonk-cpu", "--replicas=1")
    wait_for("slonk-cpu-1's processes gone", lambda: kube.local.pid("slonk-cpu-1") is None)
    wait_for("its pod object gone", lambda: "slonk-cpu-1" not in kube.pods())
    assert kube.local.pid("slonk-cpu-0") is not None
    assert json.loads(kube.kubectl("get", "sts", "slonk-cpu", "-o", "json"))["spec"][
        "replicas"] == 1  # fmt: skip
    kube.kubectl("scale", "statefulset", "slonk-cpu", "--replicas=2")
    wait_for(
        "a new slurmd on slonk-cpu-1 registered",
        lambda: kube.slurmd_started("slonk-cpu-1") not in ("", "0", started),
        timeout=120,
    )
    wait_for(
        "slonk-cpu-1 Running", lambda: kube.pods().get("slonk-cpu-1", [""] * 3)[2] == "Running"
    )
    kube.wait_idle(WORKERS)
