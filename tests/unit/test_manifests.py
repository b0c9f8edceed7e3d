"""From rendered chart objects to local pods, their mounts and cluster DNS names."""

from __future__ import annotations

import pytest
import yaml

from slonk.kube import chart
from slonk.local.manifests import LocalModeError, hosts_file, plan


def _plan(values: dict | None = None):
    rendered = chart.render(chart.default_chart(), values or {})
    return plan([d for d in yaml.safe_load_all(chart.manifest(rendered)) if d], "default")


def test_every_replica_is_a_pod_with_its_role_and_mounts():
    objects = _plan()
    # Accounting's pods render first, the database first of all: local mode starts pods in
    # this order.
    assert [(p.name, p.role) for p in objects.pods] == [
        ("slonk-mariadb-0", "mariadb"),
        ("slonk-slurmdbd-0", "slurmdbd"),
        ("slonk-controller-0", "controller"),
        ("slonk-login-0", "login"),
        ("slonk-cpu-0", "worker"),
        ("slonk-cpu-1", "worker"),
    ]
    controller = objects.pod("slonk-controller-0")
    assert controller.env == {
        "POD_NAME": "slonk-controller-0",
        "POD_NAMESPACE": "default",
        "SLURM_CONF_SERVER": "slonk-controller.default.svc.cluster.local:6817",
    }
    mounts = {m.target: (m.kind, m.name, m.read_only) for m in controller.mounts}
    assert mounts == {
        "/etc/slonk": ("configmap", "slonk-cluster", True),
        "/var/run/secrets/slonk/munge": ("secret", "slonk-munge", True),
        "/home": ("claim", "slonk-home", False),
        "/var/spool/slurmctld": ("claim", "state-slonk-controller-0", False),
    }
    assert set(objects.secrets) == {"slonk-accounting-db", "slonk-munge", "slonk-ssh-host-keys"}
    assert len(objects.secrets["slonk-munge"]["munge.key"]) == 1024
    database = {m.target: (m.kind, m.name) for m in objects.pod("slonk-mariadb-0").mounts}
    assert database == {
        "/etc/slonk": ("configmap", "slonk-cluster"),
        "/var/run/secrets/slonk/accounting": ("secret", "slonk-accounting-db"),
        "/var/lib/mysql": ("claim", "data-slonk-mariadb-0"),
    }
    assert objects.pod("slonk-slurmdbd-0").image.startswith("localhost/slonk/controller:")
    assert objects.pod("slonk-mariadb-0").image.startswith("localhost/slonk/database:")


def test_nfs_home_is_refused_with_a_reason():
    with pytest.raises(LocalModeError, match="volume 'home' is nfs, which local mode cannot mount"):
        _plan({"home": {"nfs": {"server": "nfs", "path": "/export"}}})


def test_hosts_file_answers_like_cluster_dns():
    objects = _plan()
    addresses = {p.name: f"10.0.0.{i}" for i, p in enumerate(objects.pods)}
    hosts = dict(
        (line.split()[0], line.split()[1:])
        for line in hosts_file(objects, addresses, "cluster.local").splitlines()
    )
    assert hosts[addresses["slonk-controller-0"]] == [
        "slonk-controller-0",
        "slonk-controller-0.slonk-pods.default.svc.cluster.local",
        "slonk-controller",
        "slonk-controller.default.svc.cluster.local",
    ]
    assert hosts[addresses["slonk-slurmdbd-0"]] == [
        "slonk-slurmdbd-0",
        "slonk-slurmdbd-0.slonk-pods.default.svc.cluster.local",
        "slonk-slurmdbd",
        "slonk-slurmdbd.default.svc.cluster.local",
    ]
    assert hosts[addresses["slonk-cpu-0"]] == [
        "slonk-cpu-0",
        "slonk-cpu-0.slonk-pods.default.svc.cluster.local",
        "slonk-cpu-0.default.svc.cluster.local",
    ]


def test_unknown_pod():
    pods = "slonk-mariadb-0, slonk-slurmdbd-0, slonk-controller-0"
    with pytest.raises(LocalModeError, match=f"no pod 'x': pods are {pods}"):
        _plan().pod("x")


def test_pods_keep_their_addresses_when_the_pod_set_changes():
    from slonk.local.network import pod_addresses

    first = pod_addresses(["slonk-controller-0", "slonk-cpu-0", "slonk-cpu-1"], {})
    assert first == {
        "slonk-controller-0": "10.73.0.10",
        "slonk-cpu-0": "10.73.0.11",
        "slonk-cpu-1": "10.73.0.12",
    }
    # A pool that renders before the others, and one node gone: no running pod moves, and
    # the new ones take the free addresses, the one slonk-cpu-0 left first.
    kept = {n: a for n, a in first.items() if n != "slonk-cpu-0"}
    second = pod_addresses(["slonk-controller-0", "slonk-a-0", "slonk-a-1", "slonk-cpu-1"], kept)
    assert second == {
        "slonk-controller-0": "10.73.0.10",
        "slonk-a-0": "10.73.0.11",
        "slonk-a-1": "10.73.0.13",
        "slonk-cpu-1": "10.73.0.12",
    }


def test_hosts_file_answers_for_every_pod_of_a_scaled_pool():
    objects = _plan({"nodepools": {"cpu": {"replicas": 3, "cpus": 1, "memoryMiB": 256}}})
    addresses = {p.name: f"10.0.0.{i}" for i, p in enumerate(objects.pods)}
    hosts = hosts_file(objects, addresses, "cluster.local")
    assert (
        f"{addresses['slonk-cpu-2']}\tslonk-cpu-2 slonk-cpu-2.slonk-pods.default.svc.cluster.local "
        "slonk-cpu-2.default.svc.cluster.local\n" in hosts
    )


@pytest.mark.parametrize(
    "image",
    [
        "--privileged",
        "-f json",
        "localhost/slonk/worker:0.2.0\n",
        "localhost/slonk/worker --rm",
        "",
    ],
)
def test_an_object_whose_image_is_no_reference_is_refused(image):
    """Rendered objects are checked again: podman's command line would read `-…` as an
    option."""
    rendered = chart.render(chart.default_chart(), {})
    docs = [d for d in yaml.safe_load_all(chart.manifest(rendered)) if d]
    (worker,) = [d for d in docs if d["kind"] == "StatefulSet"
                 and d["metadata"]["name"] == "slonk-cpu"]  # fmt: skip
    worker["spec"]["template"]["spec"]["containers"][0]["image"] = image
    with pytest.raises(LocalModeError, match=r"StatefulSet slonk-cpu, container '.*': image "
                                             r".* is not an image reference"):  # fmt: skip
        plan(docs, "default")


def test_rbac_becomes_rules_scoped_by_their_bindings():
    """A RoleBinding holds in the release's namespace, a ClusterRoleBinding everywhere;
    the fake API server authorizes by these (apiGroups, resources, verbs as written)."""

    def doc(kind: str, name: str, **rest):
        return {"kind": kind, "metadata": {"name": name}, **rest}

    sa = [
        {"kind": "ServiceAccount", "name": "ctl", "namespace": "default"},
        {"kind": "ServiceAccount", "name": "elsewhere", "namespace": "other"},
    ]
    rules = [{"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "verbs": ["patch"]}]
    docs = [
        doc("Role", "r", rules=rules),
        doc("RoleBinding", "r", roleRef={"kind": "Role", "name": "r"}, subjects=sa),
        doc("ClusterRole", "c", rules=[{"apiGroups": [""], "resources": ["nodes"],
                                        "verbs": ["get"], "resourceNames": ["n1"]}]),
        doc("ClusterRoleBinding", "c", roleRef={"kind": "ClusterRole", "name": "c"},
            subjects=sa[:1]),
    ]  # fmt: skip
    assert plan(docs, "default").permissions() == {
        "ctl": [
            {**rules[0], "resourceNames": [], "namespace": "default"},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"],
             "resourceNames": ["n1"], "namespace": None},
        ]
    }  # fmt: skip


def test_the_statefulsets_and_budgets_are_kept_for_the_fake_api_server():
    objects = _plan()
    assert [s["metadata"]["name"] for s in objects.statefulsets] == [
        "slonk-mariadb", "slonk-slurmdbd", "slonk-controller", "slonk-login",
        "slonk-cpu"]  # fmt: skip
    # One budget for the pool's busy pods, one for the others (never both on a pod).
    assert [b["metadata"]["name"] for b in objects.disruption_budgets] == [
        "slonk-cpu", "slonk-cpu-busy"]  # fmt: skip
