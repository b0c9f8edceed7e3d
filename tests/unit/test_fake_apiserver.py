"""Local mode's FAKE Kubernetes API server, in-process on 127.0.0.1 with a stub kubelet,
driven by the official Python client and by real `kubectl`."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from slonk.local import fake_apiserver

from ..support.kubeapi import KUBECTL, NAMESPACE, PDB, STS, Fake, wait_for

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="no kubectl on PATH")


@needs_kubectl
def test_kubectl_get_pods_shows_the_columns(fake: Fake):
    out = fake.kubectl("get", "pods", "-o", "wide", "-L", "slonk.io/nodepool").stdout
    print(out)
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert lines[1].split()[:3] == ["slonk-cpu-0", "1/1", "Running"]
    assert "local-slonk-cpu-0" in lines[1] and "10.1.0.2" in lines[1] and "cpu" in lines[1]
    nodes = fake.kubectl("get", "nodes").stdout
    print(nodes)
    assert nodes.splitlines()[1].split()[:2] == ["local-slonk-cpu-0", "Ready"]


@needs_kubectl
def test_kubectl_cordons_labels_annotates_and_taints_a_node(fake: Fake):
    node = "local-slonk-cpu-1"
    fake.kubectl("cordon", node)
    assert fake.node(node)["spec"]["unschedulable"] is True
    assert "Ready,SchedulingDisabled" in fake.kubectl("get", "node", node).stdout
    fake.kubectl("annotate", "node", node, "slonk.io/goal=drain", "slonk.io/goal-reason=disk")
    fake.kubectl("label", "node", node, "example.com/block=b1")
    fake.kubectl("taint", "node", node, "maintenance=now:NoSchedule")
    got = fake.node(node)
    assert got["metadata"]["annotations"]["slonk.io/goal"] == "drain"
    assert got["metadata"]["labels"]["example.com/block"] == "b1"
    assert got["metadata"]["labels"]["example.com/pool"] == "cpu"  # the pool's nodeSelector
    assert {"key": "maintenance", "value": "now", "effect": "NoSchedule"} in got["spec"]["taints"]
    fake.kubectl("uncordon", node)
    fake.kubectl("taint", "node", node, "maintenance-")
    fake.kubectl("annotate", "node", node, "slonk.io/goal-")
    got = fake.node(node)
    assert not got["spec"].get("unschedulable")
    assert not got["spec"].get("taints")
    assert "slonk.io/goal" not in got["metadata"]["annotations"]
    shown = fake.kubectl("get", "nodes", "-L", "example.com/block", "-l", "example.com/block")
    assert shown.stdout.splitlines()[1].split()[0] == node


@needs_kubectl
def test_kubectl_scales_a_statefulset_down_and_up(fake: Fake):
    fake.kubectl("scale", "statefulset", "slonk-cpu", "--replicas=1")
    wait_for("slonk-cpu-1 gone", lambda: "slonk-cpu-1" not in fake.kubectl("get", "pods").stdout)
    assert fake.kubelet.pids["slonk-cpu-1"] is None
    assert fake.kubelet.pids["slonk-cpu-0"] == 100  # untouched
    fake.kubectl("scale", "sts", "slonk-cpu", "--replicas=2")
    wait_for(
        "slonk-cpu-1 running",
        lambda: "slonk-cpu-1   1/1     Running" in fake.kubectl("get", "pods").stdout,
    )
    assert fake.kubelet.log == ["stop slonk-cpu-1", "start slonk-cpu-1"]
    events = fake.kubectl("get", "events", "--field-selector", "involvedObject.name=slonk-cpu")
    assert "SuccessfulDelete" in events.stdout and "SuccessfulCreate" in events.stdout
    refused = fake.kubectl("scale", "sts", "slonk-cpu", "--replicas=4", check=False)
    assert refused.returncode and "local mode runs at most the 3 pods" in refused.stderr
    assert fake.kubectl("get", "sts", "slonk-cpu").stdout.splitlines()[1].split()[1] == "2/2"


@needs_kubectl
def test_kubectl_delete_pod_waits_for_the_stop_and_the_statefulset_makes_it_again(fake: Fake):
    before = fake.kubectl("get", "pod", "slonk-cpu-0", "-o", "jsonpath={.metadata.uid}").stdout
    fake.kubectl("delete", "pod", "slonk-cpu-0", "--wait", "--timeout=30s")
    assert fake.kubelet.log[0] == "stop slonk-cpu-0"
    after = wait_for(
        "a new slonk-cpu-0",
        lambda: (
            fake.kubectl(
                "get", "pod", "slonk-cpu-0", "-o", "jsonpath={.metadata.uid}", check=False
            ).stdout
        ),
    )
    assert after != before
    wait_for("it runs", lambda: fake.kubelet.pids["slonk-cpu-0"] not in (None, 100))


@needs_kubectl
def test_kubectl_reads_leases_made_through_the_client(fake: Fake):
    from kubernetes import client

    leases = client.CoordinationV1Api(fake.client("controller-token"))
    leases.create_namespaced_lease(
        NAMESPACE,
        {"metadata": {"name": "slonk-syncer"}, "spec": {"holderIdentity": "controller-0"}},
    )
    out = fake.kubectl("get", "lease").stdout.splitlines()
    assert out[0].split() == ["NAME", "HOLDER", "AGE"]
    assert out[1].split()[:2] == ["slonk-syncer", "controller-0"]


def test_list_then_watch_from_its_resource_version_sees_each_change_once(fake: Fake):
    from kubernetes import client, watch

    core = client.CoreV1Api(fake.client("controller-token"))
    listed = core.list_namespaced_pod(NAMESPACE, label_selector="slonk.io/nodepool in (cpu,gpu)")
    assert [p.metadata.name for p in listed.items] == ["slonk-cpu-0", "slonk-cpu-1"]
    assert listed.items[0].spec.node_name == "local-slonk-cpu-0"
    assert listed.items[0].spec.termination_grace_period_seconds == 60
    nodes = client.CoreV1Api(fake.client())
    nodes.patch_node("local-slonk-cpu-0", {"metadata": {"labels": {"x": "1"}}})  # not a pod
    core.delete_namespaced_pod("slonk-cpu-1", NAMESPACE)
    seen = []
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        NAMESPACE,
        resource_version=listed.metadata.resource_version,
        field_selector="metadata.name=slonk-cpu-1",
        timeout_seconds=20,
    ):
        pod = event["object"]
        seen.append((event["type"], bool(pod.metadata.deletion_timestamp), pod.status.phase))
        if (
            event["type"] == "MODIFIED"
            and pod.status.phase == "Running"
            and not (pod.metadata.deletion_timestamp)
        ):
            break
    assert seen == [
        ("MODIFIED", True, "Running"),  # terminating
        ("DELETED", True, "Running"),
        ("ADDED", False, "Pending"),  # its StatefulSet made it again
        ("MODIFIED", False, "Running"),  # kubelet started it
    ]


def test_a_watch_from_a_forgotten_resource_version_gets_410(tmp_path: Path):
    from kubernetes import client, watch
    from kubernetes.client.rest import ApiException

    fake = Fake(tmp_path, history=3)
    try:
        core = client.CoreV1Api(fake.client())
        old = core.list_node().metadata.resource_version
        for n in range(4):
            core.patch_node("local-slonk-cpu-0", {"metadata": {"labels": {"n": str(n)}}})
        with pytest.raises(ApiException) as gone:
            list(watch.Watch().stream(core.list_node, resource_version=old, timeout_seconds=5))
        assert gone.value.status == 410
    finally:
        fake.close()


def test_an_update_from_a_stale_read_is_refused_409(fake: Fake):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    leases = client.CoordinationV1Api(fake.client("controller-token"))
    made = leases.create_namespaced_lease(
        NAMESPACE, {"metadata": {"name": "slonk-syncer"}, "spec": {"holderIdentity": "a"}}
    )
    made.spec.holder_identity = "b"
    leases.replace_namespaced_lease("slonk-syncer", NAMESPACE, made)
    made.spec.holder_identity = "c"
    with pytest.raises(ApiException) as stale:
        leases.replace_namespaced_lease("slonk-syncer", NAMESPACE, made)
    assert stale.value.status == 409
    assert json.loads(stale.value.body)["reason"] == "Conflict"
    assert leases.read_namespaced_lease("slonk-syncer", NAMESPACE).spec.holder_identity == "b"


def test_leader_election_through_a_lease_lock(fake: Fake):
    from kubernetes import client
    from kubernetes.leaderelection import electionconfig, leaderelection
    from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

    api = client.CoordinationV1Api(fake.client("controller-token"))
    leading = {"a": threading.Event(), "b": threading.Event()}
    release = threading.Event()

    def candidate(name: str) -> None:
        lock = LeaseLock("slonk-syncer", NAMESPACE, name)
        lock.api_instance = api

        def lead() -> None:
            leading[name].set()
            release.wait(60)
            raise RuntimeError("stepping down")  # stops renewing: the other may take over

        config = electionconfig.Config(lock, 3, 2, 1, lead, lambda: None)
        leaderelection.LeaderElection(config).run()

    candidates = [threading.Thread(target=candidate, args=(n,), daemon=True) for n in "ab"]
    candidates[0].start()
    assert leading["a"].wait(30)
    candidates[1].start()
    first = api.read_namespaced_lease("slonk-syncer", NAMESPACE).spec.renew_time
    # a renews (the lease moves on) while b only tries: b never leads meanwhile.
    wait_for(
        "a renewal by a",
        lambda: api.read_namespaced_lease("slonk-syncer", NAMESPACE).spec.renew_time != first,
    )
    assert not leading["b"].is_set()
    assert api.read_namespaced_lease("slonk-syncer", NAMESPACE).spec.holder_identity == "a"
    release.set()
    assert leading["b"].wait(30)
    assert api.read_namespaced_lease("slonk-syncer", NAMESPACE).spec.holder_identity == "b"
    # Each stops renewing once its leading raised: gone before the fake API server is, or
    # one still renewing raises in its thread, under a later test's name (a clean-clone run).
    for thread in candidates:
        thread.join(30)
        assert not thread.is_alive()


def test_the_three_patch_types(fake: Fake):
    from kubernetes import client

    core = client.CoreV1Api(fake.client())
    node = "local-slonk-cpu-0"
    # strategic: conditions merge by type (the Ready condition stays)
    core.patch_node_status(
        node,
        {
            "status": {
                "conditions": [{"type": "GPUProblem", "status": "True", "reason": "XidError"}]
            }
        },
    )
    types = {c.type: c.status for c in core.read_node(node).status.conditions}
    assert types == {"Ready": "True", "GPUProblem": "True"}
    # merge: a null removes a key, a list is replaced whole
    core.patch_node(
        node,
        {"metadata": {"labels": {"kubernetes.io/os": None}}},
        _content_type="application/merge-patch+json",
    )
    assert "kubernetes.io/os" not in core.read_node(node).metadata.labels
    # JSON patch, guarded by a test
    ops = [
        {"op": "test", "path": "/metadata/labels/kubernetes.io~1arch", "value": "amd64"},
        {"op": "add", "path": "/spec/unschedulable", "value": True},
    ]
    core.patch_node(node, ops, _content_type="application/json-patch+json")
    assert core.read_node(node).spec.unschedulable is True
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as failed:
        core.patch_node(
            node,
            [{"op": "test", "path": "/spec/unschedulable", "value": False}],
            _content_type="application/json-patch+json",
        )
    assert failed.value.status == 422
    # the main resource leaves status alone
    core.patch_node(node, {"status": {"conditions": []}})
    assert len(core.read_node(node).status.conditions) == 2


def test_every_kind_reads_back_through_the_clients_models(fake: Fake):
    from kubernetes import client

    admin = fake.client()
    apps, policy = client.AppsV1Api(admin), client.PolicyV1Api(admin)
    sts = wait_for(
        "a ready StatefulSet",
        lambda: (
            (s := apps.read_namespaced_stateful_set("slonk-cpu", NAMESPACE)).status.ready_replicas
            == 2
            and s
        ),
    )
    assert sts.spec.replicas == 2 and sts.status.replicas == 2
    scale = apps.read_namespaced_stateful_set_scale("slonk-cpu", NAMESPACE)
    assert (scale.spec.replicas, scale.status.selector) == (
        2,
        "app.kubernetes.io/component=worker,app.kubernetes.io/instance=slonk,slonk.io/nodepool=cpu",
    )
    pdb = wait_for(
        "the budget's status",
        lambda: (
            (
                p := policy.read_namespaced_pod_disruption_budget("slonk-cpu", NAMESPACE)
            ).status.current_healthy
            == 2
            and p
        ),
    )
    assert pdb.status.disruptions_allowed == 1
    core = client.CoreV1Api(admin)
    assert [n.metadata.name for n in core.list_namespace().items] == [NAMESPACE]
    core.create_namespaced_event(
        NAMESPACE,
        {
            "metadata": {"generateName": "slonk-cpu-0."},
            "reason": "Drained",
            "type": "Normal",
            "message": "slonk:k8s:cordoned",
            "involvedObject": {"kind": "Pod", "name": "slonk-cpu-0"},
        },
    )
    events = core.list_namespaced_event(NAMESPACE, field_selector="involvedObject.name=slonk-cpu-0")
    assert [e.reason for e in events.items] == ["Drained"]
    client.EventsV1Api(admin).create_namespaced_event(
        NAMESPACE,
        {
            "metadata": {"name": "e1"},
            "reason": "Lent",
            "type": "Normal",
            "action": "Scale",
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "slonk",
            "reportingInstance": "syncer",
            "regarding": {"kind": "Pod", "name": "slonk-cpu-1"},
        },
    )
    # (Only events.k8s.io's own: the client's model refuses a core Event, which has no
    # eventTime, as it does against a real API server.)
    lent = client.EventsV1Api(admin).list_namespaced_event(
        NAMESPACE, field_selector="regarding.name=slonk-cpu-1"
    )
    assert [e.reason for e in lent.items] == ["Lent"]


def test_an_eviction_honours_the_disruption_budget(fake: Fake):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core, policy = client.CoreV1Api(fake.client()), client.PolicyV1Api(fake.client())
    wait_for(
        "the budget's status",
        lambda: (
            policy.read_namespaced_pod_disruption_budget(
                "slonk-cpu", NAMESPACE
            ).status.disruptions_allowed
            == 1
        ),
    )
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "slonk-cpu-1", "namespace": NAMESPACE},
    }
    core.create_namespaced_pod_eviction("slonk-cpu-1", NAMESPACE, eviction)
    # slonk-cpu-1 is down (terminating, then Pending): the budget is spent for slonk-cpu-0.
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod_eviction(
            "slonk-cpu-0",
            NAMESPACE,
            {**eviction, "metadata": {"name": "slonk-cpu-0", "namespace": NAMESPACE}},
        )
    assert refused.value.status == 429
    assert "disruption budget" in json.loads(refused.value.body)["message"]


def test_rbac_refuses_what_no_rule_grants(fake: Fake):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    controller = fake.client("controller-token")
    core, apps = client.CoreV1Api(controller), client.AppsV1Api(controller)
    core.read_namespaced_pod("slonk-cpu-0", NAMESPACE)  # granted
    core.patch_node("local-slonk-cpu-0", {"metadata": {"annotations": {"a": "b"}}})  # granted
    refusals = [
        lambda: core.list_node(),  # list not granted on nodes
        lambda: core.patch_namespaced_pod("slonk-cpu-0", NAMESPACE, {"metadata": {}}),
        lambda: apps.patch_namespaced_stateful_set_scale(  # the subresource is not granted
            "slonk-cpu", NAMESPACE, {"spec": {"replicas": 1}}
        ),
        lambda: core.create_namespaced_pod_eviction(
            "slonk-cpu-0", NAMESPACE, {"metadata": {"name": "slonk-cpu-0"}}
        ),
        lambda: core.list_namespaced_pod("kube-system"),  # the Role holds in its namespace only
        lambda: client.CoordinationV1Api(controller).delete_namespaced_lease("x", NAMESPACE),
    ]
    for refused in refusals:
        with pytest.raises(ApiException) as caught:
            refused()
        assert caught.value.status == 403, caught.value.body
        assert (
            "system:serviceaccount:default:slonk-controller"
            in json.loads(caught.value.body)["message"]
        )
    # an account with no rules (the login pod's, had it a token) may do nothing
    with pytest.raises(ApiException) as caught:
        client.CoreV1Api(fake.client("login-token")).read_namespaced_pod("slonk-cpu-0", NAMESPACE)
    assert caught.value.status == 403


def _raw(
    fake: Fake,
    method: str,
    path: str,
    token: str | None = "admin-token",
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    import http.client
    import ssl

    context = ssl.create_default_context(cafile=str(fake.cluster.apiserver_dir / "tls.crt"))
    connection = http.client.HTTPSConnection("127.0.0.1", fake.port, context=context, timeout=30)
    sent = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    connection.request(method, path, body=body, headers=sent)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data) if data.strip() else {}


def test_from_the_attackers_side(fake: Fake):
    pod = "/api/v1/namespaces/default/pods/slonk-cpu-0"
    assert _raw(fake, "GET", pod, token=None)[0] == 401
    assert _raw(fake, "GET", pod, token="guessed")[0] == 401
    assert _raw(fake, "GET", pod, headers={"Authorization": "Basic YWRtaW46YWRtaW4="})[0] == 401
    for name in ("..%2F..%2Fconfig.json", "%2E%2E", "a%2Fb", "UPPER", "x" * 300):
        code, status = _raw(fake, "GET", f"/api/v1/nodes/{name}")
        assert code == 400 and status["kind"] == "Status", name
    code, _ = _raw(
        fake,
        "PATCH",
        "/api/v1/nodes/..%2F..%2Fapiserver%2Fconfig",
        body=b"{}",
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert code == 400
    huge = b"{" + b" " * (4 * 1024 * 1024) + b"}"
    code, status = _raw(
        fake,
        "PATCH",
        "/api/v1/nodes/local-slonk-cpu-0",
        body=huge,
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert code == 413 and status["reason"] == "RequestEntityTooLarge"
    code, status = _raw(
        fake,
        "PATCH",
        "/api/v1/nodes/local-slonk-cpu-0",
        body=b"{not json",
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert code == 400
    # nothing outside the fake's folder appeared, and the config was not touched
    assert sorted(p.name for p in fake.cluster.apiserver_dir.iterdir()) == [
        "chart.json",
        "config.json",
        "nodes",
        "tls.crt",
        "tls.key",
    ]
    # a pod's spec is the chart's: no one changes it through the API
    code, status = _raw(
        fake,
        "PATCH",
        pod,
        body=json.dumps({"spec": {"containers": [{"name": "slurmd", "image": "evil"}]}}).encode(),
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert code == 422, status


@needs_kubectl
def test_a_pod_made_again_on_a_cordoned_node_waits_pending_until_uncordoned(fake: Fake):
    """Each local pod has one Node: the scheduler would not place it elsewhere."""
    fake.kubectl("cordon", "local-slonk-cpu-1")
    fake.kubectl("delete", "pod", "slonk-cpu-1", "--wait", "--timeout=30s")
    pod = wait_for(
        "slonk-cpu-1 made again",
        lambda: fake.kubectl("get", "pod", "slonk-cpu-1", "-o", "json", check=False).stdout,
    )
    found = json.loads(pod)
    assert "nodeName" not in found["spec"]
    assert found["status"]["phase"] == "Pending"
    assert found["status"]["conditions"][0]["reason"] == "Unschedulable"
    assert fake.kubelet.pids["slonk-cpu-1"] is None
    fake.kubectl("uncordon", "local-slonk-cpu-1")
    wait_for(
        "it runs on its node",
        lambda: (
            fake.kubectl(
                "get", "pod", "slonk-cpu-1", "-o", "jsonpath={.spec.nodeName} {.status.phase}"
            ).stdout
            == "local-slonk-cpu-1 Running"
        ),
    )
    assert fake.kubelet.log == ["stop slonk-cpu-1", "start slonk-cpu-1"]


def test_a_watch_with_a_selector_sees_objects_enter_and_leave_it_and_bookmarks(
    fake: Fake, monkeypatch: pytest.MonkeyPatch
):
    from kubernetes import client, watch

    from slonk.local.apiserver import http

    monkeypatch.setattr(http, "BOOKMARK_SECONDS", 0.2)
    core = client.CoreV1Api(fake.client())
    start = core.list_node(label_selector="goal").metadata.resource_version
    core.patch_node("local-slonk-cpu-1", {"metadata": {"labels": {"goal": "drain"}}})
    core.patch_node("local-slonk-cpu-1", {"metadata": {"labels": {"goal": None}}})
    seen = []
    stream = watch.Watch().stream(
        core.list_node, label_selector="goal", resource_version=start,
        allow_watch_bookmarks=True, timeout_seconds=20,
    )  # fmt: skip
    for event in stream:
        seen.append(event["type"])
        if event["type"] == "BOOKMARK":
            break
    assert seen == ["ADDED", "DELETED", "BOOKMARK"]


def test_a_published_chart_sets_the_replicas_back_as_helm_upgrade_would(fake: Fake):
    from kubernetes import client

    apps = client.AppsV1Api(fake.client())
    apps.patch_namespaced_stateful_set_scale("slonk-cpu", NAMESPACE, {"spec": {"replicas": 1}})
    wait_for("slonk-cpu-1 stopped", lambda: fake.kubelet.pids["slonk-cpu-1"] is None)
    labelled = {**STS, "metadata": {**STS["metadata"], "labels": {"release": "2"}}}
    (fake.cluster.apiserver_dir / fake_apiserver.CHART_FILE).write_text(
        json.dumps({"statefulsets": [labelled], "budgets": [PDB]})
    )
    wait_for("slonk-cpu-1 started again", lambda: fake.kubelet.pids["slonk-cpu-1"])
    sts = apps.read_namespaced_stateful_set("slonk-cpu", NAMESPACE)
    assert (sts.spec.replicas, sts.metadata.labels) == (2, {"release": "2"})


def test_an_eviction_of_a_pod_two_budgets_match_is_refused_500(fake: Fake):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    second = {**PDB, "metadata": {"name": "also-cpu"}}
    (fake.cluster.apiserver_dir / fake_apiserver.CHART_FILE).write_text(
        json.dumps({"statefulsets": [STS], "budgets": [PDB, second]})
    )
    policy = client.PolicyV1Api(fake.client())
    wait_for("the second budget", lambda: len(
        policy.list_namespaced_pod_disruption_budget(NAMESPACE).items) == 2)  # fmt: skip
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(fake.client()).create_namespaced_pod_eviction(
            "slonk-cpu-0", NAMESPACE, {"metadata": {"name": "slonk-cpu-0"}, "kind": "Eviction",
                                        "apiVersion": "policy/v1"})  # fmt: skip
    assert refused.value.status == 500
    assert fake.kubelet.log == []


def test_bad_queries_get_a_status_not_a_dropped_connection(fake: Fake):
    for query in ("watch=1&timeoutSeconds=soon", "labelSelector=a%20in%20b",
                  "fieldSelector=spec.secret%3Dx", "watch=1&resourceVersion=abc",
                  "dryRun=All"):  # fmt: skip
        code, status = _raw(fake, "GET", f"/api/v1/namespaces/default/pods?{query}")
        if code == 200:  # a watch's error comes in the stream, as the API sends it
            assert status["type"] == "ERROR" and status["object"]["code"] == 400, query
        else:
            assert code == 400 and status["kind"] == "Status", query


def test_a_watch_asked_for_as_older_clients_do_is_a_watch(fake: Fake):
    """The controller image's client (Debian's python3-kubernetes 30) sends `watch=True`."""
    for spelling in ("True", "true", "1"):
        code, event = _raw(fake, "GET", f"/api/v1/nodes?watch={spelling}&timeoutSeconds=1"
                           "&fieldSelector=metadata.name%3Dlocal-slonk-cpu-0")  # fmt: skip
        assert (code, event["type"]) == (200, "ADDED"), spelling


def _leases(fake: Fake, *names: str) -> Any:
    from kubernetes import client

    leases = client.CoordinationV1Api(fake.client())
    for name in names:
        leases.create_namespaced_lease(NAMESPACE, {"metadata": {"name": name}, "spec": {}})
    return leases


@needs_kubectl
def test_a_list_comes_in_pages_and_a_page_after_a_change_is_expired(fake: Fake):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    leases = _leases(fake, "e", "c", "a", "d", "b")
    first = leases.list_namespaced_lease(NAMESPACE, limit=2)
    assert [i.metadata.name for i in first.items] == ["a", "b"]
    assert first.metadata.remaining_item_count == 3
    second = leases.list_namespaced_lease(NAMESPACE, limit=2, _continue=first.metadata._continue)
    last = leases.list_namespaced_lease(NAMESPACE, limit=2, _continue=second.metadata._continue)
    assert [i.metadata.name for i in [*second.items, *last.items]] == ["c", "d", "e"]
    assert last.metadata._continue is None
    # kubectl pages by itself (500 a page unless told), and reads every page.
    names = fake.kubectl("get", "lease", "--chunk-size=2", "-o", "name").stdout.split()
    assert names == [f"lease.coordination.k8s.io/{n}" for n in "abcde"]
    # A change to another kind leaves the pages of this one as they were.
    client.CoreV1Api(fake.client()).patch_node(
        "local-slonk-cpu-0", {"metadata": {"annotations": {"paged": "yes"}}}
    )
    again = leases.list_namespaced_lease(NAMESPACE, limit=2, _continue=first.metadata._continue)
    assert [i.metadata.name for i in again.items] == ["c", "d"]
    # With a selector, as the API server, no count of what remains.
    chosen = leases.list_namespaced_lease(NAMESPACE, limit=2, field_selector="metadata.name!=x")
    assert chosen.metadata._continue and chosen.metadata.remaining_item_count is None
    # The fake keeps no snapshot: a page after a change to its kind is expired, as a
    # compacted one is.
    leases.delete_namespaced_lease("e", NAMESPACE)
    with pytest.raises(ApiException) as expired:
        leases.list_namespaced_lease(NAMESPACE, limit=2, _continue=first.metadata._continue)
    assert expired.value.status == 410
    for query in ("limit=-1", "limit=many", "limit=1&continue=not-a-token"):
        code, status = _raw(fake, "GET", f"/apis/coordination.k8s.io/v1/leases?{query}")
        assert (code, status["kind"]) == (400, "Status"), query


@needs_kubectl
def test_delete_options_it_would_not_honour_are_refused(fake: Fake):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    _leases(fake, "kept", "gone")
    for cascade in ("foreground", "orphan"):
        said = fake.kubectl("delete", "lease", "kept", f"--cascade={cascade}", check=False)
        assert said.returncode != 0 and "deletes in the Background only" in said.stderr
    fake.kubectl("delete", "lease", "gone")  # kubectl's default: Background
    said = fake.kubectl("delete", "pod", "slonk-cpu-0", "--grace-period=5", check=False)
    assert said.returncode != 0 and "terminationGracePeriodSeconds" in said.stderr, said.stderr
    pods = client.CoreV1Api(fake.client())
    with pytest.raises(ApiException) as refused:
        pods.delete_namespaced_pod("slonk-cpu-0", NAMESPACE, grace_period_seconds=0)
    assert refused.value.status == 400
    code, _ = _raw(fake, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/slonk-cpu-0"
                   "?propagationPolicy=Orphan")  # fmt: skip
    assert code == 400
    # An eviction's deleteOptions are DeleteOptions: the same refusals, the same preconditions.
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "slonk-cpu-0"}}
    for options, status in (
        ({"gracePeriodSeconds": 0}, 400),
        ({"dryRun": ["All"]}, 400),
        ({"preconditions": {"uid": "not-its-uid"}}, 409),
    ):
        with pytest.raises(ApiException) as refused:
            pods.create_namespaced_pod_eviction(
                "slonk-cpu-0", NAMESPACE, {**eviction, "deleteOptions": options}
            )
        assert refused.value.status == status, options
    for options in ({"preconditions": "uid"}, "Background"):  # what the client would not send
        sent = json.dumps({**eviction, "deleteOptions": options}).encode()
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/slonk-cpu-0/eviction"
        code, said = _raw(fake, "POST", path, body=sent)
        assert (code, said["kind"]) == (400, "Status"), (options, said)
    names = fake.kubectl("get", "lease,pod", "-o", "name").stdout.split()
    assert "lease.coordination.k8s.io/kept" in names and "pod/slonk-cpu-0" in names


@pytest.mark.parametrize(("metadata", "field"), [
    ({"labels": {"bad key": "x"}}, "metadata.labels"),
    ({"labels": {"k": "x" * 64}}, "metadata.labels"),
    ({"labels": {"k": "-x"}}, "metadata.labels"),
    ({"labels": {"Upper.Case/k": "x"}}, "metadata.labels"),
    ({"labels": {"/k": "x"}}, "metadata.labels"),
    ({"annotations": {"a" * 64: "x"}}, "metadata.annotations"),
    ({"annotations": {"big": "x" * (256 * 1024)}}, "metadata.annotations"),
])  # fmt: skip
def test_labels_and_annotations_the_api_server_refuses_are_refused(fake: Fake, metadata, field):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    nodes = client.CoreV1Api(fake.client())
    with pytest.raises(ApiException) as refused:
        nodes.patch_node("local-slonk-cpu-0", {"metadata": metadata})
    assert refused.value.status == 422
    assert json.loads(refused.value.body)["details"]["causes"][0]["field"] == field
    ok = {"example.org/k": "v-1.x_y", "k": ""}
    nodes.patch_node("local-slonk-cpu-0", {"metadata": {"labels": ok}})
    assert fake.node("local-slonk-cpu-0")["metadata"]["labels"].items() >= ok.items()


@needs_kubectl
def test_both_event_apis_serve_the_same_events(fake: Fake):
    """slonk writes core v1 Events; `kubectl events` reads events.k8s.io/v1: one store."""
    from kubernetes import client

    core = client.CoreV1Api(fake.client())
    core.create_namespaced_event(
        NAMESPACE,
        {
            "metadata": {"name": "drained"},
            "reason": "Drained",
            "type": "Normal",
            "message": "slonk:k8s:cordoned",
            "involvedObject": {"kind": "Pod", "name": "slonk-cpu-0", "namespace": NAMESPACE},
        },
    )
    client.EventsV1Api(fake.client()).create_namespaced_event(
        NAMESPACE,
        {
            "metadata": {"name": "lent"},
            "reason": "Lent",
            "type": "Normal",
            "action": "Scale",
            "note": "lent to Kubernetes",
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "slonk",
            "reportingInstance": "syncer",
            "regarding": {"kind": "Pod", "name": "slonk-cpu-1", "namespace": NAMESPACE},
        },
    )
    seen = {e.involved_object.name: e.message for e in core.list_namespaced_event(NAMESPACE).items}
    assert seen == {"slonk-cpu-0": "slonk:k8s:cordoned", "slonk-cpu-1": "lent to Kubernetes"}
    shown = fake.kubectl("events", f"--namespace={NAMESPACE}").stdout
    assert "slonk:k8s:cordoned" in shown and "lent to Kubernetes" in shown, shown
    v1 = f"/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events"
    code, drained = _raw(fake, "GET", f"{v1}/drained")
    assert code == 200 and drained["note"] == "slonk:k8s:cordoned" and "message" not in drained
    assert drained["regarding"]["name"] == "slonk-cpu-0"
    body = {"metadata": {"name": "odd"}, "message": "core v1's field, not this API's"}
    code, status = _raw(
        fake, "POST", v1,
        body=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
    )  # fmt: skip
    assert code == 400 and "message" in status["message"], status
