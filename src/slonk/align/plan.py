"""What the syncer should do, from one snapshot of both sides: a pure function, so that a pass
over 15,000 nodes is measured (bench/align.py) and every rule is tested without a cluster.

Kubernetes is the source of truth for machines, Slurm for jobs. For each Slurm node of a pool
the plan finds the Kubernetes causes that forbid new jobs there: its pod is not running (pending,
terminating, gone, or lent when its ordinal is at or above its StatefulSet's replicas), or the
Kubernetes Node under it is cordoned, NotReady, carries a NoSchedule/NoExecute taint the pod does
not tolerate, a configured condition, or a `slonk.io/goal` of drain or down. A node with a cause
is drained as `slonk:k8s:<cause>`; when no cause is left, only that drain is lifted; a drain
anyone else made (a person, a health check, a hook, the pod's own preStop) is left alone.

Fails closed: a fact the snapshot lacks (a Node or StatefulSet not yet listed, a goal nobody
can read) never lifts a drain. It can still add one: draining is always safe.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from slonk.slurm import power, reasons
from slonk.slurm.slurm_state import NodeState

GOAL = "slonk.io/goal"
GOAL_REASON = "slonk.io/goal-reason"
GOALS = ("up", "drain", "down")
# Written on each worker pod: Slurm's view, for `kubectl get pods -L slonk.io/slurm-state`.
STATE_LABEL = "slonk.io/slurm-state"
BUSY_LABEL = "slonk.io/busy"  # the busy pods' PodDisruptionBudget selects it
REASON_ANNOTATION = "slonk.io/slurm-reason"
JOBS_ANNOTATION = "slonk.io/slurm-jobs"
# Taints whose cause is read elsewhere (cordon, the Ready condition) or that slonk set itself.
OWN_TAINTS = frozenset({
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "slonk.io/quarantine",
})  # fmt: skip
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
MAX_ANNOTATION = 1024
Object = Mapping[str, Any]


@dataclass(frozen=True)
class Settings:
    release: str
    pools: Mapping[str, int]  # pool -> its size in Slurm (the chart's replicas)
    conditions: frozenset[str] = frozenset()  # Node condition types that drain when True
    topology_labels: Mapping[str, str] = field(default_factory=dict)  # switch|block -> label
    on_demand: bool = False  # capacity.returnOnDemand: Slurm may ask lent nodes back


@dataclass(frozen=True)
class Snapshot:
    """Both sides at one moment. `statefulsets` and `nodes` hold what the API listed; a name
    missing there is unknown, not absent, until `listed` says the list was complete."""

    slurm: Mapping[str, NodeState]
    jobs: Mapping[str, int]  # running jobs per Slurm node
    pods: Mapping[str, Object]  # worker pods by name
    nodes: Mapping[str, Object]  # Kubernetes Nodes by name
    replicas: Mapping[str, int]  # StatefulSet name -> spec.replicas
    listed: bool = True  # the API's lists were read in full
    asked: frozenset[str] = frozenset()  # lent nodes Slurm asks back (capacity.returnOnDemand)


@dataclass(frozen=True)
class Cause:
    word: str  # cordoned, not-ready, taint, condition, goal, pod-pending, ...
    detail: str

    @property
    def reason(self) -> str:
        return reasons.k8s(self.word, self.detail)


@dataclass(frozen=True)
class Action:
    """A Slurm change: `drain` (reason), `resume`, `down` (reason), `lend` (reason; a step of
    slonk.slurm.power's, repeated each pass until Slurm shows the node lent) or `give-back`; `why`
    is for the log and `slonk align`."""

    node: str
    verb: str
    reason: str = ""
    why: str = ""
    pod_gone: bool = False  # for `lend`: it powers the node down only then


@dataclass(frozen=True)
class PodPatch:
    pod: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class Row:
    """One node as both sides see it, for `slonk align`."""

    node: str
    pod: str  # the pod's phase, `terminating`, `gone` or `lent`
    machine: str  # the Kubernetes Node, or `-`
    causes: tuple[Cause, ...]
    certain: bool
    slurm: str  # Slurm's state label
    reason: str
    jobs: int
    actions: tuple[Action, ...]


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    patches: tuple[PodPatch, ...]
    rows: tuple[Row, ...]
    # node -> {switch|block: label value}, for every node whose pod runs on a known Node
    placement: Mapping[str, Mapping[str, str]]

    scales: Mapping[str, int] = field(default_factory=dict)  # StatefulSet -> replicas to ask

    @property
    def drift(self) -> bool:
        return bool(self.actions or self.patches or self.scales)


def tolerated(taint: Object, tolerations: list[Object]) -> bool:
    """Kubernetes' rule: a toleration matches on key (empty with Exists: every key), on value
    for Equal, and on effect (empty: every effect)."""
    for toleration in tolerations:
        key, operator = toleration.get("key", ""), toleration.get("operator", "Equal")
        if key and key != taint.get("key"):
            continue
        if operator == "Equal" and toleration.get("value", "") != taint.get("value", ""):
            continue
        if operator not in ("Equal", "Exists") or (not key and operator != "Exists"):
            continue
        if toleration.get("effect") in (None, "", taint.get("effect")):
            return True
    return False


def machine_causes(machine: Object, pod: Object, settings: Settings) -> tuple[list[Cause], bool]:
    """The Kubernetes Node's causes, and whether its goal could be read."""
    spec, status = machine.get("spec") or {}, machine.get("status") or {}
    metadata = machine.get("metadata") or {}
    found = []
    if spec.get("unschedulable"):
        found.append(Cause("cordoned", f"Kubernetes node {metadata.get('name')} is cordoned"))
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conditions.get("Ready", {})
    if ready.get("status") != "True":
        said = ready.get("reason") or ready.get("status") or "no Ready condition"
        found.append(Cause("not-ready", f"Kubernetes node {metadata.get('name')}: {said}"))
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in spec.get("taints") or []:
        if (
            taint.get("effect") in BLOCKING_EFFECTS
            and taint.get("key") not in OWN_TAINTS
            and not tolerated(taint, tolerations)
        ):
            value = f"={taint['value']}" if taint.get("value") else ""
            found.append(Cause("taint", f"{taint.get('key')}{value}:{taint.get('effect')}"))
    for kind in sorted(settings.conditions):
        condition = conditions.get(kind)
        if condition is not None and condition.get("status") == "True":
            said = condition.get("reason") or condition.get("message") or "True"
            found.append(Cause("condition", f"{kind}: {said}"))
    annotations = metadata.get("annotations") or {}
    goal = annotations.get(GOAL, "up")
    if goal in ("drain", "down"):
        said = annotations.get(GOAL_REASON) or "no reason given"
        found.append(Cause("goal", f"{goal}: {said}"))
    return found, goal in GOALS


def _runs_its_slurmd(node: NodeState | None, pod: Object) -> bool:
    """Slurm has a slurmd that registered after this pod was made: its container runs,
    whatever phase the API has not caught up with yet."""
    if node is None or not node.up or not node.slurmd_started.isdigit():
        return False
    made = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
    try:
        created = datetime.datetime.fromisoformat(made.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return False
    return int(node.slurmd_started) >= created


def pod_causes(
    name: str, pod: Object | None, ordinal: int, replicas: int | None, node: NodeState | None
) -> list[Cause]:
    """Why the node's pod cannot take jobs. A pod not running matters only while Slurm
    would still place jobs there (a node Slurm has down is given none anyway)."""
    lent = replicas is not None and ordinal >= replicas
    usable = node is None or node.up
    if pod is None:
        if lent:
            return [Cause(power.LENT, f"its StatefulSet has {replicas} replicas")]
        return [Cause("pod-gone", f"no pod {name}")] if usable else []
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    if metadata.get("deletionTimestamp"):
        return [Cause("pod-terminating", f"pod {name} is being deleted")]
    if lent:
        return [Cause(power.LENT, f"its StatefulSet has {replicas} replicas")]
    phase = status.get("phase", "Unknown")
    if phase != "Running" and usable and not _runs_its_slurmd(node, pod):
        return [Cause("pod-pending" if phase == "Pending" else "pod-gone", f"pod {name} {phase}")]
    return []


def state_word(node: NodeState | None, jobs: int) -> str:
    """One word of Slurm's state, as a label value."""
    if node is None:
        return "unknown"
    if node.powered_down or node.powering_down:
        return "powered-down"
    if node.powering_up:
        return "powering-up"
    if node.drained:
        return "draining" if jobs else "drained"
    if node.up:
        return node.state
    return "down" if node.state == "down" or "NOT_RESPONDING" in node.flags else "unknown"


def _as_slurm_keeps(reason: str) -> str:
    """scontrol drops a reason's surrounding quotes; blanks at its ends say nothing."""
    return reason.strip().strip('"').strip()


def restated_goal(node: NodeState, causes: list[Cause]) -> Cause | None:
    """The goal cause, when the syncer drained the node for its goal and the goal's reason
    (`slonk.io/goal-reason`) has changed since: Slurm is told the new one. Only the syncer's
    own goal drain is ever re-said: a person's, a check's (one may be called `goal`), never."""
    if node.cause is None or node.cause != reasons.Cause(reasons.K8S, "goal"):
        return None
    goal = next((c for c in causes if c.word == "goal"), None)
    if goal is None or _as_slurm_keeps(goal.reason) == _as_slurm_keeps(node.reason):
        return None
    return goal


def slurm_actions(
    node: NodeState, jobs: int, causes: list[Cause], certain: bool, has_pod: bool, on_demand: bool
) -> list[Action]:
    """The Slurm changes that bring one node to what its causes ask."""
    first = causes[0] if causes else None
    ours = node.cause is not None and node.cause.kind == reasons.K8S
    if first is not None and first.word == power.LENT:
        # slonk.slurm.power drains it, and powers it down once its pod is gone and it is idle.
        if node.powering_up or power.is_lent(node, on_demand):
            return []
        return [Action(node.name, "lend", first.reason, why=first.detail, pod_gone=not has_pod)]
    lent = (
        node.powered_down
        or node.powering_down
        or (node.drained and power.is_lent_reason(node.reason))
    )
    if first is None and certain and (lent or node.powering_up):
        # Its pod runs again: slonk.slurm.power lifts the lent drain once its slurmd registered.
        return [Action(node.name, "give-back", why="its pod runs again")]
    if node.drained and not ours:
        return []  # a person's, a check's, a hook's or the pod's own drain: theirs
    if first is None:
        if ours and certain:
            return [Action(node.name, "resume", why=f"no cause left (was: {node.reason})")]
        return []
    actions = []
    kept = ours and node.cause is not None and node.cause.name in {c.word for c in causes}
    if not kept and (certain or not ours):  # unsure what holds: keep our reason as it is
        actions.append(Action(node.name, "drain", first.reason, why=first.detail))
    elif kept and certain and (goal := restated_goal(node, causes)) is not None:
        verb = "down" if node.state == "down" else "drain"  # it stays as it is, told anew
        actions.append(Action(node.name, verb, goal.reason, why=f"goal reason now {goal.detail}"))
    goal_down = any(c.word == "goal" and c.detail.startswith("down:") for c in causes)
    if goal_down and node.drained and jobs == 0 and node.state != "down":
        actions.append(Action(node.name, "down", first.reason, why="goal down, and idle"))
    return actions


def pod_patch(pod: Object, node: NodeState | None, jobs: int) -> PodPatch | None:
    """Slurm's view on the pod; None when the pod shows it already."""
    labels = {STATE_LABEL: state_word(node, jobs), BUSY_LABEL: "true" if jobs else "false"}
    # Slurm keeps a reason after a resume: shown only while it explains the state.
    reason = node.reason if node is not None and (node.drained or not node.up) else ""
    annotations = {REASON_ANNOTATION: reason[:MAX_ANNOTATION], JOBS_ANNOTATION: str(jobs)}
    metadata = pod.get("metadata") or {}
    have_labels, have_annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    changed_labels = {k: v for k, v in labels.items() if have_labels.get(k) != v}
    changed_annotations = {k: v for k, v in annotations.items() if have_annotations.get(k) != v}
    if not changed_labels and not changed_annotations:
        return None
    return PodPatch(metadata.get("name", ""), changed_labels, changed_annotations)


def worker_nodes(settings: Settings) -> Iterator[tuple[str, str, int]]:
    """(Slurm node, StatefulSet, ordinal) for every node of every pool."""
    for pool, size in sorted(settings.pools.items()):
        statefulset = f"{settings.release}-{pool}"
        for ordinal in range(size):
            yield f"{statefulset}-{ordinal}", statefulset, ordinal


def plan(snapshot: Snapshot, settings: Settings) -> Plan:
    actions: list[Action] = []
    patches: list[PodPatch] = []
    rows: list[Row] = []
    placement: dict[str, dict[str, str]] = {}
    for name, statefulset, ordinal in worker_nodes(settings):
        pod = snapshot.pods.get(name)
        replicas = snapshot.replicas.get(statefulset)
        certain = snapshot.listed and replicas is not None
        # A pod missing from a list not read in full is unknown, not gone.
        node = snapshot.slurm.get(name)
        causes = pod_causes(name, pod, ordinal, replicas, node) if pod or snapshot.listed else []
        machine_name = ((pod or {}).get("spec") or {}).get("nodeName") or ""
        if pod is not None and not causes:
            machine = snapshot.nodes.get(machine_name)
            if machine is None:
                certain = False
            else:
                found, goal_known = machine_causes(machine, pod, settings)
                causes += found
                certain = certain and goal_known
                labels = (machine.get("metadata") or {}).get("labels") or {}
                placement[name] = {
                    kind: labels[key]
                    for kind, key in settings.topology_labels.items()
                    if key and labels.get(key)
                }
        jobs = snapshot.jobs.get(name, 0)
        done = (
            slurm_actions(node, jobs, causes, certain, pod is not None, settings.on_demand)
            if node
            else []
        )
        actions += done
        if pod is not None and (patch := pod_patch(pod, node, jobs)) is not None:
            patches.append(patch)
        phase = "gone" if pod is None else ((pod.get("status") or {}).get("phase") or "Unknown")
        if causes and causes[0].word in (power.LENT, "pod-terminating"):
            phase = "lent" if causes[0].word == power.LENT else "terminating"
        rows.append(Row(
            node=name,
            pod=phase,
            machine=machine_name or "-",
            causes=tuple(causes),
            certain=certain,
            slurm=node.label if node is not None else "missing",
            reason=node.reason if node is not None else "",
            jobs=jobs,
            actions=tuple(done),
        ))  # fmt: skip
    return Plan(tuple(actions), tuple(patches), tuple(rows), placement, scales(snapshot, settings))


def scales(snapshot: Snapshot, settings: Settings) -> dict[str, int]:
    """With capacity.returnOnDemand: the StatefulSets to scale up so that every node Slurm
    asks back gets its pod (never down, never past the pool's size in Slurm)."""
    wanted: dict[str, int] = {}
    if not settings.on_demand or not snapshot.listed:
        return wanted
    for name, statefulset, ordinal in worker_nodes(settings):
        replicas = snapshot.replicas.get(statefulset)
        if name in snapshot.asked and replicas is not None and ordinal >= replicas:
            wanted[statefulset] = max(wanted.get(statefulset, replicas), ordinal + 1)
    return wanted
