"""The syncer's Kubernetes side against local mode's fake API server, holding the rights the
chart's RBAC gives the controller and nothing more: watches that follow `kubectl`, the writes
it makes, and leader election through its Lease."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slonk.align import lease, lending, syncer
from slonk.align import plan as planning
from slonk.align.kube import Cluster
from slonk.config.spec import parse_spec
from slonk.kube import chart
from slonk.kube.api import KubeError
from slonk.local import manifests
from slonk.slurm import reasons, slurm_nodes
from slonk.slurm.slurm_state import NodeState

from ..support.kubeapi import NAMESPACE, Fake, wait_for


def _chart_rules() -> list[dict[str, Any]]:
    """The controller account's rules as the chart renders them (release slonk)."""
    rendered = chart.render(chart.default_chart(), {}, namespace=NAMESPACE)
    documents = [d for d in yaml.safe_load_all(chart.manifest(rendered)) if d]
    return manifests.plan(documents, NAMESPACE).permissions()["slonk-controller"]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Fake]:
    made = Fake(tmp_path, rules=_chart_rules())
    yield made
    made.close()


@pytest.fixture
def kube(api: Fake) -> Iterator[Cluster]:
    cluster = Cluster(NAMESPACE, "slonk", resync_seconds=60, api=api.client("controller-token"))
    cluster.start()
    wait_for("the first lists", lambda: cluster.synced)
    yield cluster
    cluster.stop()  # before the API server closes: its watches end quietly, not in later tests


def test_the_watches_follow_kubectl(api: Fake, kube: Cluster) -> None:
    assert set(kube.pods.snapshot()) == {"slonk-cpu-0", "slonk-cpu-1"}
    assert kube.replicas() == {"slonk-cpu": 2}
    kube.changed.clear()
    api.kubectl("cordon", "local-slonk-cpu-1")
    assert kube.changed.wait(10), "a watch event wakes the syncer"
    wait_for(
        "the cordon in the cache",
        lambda: kube.nodes.snapshot()["local-slonk-cpu-1"]["spec"].get("unschedulable"),
    )
    api.kubectl("scale", "statefulset", "slonk-cpu", "--replicas=1")
    wait_for("the new replicas", lambda: kube.replicas() == {"slonk-cpu": 1})


def test_a_pass_drains_shows_and_records(
    api: Fake, kube: Cluster, monkeypatch: pytest.MonkeyPatch, demo_spec: dict[str, Any]
) -> None:
    """Slurm scripted (no slurmctld here), the API real: a cordoned Node drains its node,
    the pods show Slurm's view, and the change is an Event on the pod."""
    demo_spec["nodepools"] = {"cpu": {"replicas": 2, "cpus": 2, "memoryMiB": 512}}
    demo_spec["partitions"] = {"main": {"pools": ["cpu"], "default": True}}
    demo_spec["namespace"] = NAMESPACE
    spec = parse_spec(demo_spec)
    nodes = {n: NodeState(n, "idle", frozenset(), "", "1") for n in ("slonk-cpu-0", "slonk-cpu-1")}
    drained: list[tuple[str, str]] = []
    monkeypatch.setattr(slurm_nodes, "read_nodes", lambda *names: list(nodes.values()))
    monkeypatch.setattr(slurm_nodes, "running_jobs", lambda: {"slonk-cpu-0": 2})
    monkeypatch.setattr(slurm_nodes, "drain", lambda n, r: drained.append((n, r)))
    monkeypatch.setattr(lending, "targets", lambda: {})
    api.kubectl("cordon", "local-slonk-cpu-1")
    wait_for(
        "the cordon seen",
        lambda: kube.nodes.snapshot()["local-slonk-cpu-1"]["spec"].get("unschedulable"),
    )
    result = syncer.pass_once(spec, kube)
    assert [(n, reasons.classify(r)) for n, r in drained] == [
        ("slonk-cpu-1", reasons.Cause(reasons.K8S, "cordoned"))
    ]
    pod = json.loads(api.kubectl("get", "pod", "slonk-cpu-0", "-o", "json").stdout)["metadata"]
    assert pod["labels"][planning.BUSY_LABEL] == "true"
    assert pod["annotations"][planning.JOBS_ANNOTATION] == "2"
    events = api.kubectl(
        "get", "events", "--field-selector", "involvedObject.name=slonk-cpu-1"
    ).stdout
    assert "SlurmDrain" in events
    # Nothing changed since: the next pass asks nothing of either side.
    wait_for(
        "the patches seen",
        lambda: "slonk.io/busy" in kube.pods.snapshot()["slonk-cpu-0"]["metadata"]["labels"],
    )
    nodes["slonk-cpu-1"] = NodeState(
        "slonk-cpu-1", "idle", frozenset({"DRAIN"}), drained[0][1], "1"
    )
    writes = kube.writes
    syncer.pass_once(spec, kube)
    wait_for(
        "slonk-cpu-1's new view seen",
        lambda: (
            kube.pods.snapshot()["slonk-cpu-1"]["metadata"]["labels"].get(planning.STATE_LABEL)
            == "drained"
        ),
    )
    writes = kube.writes
    assert not syncer.pass_once(spec, kube).drift
    assert kube.writes == writes
    assert result.drift


def test_the_chart_grants_no_more_than_the_syncer_uses(kube: Cluster) -> None:
    from kubernetes import client

    with pytest.raises(client.ApiException) as refused:
        client.CoreV1Api(kube.api_client).create_namespaced_pod(
            NAMESPACE, {"metadata": {"name": "x"}}
        )
    assert refused.value.status == 403
    with pytest.raises(client.ApiException) as other_lease:
        client.CoordinationV1Api(kube.api_client).read_namespaced_lease("someone-else", NAMESPACE)
    assert other_lease.value.status == 403, "get and update of its own Lease alone"


def _elector(api: Fake, identity: str, clock: list[float]) -> lease.Elector:
    from kubernetes import client

    coordination = client.CoordinationV1Api(api.client("controller-token"))
    return lease.Elector(
        coordination, "slonk-syncer", NAMESPACE, identity, 15, 10, 2, clock=lambda: clock[0]
    )


def test_one_leader_until_its_lease_runs_out(api: Fake) -> None:
    """Time is each candidate's own clock, moved by hand: no waiting out real durations."""
    a_clock, b_clock = [0.0], [0.0]
    a, b = _elector(api, "a", a_clock), _elector(api, "b", b_clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    b_clock[0] = 14.0
    assert a.try_acquire_or_renew()  # a renews: b sees a new renewTime, and starts over
    assert not b.try_acquire_or_renew()
    b_clock[0] = 28.0
    assert not b.try_acquire_or_renew(), "renewed 14 s ago by b's clock"
    b_clock[0] = 29.5
    assert b.try_acquire_or_renew(), "not renewed for the duration: b takes it"
    assert not a.try_acquire_or_renew()
    from kubernetes import client

    held = client.CoordinationV1Api(api.client()).read_namespaced_lease("slonk-syncer", NAMESPACE)
    assert held.spec.holder_identity == "b" and held.spec.lease_transitions == 1


def test_the_leader_stops_once_it_cannot_renew(api: Fake) -> None:
    clock = [0.0]
    elector = _elector(api, "a", clock)
    elector.retry = 0.01
    real, attempts = elector.try_acquire_or_renew, []

    def renew() -> bool:
        attempts.append(clock[0])
        if len(attempts) == 1:
            return real()
        clock[0] += 4.0  # each failed renewal costs the leader 4 s of its clock
        raise KubeError("the API is away")

    elector.try_acquire_or_renew = renew  # type: ignore[method-assign]
    forever = threading.Event()
    stopped: list[float] = []
    elector.run(lambda: forever.wait(60), lambda: stopped.append(clock[0]))
    assert stopped == [12.0], "lost once `renew` (10 s) passed without a renewal"


def test_work_that_ends_gives_the_lease_up(api: Fake) -> None:
    stopped: list[str] = []
    _elector(api, "a", [0.0]).run(lambda: None, lambda: stopped.append("lost"))
    assert stopped == ["lost"]


def test_node_events_show_in_kubectl_describe_node_and_go_nowhere_else(
    api: Fake, kube: Cluster
) -> None:
    """A drain recorded by the syncer, as node_events makes it: on the pod, and on the Node
    in `default`, where `kubectl describe node` finds it. The API refuses a Node's Event in
    another namespace, as a real one does."""
    from slonk.health import history
    from slonk.metrics import node_events

    pod = node_events.Pod.of(kube.pods.snapshot()["slonk-cpu-1"])
    event = history.Event(
        time=1_800_000_000.0,
        event="drain",
        node="slonk-cpu-1",
        machine="local-slonk-cpu-1",
        gpus=("1654000000010",),
        pod=pod.name,
        podUID=pod.uid,  # `kubectl describe pod` asks for it
        cause="gpu",
        reason="slonk:gpu: 1 of 2 GPUs visible",
    )
    assert pod.machine == event.machine
    node_events.publish(kube, [event], NAMESPACE, lambda line: pytest.fail(line))
    described = api.kubectl("describe", "node", "local-slonk-cpu-1").stdout
    assert "SlurmNodeDrained" in described and "1 of 2 GPUs visible" in described
    assert "SlurmNodeDrained" in api.kubectl("describe", "pod", "slonk-cpu-1").stdout
    (_, (_, on_node)) = node_events.bodies(event, NAMESPACE)
    on_node["metadata"]["namespace"] = "kube-public"
    with pytest.raises(KubeError, match="403"):  # the chart grants events/create in default
        kube.create_event("kube-public", on_node)
    from kubernetes import client

    admin = client.CoreV1Api(api.client())
    with pytest.raises(client.ApiException) as refused:
        admin.create_namespaced_event("kube-public", on_node)
    assert refused.value.status == 422


def test_a_pod_delete_left_unanswered_is_read_back(api: Fake) -> None:
    """The recycle loop's delete: one whose answer was lost (a timeout) but which was done
    counts as done, so the recycle is recorded; one that never reached the API server stays
    an error; the uid precondition spares a pod made since."""
    from urllib3.exceptions import ReadTimeoutError

    from slonk.kube.api import Api, PodReplaced

    kube = Api(NAMESPACE, api.client("controller-token"))
    real = kube.core.delete_namespaced_pod

    def uid(name: str) -> str:
        try:
            return kube.pod_place(name)[1]
        except KubeError:
            return ""

    def unsent(*args: Any, **kwargs: Any) -> None:
        raise ReadTimeoutError(None, "", "read timed out")  # type: ignore[arg-type]

    def lost(*args: Any, **kwargs: Any) -> None:  # the request arrives, its answer never does
        real(*args, **kwargs)
        unsent()

    first = uid("slonk-cpu-0")
    kube.core.delete_namespaced_pod = unsent
    with pytest.raises(KubeError, match="delete pod slonk-cpu-1: ReadTimeoutError"):
        kube.delete_pod("slonk-cpu-1", uid("slonk-cpu-1"))
    kube.core.delete_namespaced_pod = lost
    kube.delete_pod("slonk-cpu-0", first)
    kube.core.delete_namespaced_pod = real
    wait_for("slonk-cpu-0 made anew", lambda: uid("slonk-cpu-0") not in ("", first))
    with pytest.raises(PodReplaced, match="409"):  # the uid inspected is gone: not ours
        kube.delete_pod("slonk-cpu-0", first)
    assert uid("slonk-cpu-1"), "the unsent delete deleted nothing"
