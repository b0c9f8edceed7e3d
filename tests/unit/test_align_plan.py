"""The syncer's plan, rule by rule: Kubernetes causes drain as `slonk:k8s:<cause>`, only that
drain is lifted, nobody else's drain is touched, and what the snapshot lacks never resumes."""

from __future__ import annotations

from typing import Any

import pytest

from slonk.align import plan as p
from slonk.slurm import reasons
from slonk.slurm.slurm_state import NodeState

SETTINGS = p.Settings(release="slonk", pools={"cpu": 2}, conditions=frozenset({"GPUProblem"}))


def machine(name: str = "local-slonk-cpu-0", **spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", {})
    labels = spec.pop("labels", {})
    conditions = spec.pop("conditions", [{"type": "Ready", "status": "True"}])
    return {
        "metadata": {"name": name, "annotations": annotations, "labels": labels},
        "spec": spec,
        "status": {"conditions": conditions},
    }


def pod(name: str = "slonk-cpu-0", phase: str = "Running", **extra: Any) -> dict[str, Any]:
    metadata = {"name": name, "labels": {}, "annotations": {}, **extra.pop("metadata", {})}
    return {
        "metadata": metadata,
        "spec": {"nodeName": f"local-{name}", **extra},
        "status": {"phase": phase},
    }


def slurm(
    name: str = "slonk-cpu-0", state: str = "idle", *flags: str, reason: str = ""
) -> NodeState:
    return NodeState(name, state, frozenset(flags), reason, "1")


def world(
    nodes: list[NodeState] | None = None,
    pods: list[dict[str, Any]] | None = None,
    machines: list[dict[str, Any]] | None = None,
    jobs: dict[str, int] | None = None,
    replicas: int | None = 2,
    listed: bool = True,
) -> p.Snapshot:
    nodes = nodes if nodes is not None else [slurm("slonk-cpu-0"), slurm("slonk-cpu-1")]
    pods = pods if pods is not None else [pod("slonk-cpu-0"), pod("slonk-cpu-1")]
    machines = (
        machines
        if machines is not None
        else [machine(f"local-{x['metadata']['name']}") for x in pods]
    )
    return p.Snapshot(
        slurm={n.name: n for n in nodes},
        jobs=jobs or {},
        pods={x["metadata"]["name"]: x for x in pods},
        nodes={m["metadata"]["name"]: m for m in machines},
        replicas={} if replicas is None else {"slonk-cpu": replicas},
        listed=listed,
    )


def verbs(result: p.Plan) -> list[tuple[str, str, str]]:
    return [(a.node, a.verb, a.reason.split(":")[2] if a.reason else "") for a in result.actions]


def test_agreement_is_no_drift_once_pods_show_slurm() -> None:
    first = p.plan(world(), SETTINGS)
    assert first.actions == ()
    labels = {x.pod: dict(x.labels) for x in first.patches}
    assert labels["slonk-cpu-0"] == {p.STATE_LABEL: "idle", p.BUSY_LABEL: "false"}
    shown = [
        pod(
            x,
            metadata={
                "labels": dict(labels[x]),
                "annotations": {p.REASON_ANNOTATION: "", p.JOBS_ANNOTATION: "0"},
            },
        )
        for x in ("slonk-cpu-0", "slonk-cpu-1")
    ]
    again = p.plan(world(pods=shown), SETTINGS)
    assert not again.drift, "a pass with nothing new makes no API call"


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"unschedulable": True}, "cordoned"),
        (
            {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletDown"}]},
            "not-ready",
        ),
        ({"conditions": []}, "not-ready"),
        ({"taints": [{"key": "maintenance", "effect": "NoExecute"}]}, "taint"),
        ({"taints": [{"key": "maintenance", "value": "x", "effect": "NoSchedule"}]}, "taint"),
        (
            {
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "GPUProblem", "status": "True"},
                ]
            },
            "condition",
        ),
        ({"annotations": {p.GOAL: "drain", p.GOAL_REASON: "RMA 42"}}, "goal"),
    ],
)
def test_a_kubernetes_cause_drains_as_k8s(change: dict[str, Any], word: str) -> None:
    result = p.plan(world(machines=[machine(**change), machine("local-slonk-cpu-1")]), SETTINGS)
    assert verbs(result) == [("slonk-cpu-0", "drain", word)]
    assert reasons.classify(result.actions[0].reason) == reasons.Cause(reasons.K8S, word)


def test_what_is_not_a_cause() -> None:
    harmless = machine(
        taints=[
            {"key": "nvidia.com/gpu", "effect": "NoSchedule"},  # tolerated below
            {"key": "soft", "effect": "PreferNoSchedule"},
            {"key": "slonk.io/quarantine", "effect": "NoSchedule"},  # slonk's own
        ],
        conditions=[
            {"type": "Ready", "status": "True"},
            {"type": "DiskPressure", "status": "True"},
        ],
        annotations={p.GOAL: "up"},
    )
    tolerating = pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    result = p.plan(
        world(
            pods=[tolerating, pod("slonk-cpu-1")], machines=[harmless, machine("local-slonk-cpu-1")]
        ),
        SETTINGS,
    )
    assert result.actions == ()


@pytest.mark.parametrize(
    ("toleration", "ok"),
    [
        ({"operator": "Exists"}, True),
        ({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "k", "operator": "Equal", "value": "v"}, True),
        ({"key": "k", "value": "other"}, False),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"operator": "Equal"}, False),  # an empty key needs Exists
        ({"key": "k", "operator": "Gt", "value": "v"}, False),
    ],
)
def test_tolerations_match_as_kubernetes_does(toleration: dict[str, str], ok: bool) -> None:
    assert p.tolerated({"key": "k", "value": "v", "effect": "NoSchedule"}, [toleration]) is ok


def test_only_our_drain_is_lifted_and_a_person_drain_is_theirs() -> None:
    ours = slurm("slonk-cpu-0", "idle", "DRAIN", reason=reasons.k8s("cordoned", "x"))
    person = slurm("slonk-cpu-1", "idle", "DRAIN", reason="bad fan, ticket 7")
    result = p.plan(world(nodes=[ours, person]), SETTINGS)
    assert verbs(result) == [("slonk-cpu-0", "resume", "")]
    cordoned = [machine(unschedulable=True), machine("local-slonk-cpu-1", unschedulable=True)]
    result = p.plan(world(nodes=[ours, person], machines=cordoned), SETTINGS)
    assert result.actions == (), "our drain stands, the person's is theirs"


@pytest.mark.parametrize(
    "reason",
    [
        reasons.health("gpu", "1 of 2 GPUs"),
        reasons.hook("prolog", "10-x", "exit 1"),
        reasons.quarantine("recycled 3 times"),
        "slonk:pod: stopping",
        "slonk:k8s:no cause written so",  # malformed: a person's
    ],
)
def test_other_drains_are_never_touched(reason: str) -> None:
    node = slurm("slonk-cpu-0", "idle", "DRAIN", reason=reason)
    for machines in (
        [machine(), machine("local-slonk-cpu-1")],
        [machine(unschedulable=True), machine("local-slonk-cpu-1")],
    ):
        assert (
            p.plan(world(nodes=[node, slurm("slonk-cpu-1")], machines=machines), SETTINGS).actions
            == ()
        )


def test_resumed_by_hand_while_the_cause_holds_is_drained_again() -> None:
    result = p.plan(
        world(machines=[machine(unschedulable=True), machine("local-slonk-cpu-1")]), SETTINGS
    )
    assert verbs(result) == [("slonk-cpu-0", "drain", "cordoned")]


def test_a_new_cause_replaces_a_gone_one_and_a_standing_one_is_kept() -> None:
    node = slurm("slonk-cpu-0", "idle", "DRAIN", reason=reasons.k8s("cordoned", "x"))
    both = machine(unschedulable=True, annotations={p.GOAL: "drain"})
    assert (
        p.plan(
            world(
                nodes=[node, slurm("slonk-cpu-1")], machines=[both, machine("local-slonk-cpu-1")]
            ),
            SETTINGS,
        ).actions
        == ()
    )
    goal_only = machine(annotations={p.GOAL: "drain"})
    result = p.plan(
        world(
            nodes=[node, slurm("slonk-cpu-1")], machines=[goal_only, machine("local-slonk-cpu-1")]
        ),
        SETTINGS,
    )
    assert verbs(result) == [("slonk-cpu-0", "drain", "goal")]


@pytest.mark.parametrize(
    "unknown",
    [
        {"machines": []},  # the Nodes were not listed yet
        {"replicas": None},  # nor the StatefulSet
        {"listed": False},
        {
            "machines": [machine(annotations={p.GOAL: "UP "}), machine("local-slonk-cpu-1")]
        },  # unreadable goal
    ],
)
def test_what_is_unknown_never_lifts_a_drain(unknown: dict[str, Any]) -> None:
    node = slurm("slonk-cpu-0", "idle", "DRAIN", reason=reasons.k8s("cordoned", "x"))
    result = p.plan(world(nodes=[node, slurm("slonk-cpu-1")], **unknown), SETTINGS)
    assert all(a.verb != "resume" for a in result.actions)
    assert not result.rows[0].certain


def test_pods_not_running_drain_their_nodes() -> None:
    terminating = pod("slonk-cpu-0", metadata={"deletionTimestamp": "2026-11-22T00:00:00Z"})
    result = p.plan(world(pods=[terminating, pod("slonk-cpu-1", "Pending")]), SETTINGS)
    assert verbs(result) == [
        ("slonk-cpu-0", "drain", "pod-terminating"),
        ("slonk-cpu-1", "drain", "pod-pending"),
    ]
    result = p.plan(world(pods=[pod("slonk-cpu-0")]), SETTINGS)
    assert verbs(result) == [("slonk-cpu-1", "drain", "pod-gone")]


def test_a_lent_node_is_lent_step_by_step_and_given_back_once_its_pod_runs() -> None:
    def lend(result: p.Plan) -> list[tuple[str, bool]]:
        return [(a.node, a.pod_gone) for a in result.actions if a.verb == "lend"]

    busy = slurm("slonk-cpu-1", "mixed")
    result = p.plan(world(nodes=[slurm(), busy], jobs={"slonk-cpu-1": 1}, replicas=1), SETTINGS)
    assert verbs(result) == [("slonk-cpu-1", "lend", "lent")]
    assert lend(result) == [("slonk-cpu-1", False)], "its pod still runs: drain only"
    lent_reason = reasons.k8s("lent", "x")
    idle = slurm("slonk-cpu-1", "idle", "DRAIN", reason=lent_reason)
    gone = p.plan(world(nodes=[slurm(), idle], pods=[pod()], replicas=1), SETTINGS)
    assert lend(gone) == [("slonk-cpu-1", True)]
    assert gone.rows[1].pod == "lent"
    powered = slurm("slonk-cpu-1", "idle", "DRAIN", "POWERED_DOWN", reason=lent_reason)
    assert p.plan(world(nodes=[slurm(), powered], pods=[pod()], replicas=1), SETTINGS).actions == ()
    shown = p.plan(world(nodes=[slurm(), powered], pods=[pod()], replicas=1), SETTINGS)
    back = p.plan(world(nodes=[slurm(), powered], replicas=2), SETTINGS)
    assert verbs(back) == [("slonk-cpu-1", "give-back", "")]
    assert shown.rows[1].slurm == "idle+drain+powered_down"
    # Given back, its lent reason may stay on the undrained node: nothing more to do.
    returned = slurm("slonk-cpu-1", "idle", reason=lent_reason)
    assert p.plan(world(nodes=[slurm(), returned], replicas=2), SETTINGS).actions == ()


def test_on_demand_a_lent_node_stays_undrained_and_slurms_asking_scales_its_pool() -> None:
    settings = p.Settings("slonk", {"cpu": 2}, on_demand=True)
    powered = slurm("slonk-cpu-1", "idle", "POWERED_DOWN", reason=reasons.k8s("lent", "x"))
    quiet = p.plan(world(nodes=[slurm(), powered], pods=[pod()], replicas=1), settings)
    assert quiet.actions == () and quiet.scales == {}
    asked = p.Snapshot(
        slurm={n.name: n for n in (slurm(), powered)},
        jobs={},
        pods={"slonk-cpu-0": pod()},
        nodes={"local-slonk-cpu-0": machine()},
        replicas={"slonk-cpu": 1},
        asked=frozenset({"slonk-cpu-1", "slonk-gpu-9"}),
    )
    assert p.plan(asked, settings).scales == {"slonk-cpu": 2}
    assert p.plan(asked, SETTINGS).scales == {}, "only with capacity.returnOnDemand"


def test_goal_down_drains_then_downs_the_node_once_idle() -> None:
    down = machine(annotations={p.GOAL: "down", p.GOAL_REASON: "PSU swap"})
    busy = p.plan(
        world(machines=[down, machine("local-slonk-cpu-1")], jobs={"slonk-cpu-0": 2}), SETTINGS
    )
    assert verbs(busy) == [("slonk-cpu-0", "drain", "goal")]
    drained = slurm("slonk-cpu-0", "idle", "DRAIN", reason=reasons.k8s("goal", "down: PSU swap"))
    idle = p.plan(
        world(nodes=[drained, slurm("slonk-cpu-1")], machines=[down, machine("local-slonk-cpu-1")]),
        SETTINGS,
    )
    assert verbs(idle) == [("slonk-cpu-0", "down", "goal")]


def _goal_drained(reason: str, state: str = "idle", *flags: str) -> NodeState:
    return slurm("slonk-cpu-0", state, "DRAIN", *flags, reason=reason)


def _with_goal(node: NodeState, goal: str, why: str, **spec: Any) -> p.Plan:
    annotated = machine(annotations={p.GOAL: goal, p.GOAL_REASON: why}, **spec)
    return p.plan(
        world(
            nodes=[node, slurm("slonk-cpu-1")], machines=[annotated, machine("local-slonk-cpu-1")]
        ),
        SETTINGS,
    )


def test_a_goal_reason_changed_while_drained_reaches_slurm() -> None:
    """The operator corrects `slonk.io/goal-reason` on a Node already drained for its goal:
    Slurm's reason follows (it used to keep the first one)."""
    drained = _goal_drained(reasons.k8s("goal", "drain: RMA 7"))
    (action,) = _with_goal(drained, "drain", "RMA 8, PSU").actions
    assert (action.node, action.verb) == ("slonk-cpu-0", "drain")
    assert action.reason == reasons.k8s("goal", "drain: RMA 8, PSU")
    told = _goal_drained(action.reason)
    assert _with_goal(told, "drain", "RMA 8, PSU").actions == (), "said once, not every pass"


def test_a_goal_reason_slurm_keeps_as_it_can_is_not_said_again() -> None:
    """scontrol drops a reason's closing quote: the reason Slurm shows must not read as a
    change, or the syncer would drain the node again on every pass."""
    sent = reasons.k8s("goal", 'drain: "RMA 9"')
    assert _with_goal(_goal_drained(sent.rstrip('"')), "drain", '"RMA 9"').actions == ()


def test_a_goal_down_node_is_told_the_new_reason_and_stays_down() -> None:
    down = slurm("slonk-cpu-0", "down", "DRAIN", reason=reasons.k8s("goal", "down: PSU"))
    (action,) = _with_goal(down, "down", "PSU and fan").actions
    assert (action.verb, action.reason) == ("down", reasons.k8s("goal", "down: PSU and fan"))


@pytest.mark.parametrize(
    "reason",
    [
        "RMA 7",  # a person's
        reasons.health("gpu", "Xid 79"),  # a health check's
        reasons.health("goal", "drain: RMA 7"),  # a health check's, whatever its name
        reasons.k8s("cordoned", "Kubernetes node local-slonk-cpu-0 is cordoned"),  # another cause
        reasons.quarantine("recycled 3 times"),
    ],
)
def test_a_goal_reason_never_rewrites_another_drain(reason: str) -> None:
    result = _with_goal(_goal_drained(reason), "drain", "RMA 8", unschedulable=True)
    assert [a for a in result.actions if a.node == "slonk-cpu-0"] == []


def test_hostile_object_text_stays_one_printable_line() -> None:
    evil = machine(
        annotations={p.GOAL: "drain", p.GOAL_REASON: "x\nState=RESUME\u2028Reason=y" + "z" * 600}
    )
    (action,) = p.plan(world(machines=[evil, machine("local-slonk-cpu-1")]), SETTINGS).actions
    assert action.reason.isprintable() and len(action.reason) <= reasons.MAX_LENGTH
    assert "\n" not in action.reason


def test_slurm_view_on_pods() -> None:
    nodes = [
        slurm("slonk-cpu-0", "mixed", "DRAIN", reason="hands off"),
        slurm("slonk-cpu-1", "down", "NOT_RESPONDING"),
    ]
    result = p.plan(world(nodes=nodes, jobs={"slonk-cpu-0": 3}), SETTINGS)
    shown = {x.pod: x for x in result.patches}
    assert shown["slonk-cpu-0"].labels == {p.STATE_LABEL: "draining", p.BUSY_LABEL: "true"}
    assert shown["slonk-cpu-0"].annotations == {
        p.REASON_ANNOTATION: "hands off",
        p.JOBS_ANNOTATION: "3",
    }
    assert shown["slonk-cpu-1"].labels[p.STATE_LABEL] == "down"


def test_placement_from_node_labels() -> None:
    settings = p.Settings("slonk", {"cpu": 2}, topology_labels={"block": "example.com/nvl"})
    machines = [machine(labels={"example.com/nvl": "b1"}), machine("local-slonk-cpu-1")]
    assert p.plan(world(machines=machines), settings).placement == {
        "slonk-cpu-0": {"block": "b1"},
        "slonk-cpu-1": {},
    }


def test_pods_missing_from_an_unfinished_list_are_unknown_not_gone() -> None:
    result = p.plan(world(pods=[], machines=[], listed=False), SETTINGS)
    assert result.actions == ()
    assert all(not row.certain for row in result.rows)


def test_a_pod_not_running_matters_only_while_slurm_would_place_jobs_there() -> None:
    """A node Slurm has down gets no jobs anyway; a slurmd registered after the pod was made
    means its container runs, whatever phase the API still shows."""
    made = {"creationTimestamp": "2026-11-22T10:00:00Z"}  # 1795341600
    pending = pod("slonk-cpu-0", "Pending", metadata=made)
    down = slurm("slonk-cpu-0", "down", "NOT_RESPONDING")
    assert (
        p.plan(
            world(nodes=[down, slurm("slonk-cpu-1")], pods=[pending, pod("slonk-cpu-1")]), SETTINGS
        ).actions
        == ()
    )
    registered = NodeState("slonk-cpu-0", "idle", frozenset(), "", "1795341605")
    assert (
        p.plan(
            world(nodes=[registered, slurm("slonk-cpu-1")], pods=[pending, pod("slonk-cpu-1")]),
            SETTINGS,
        ).actions
        == ()
    )
    older = NodeState("slonk-cpu-0", "idle", frozenset(), "", "1795341500")
    result = p.plan(
        world(nodes=[older, slurm("slonk-cpu-1")], pods=[pending, pod("slonk-cpu-1")]), SETTINGS
    )
    assert verbs(result) == [("slonk-cpu-0", "drain", "pod-pending")]
    gone_down = slurm("slonk-cpu-1", "down", "NOT_RESPONDING")
    assert p.plan(world(nodes=[slurm(), gone_down], pods=[pod()]), SETTINGS).actions == ()
