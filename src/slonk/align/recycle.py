"""The controller's recycle loop (the agent's task `health-recycle`).

A node a health check drained (the machine's fault, see slonk.slurm.reasons) that has sat
idle for `idleSeconds` gets its pod deleted: Kubernetes makes a fresh one, which runs its
boot checks and, healthy, is resumed by its first health run. A node recycled `maxRecycles`
times within `windowSeconds` is not recycled again: it stays drained as `slonk:quarantine`
and its Kubernetes node is tainted for replacement. Nodes a job hook drained are left alone:
a bad script is fixed in git, not by replacing machines. So are nodes drained by a check a
user or a shared service can fail (health_checks.SHARED_CHECKS) or by a check holding more nodes
than its share (slonk.health.blast): a new pod cannot fix a shared dependency, and a user's
files are no hardware fault. Nor are trend drains (slonk.health.trend): a worn board waits for
a person.

With the gate and checks that span a block, a node is held in the gate's reservation before its
pod goes (slonk.slurm.gate): its new pod's node returns to users only through a run of those
checks that passes. One the gate cannot hold now waits for the next pass.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from slonk.align import fabric
from slonk.base import paths
from slonk.base.files import exclusive, write_atomically
from slonk.base.identity import pod_name
from slonk.config.check_names import ACTIVE_PREFIX, TREND_PREFIX
from slonk.config.health_checks import SHARED_CHECKS
from slonk.config.spec import ClusterSpec, RecycleSettings, SpecError
from slonk.health import blast
from slonk.kube.api import KubeError, PodReplaced
from slonk.metrics import node_events
from slonk.slurm import control, gate, reasons, slurm_nodes
from slonk.slurm.slurm_state import NodeState, SlurmError

# On the controller's state volume, beside slurmctld's own state: a controller restart must
# not forget how often a node was recycled.
HISTORY = paths.STATE_SAVE / "slonk-recycle.json"
PASS_LOCK = paths.STATE_SAVE / "slonk-recycle.lock"
NODE_HISTORY = (
    paths.NODE_HISTORY
)  # where recycles and quarantines are recorded (slonk.health.history)


def log(message: str) -> None:
    print(f"slonk health-recycle: {message}", file=sys.stderr, flush=True)


class Kubernetes(Protocol):
    def delete_pod(self, name: str, uid: str = "") -> None: ...
    def quarantine_node(self, pod: str, slurm_node: str, reason: str) -> str: ...
    def pod_place(self, name: str) -> tuple[str, str]: ...
    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None: ...


def _pod(kube: Kubernetes, name: str) -> node_events.Pod:
    """The node's pod and the machine under it; its name alone when the API cannot say (the
    recycle goes on: the history then says less)."""
    try:
        machine, uid = kube.pod_place(name)
    except KubeError as err:
        log(f"cannot tell which machine {name} runs on: {err}")
        return node_events.Pod(name)
    return node_events.Pod(name, uid, machine)


@dataclass
class History:
    """When each drained node was first seen idle, when it was recycled, and the slurmd
    start time it had then: until a new slurmd registers, the old pod's drain is still
    showing and the node is not considered again."""

    idle_since: dict[str, float] = field(default_factory=dict)
    recycles: dict[str, list[float]] = field(default_factory=dict)
    restarting: dict[str, str] = field(default_factory=dict)
    untainted: dict[str, str] = field(default_factory=dict)  # quarantined node -> reason
    left: dict[str, str] = field(default_factory=dict)  # node -> drain not recycled (shared)

    @classmethod
    def load(cls, path: Path = HISTORY) -> History:
        """The saved history; a fresh one, said in the log, when it cannot be read: a bad
        file must not stop every start of the loop."""
        try:
            history = cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError, TypeError) as err:
            log(f"starting a new history: {path} cannot be read ({err})")
            return cls()
        if not all(isinstance(v, dict) for v in asdict(history).values()):
            log(f"starting a new history: {path} is not a history")
            return cls()
        return history

    def save(self, path: Path = HISTORY) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(asdict(self)))


def due(
    nodes: list[NodeState],
    history: History,
    settings: RecycleSettings,
    now: float,
    max_drained_percent: int = 100,
    gate: bool = True,
) -> Iterator[tuple[str, NodeState, int]]:
    """('recycle' | 'quarantine', node, recent recycles) for every node whose time has come."""
    over = blast.over_limit(nodes, max_drained_percent)
    for node in nodes:
        if history.restarting.get(node.name) == node.slurmd_started:
            continue
        history.restarting.pop(node.name, None)
        cause = node.cause
        if cause is None or cause.kind != reasons.HEALTH or node.state != "idle":
            # busy, healthy, or drained by a hook, by quarantine or by a person
            history.idle_since.pop(node.name, None)
            history.left.pop(node.name, None)
            continue
        since = history.idle_since.setdefault(node.name, now)
        if now - since < settings.idle_seconds:
            continue
        trend = cause.name.startswith(TREND_PREFIX)
        # Without the gate no new pod runs the active checks again: its drain would stay,
        # each new pod recycled in turn until the machine is quarantined for nothing new.
        ungated = cause.name.startswith(ACTIVE_PREFIX) and not gate
        if cause.name in SHARED_CHECKS or cause.name in over or trend or ungated:
            if history.left.get(node.name) != node.reason:
                history.left[node.name] = node.reason
                why = (
                    "fails for users or shared services too"
                    if cause.name in SHARED_CHECKS
                    else "is a worn board's: a new pod does not mend it"
                    if trend
                    else "has no gate (health.active.gate) to run it again in a new pod"
                    if ungated
                    else ("holds more than its share of the nodes drained")
                )
                log(f"not recycling {node.name} ({node.reason}): {cause.name} {why}")
            continue
        history.left.pop(node.name, None)
        recent = [
            t for t in history.recycles.get(node.name, []) if now - t < settings.window_seconds
        ]
        history.recycles[node.name] = recent
        yield (
            "quarantine" if len(recent) >= settings.max_recycles else "recycle",
            node,
            len(recent),
        )


def taint(kube: Kubernetes, history: History) -> None:
    """Taint the Kubernetes nodes under quarantined Slurm nodes; what fails is tried again."""
    for name, reason in list(history.untainted.items()):
        where = kube.quarantine_node(name, name, reason)
        del history.untainted[name]
        log(f"tainted Kubernetes node {where} for {name}")


def pass_once(spec: ClusterSpec, kube: Kubernetes, history: History, now: float) -> None:
    """Recycle or quarantine every node due. A node Slurm or Kubernetes refuses is logged
    and tried again next pass: one node never keeps the others waiting."""
    if spec.health is None or spec.health.recycle is None:
        return  # recycling is off: nothing is due
    settings = spec.health.recycle
    nodes = slurm_nodes.read_nodes()
    percent = spec.health.max_drained_percent
    gated = spec.health.active is None or spec.health.active.gate
    members: set[str] | None = None  # the nodes the block checks' gate keeps, once needed
    for action, node, recent in list(due(nodes, history, settings, now, percent, gated)):
        pod = _pod(kube, node.name)
        try:
            if members is None:
                members = fabric.gate_members(spec)
            if node.name in members:
                gate.hold([node.name])
            if action == "recycle":
                kube.delete_pod(node.name, pod.uid)
                record = node_events.event("recycle", node, pod, node.reason, now)
                history.recycles[node.name].append(now)
                history.restarting[node.name] = node.slurmd_started
                log(
                    f"recycled {node.name} ({node.reason}); "
                    f"{recent + 1} in {settings.window_seconds} s"
                )
            else:
                window = settings.window_seconds
                reason = reasons.quarantine(
                    f"recycled {recent} times in {window} s; last {node.reason}"
                )
                slurm_nodes.drain(node.name, reason)
                record = node_events.event("quarantine", node, pod, reason, now)
                log(f"quarantined {node.name}: {reason}")
                if settings.taint_nodes:
                    history.untainted[node.name] = reason
        except PodReplaced as err:  # not by us: uncounted, but its new slurmd is awaited too
            history.restarting[node.name] = node.slurmd_started
            history.idle_since.pop(node.name, None)
            log(f"not recycling {node.name}: its pod was replaced since it was looked at ({err})")
            continue
        except (SlurmError, KubeError, OSError) as err:  # OSError: the gate's lock
            log(f"could not {action} {node.name}, trying again next pass: {err}")
            continue
        history.idle_since.pop(node.name, None)
        node_events.record([record], kube, spec.namespace, log, NODE_HISTORY)
    taint(kube, history)


@contextlib.contextmanager
def _pass_lock() -> Iterator[bool]:
    """True while this process holds the lock of recycle passes; False: another pass runs."""
    with exclusive(PASS_LOCK, wait=False) as held:
        yield held


def run_forever(
    load: Callable[[], ClusterSpec],
    connect: Callable[[str], Kubernetes],
    stop: threading.Event,
) -> None:
    """A pass every periodSeconds until `stop` is set or recycling is switched off."""
    spec = load()
    kube: Kubernetes | None = None
    history: History | None = None
    while not stop.is_set():
        if spec.health is None or spec.health.recycle is None:
            log("node recycling is off")
            return
        if stop.wait(spec.health.recycle.period_seconds):
            return
        try:
            spec = load()
        except SpecError as err:
            log(f"keeping the last good settings: {err}")
        if spec.health is None or spec.health.recycle is None:
            continue
        if not control.in_control(spec, pod_name()):
            history = None  # read again when this pod holds control again
            continue  # the controller pod in control recycles (slonk.slurm.control)
        # With a backup, control may move to the other pod and back between two looks of this
        # loop, and both pods read Slurm's heartbeat at their own moments: a pass runs under a
        # lock on the state volume both mount, on the record of recycles as it is there now
        # (the other pod may have written it meanwhile).
        with _pass_lock() as mine:
            if not mine:
                continue
            if history is None or spec.backup_controller is not None:
                history = History.load()
            try:
                kube = kube or connect(spec.namespace)
                pass_once(spec, kube, history, time.time())
            except (SlurmError, KubeError) as err:
                log(f"pass skipped: {err}")
            except Exception as err:  # whatever it was, a crash-loop would stop all recycling
                log(f"pass failed, trying again next period: {type(err).__name__}: {err}")
            history.save()
