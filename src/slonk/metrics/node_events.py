"""What happened to a node, recorded: in the node history (slonk.health.history) and as Kubernetes
Events on its pod and on its Node.

The syncer reads every node each pass: a node that went out of service (drained, or down)
or changed its reason since the last pass was drained, one that came back was resumed,
whoever did it (a health check on the worker, a person, the syncer itself). What it saw last
comes from the history at start, so a syncer restart neither repeats nor loses a change. The
recycle loop records its recycles and quarantines itself."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from slonk.base import paths
from slonk.base.files import write_atomically
from slonk.base.text import printable
from slonk.health import history, serials
from slonk.metrics import cause_label
from slonk.slurm.slurm_state import OFF_FLAGS, NodeState

# Cluster-scoped objects' core/v1 Events must be in `default` (the API server refuses another
# namespace for an Event with no eventTime whose object has none), and `kubectl describe node`
# finds them by involvedObject kind Node, name, no namespace and uid = the Node's name, as
# kubelet records its own: it searches every namespace for uid = name and (recent kubectl)
# for the Node's real uid too.
NODE_EVENT_NAMESPACE = "default"
REASONS = {
    "drain": ("SlurmNodeDrained", "Warning"),
    "resume": ("SlurmNodeResumed", "Normal"),
    "recycle": ("SlonkRecycled", "Warning"),
    "quarantine": ("SlonkQuarantined", "Warning"),
}
COMPONENT = "slonk"
MAX_MESSAGE = 1024  # the API's limit for a note
MAX_EVENTS_PER_PASS = 50  # two API calls each (pod, Node): a mass change must not stall a pass


class EventSink(Protocol):
    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class Pod:
    """Where a node's pod runs, as Kubernetes says."""

    name: str
    uid: str = ""
    machine: str = ""  # spec.nodeName

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Pod:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        return cls(
            str(meta.get("name", "")), str(meta.get("uid", "")), str(spec.get("nodeName") or "")
        )


def out_of_service(node: NodeState) -> bool:
    """Drained, down, or powered down (lent) or on its way: no job starts on it."""
    return node.drained or node.state == "down" or bool(node.flags & OFF_FLAGS)


def event(kind: str, node: NodeState, pod: Pod, reason: str, when: float) -> history.Event:
    return history.Event(
        time=when,
        event=kind,
        node=node.name,
        machine=pod.machine,
        gpus=serials.decode(node.extra),
        pod=pod.name or node.name,
        podUID=pod.uid,
        cause=cause_label(reason),
        reason=reason,
    )


def changes(
    before: Mapping[str, str | None], nodes: Iterable[NodeState]
) -> list[tuple[str, NodeState, str]]:
    """(drain | resume, node, reason) for each node whose service changed. `before`: each
    node's reason when last seen out of service, None when in service (absent: in service).
    A resume carries the reason it lifted. A node still out of service whose reason Slurm
    cleared (powering up, lent) is no new drain."""
    found = []
    for node in nodes:
        old = before.get(node.name)
        if out_of_service(node):
            if old is None or (node.reason and node.reason != old):
                found.append(("drain", node, node.reason))
        elif old is not None:
            found.append(("resume", node, old))
    return found


def last_seen(events: Iterable[history.Event]) -> dict[str, str | None]:
    """Each node's service as the history last recorded it (drains and resumes alone)."""
    seen: dict[str, str | None] = {}
    for e in events:
        if e.event == "drain":
            seen[e.node] = e.reason
        elif e.event == "resume":
            seen[e.node] = None
    return seen


def bodies(e: history.Event, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, core/v1 Event) on the pod and, when known, on its Node."""
    reason, kind = REASONS[e.event]
    where = f" on {e.machine}" if e.machine else ""
    gpus = f" (GPUs {', '.join(e.gpus)})" if e.gpus else ""
    text = f"{e.node} {e.event}{where}{gpus}: {e.reason or '-'} [cause {e.cause}]"
    message = printable(text)
    stamp = datetime.datetime.fromtimestamp(e.time, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def body(namespace: str, about: dict[str, str], name: str) -> dict[str, Any]:
        return {
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": about,
            "reason": reason,
            "message": message[:MAX_MESSAGE],
            "type": kind,
            "source": {"component": COMPONENT},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }

    pod = {"apiVersion": "v1", "kind": "Pod", "name": e.pod, "namespace": namespace}
    if e.podUID:
        pod["uid"] = e.podUID
    made = [(namespace, body(namespace, pod, e.pod))]
    if e.machine:
        node = {"apiVersion": "v1", "kind": "Node", "name": e.machine, "uid": e.machine}
        made.append((NODE_EVENT_NAMESPACE, body(NODE_EVENT_NAMESPACE, node, e.machine)))
    return made


def publish(
    sink: EventSink, events: Iterable[history.Event], namespace: str, log: Callable[[str], None]
) -> None:
    """Each event on its pod and Node; one the API refuses is said and dropped (the history
    holds it)."""
    from slonk.kube.api import KubeError

    for e in events:
        for where, body in bodies(e, namespace):
            try:
                sink.create_event(where, body)
            except KubeError as err:
                log(f"could not record the {e.event} of {e.node} as an Event: {err}")


def record(
    events: list[history.Event],
    sink: EventSink | None,
    namespace: str,
    log: Callable[[str], None],
    path: Path = paths.NODE_HISTORY,
) -> None:
    history.record(events, log, path)
    if sink is not None:
        publish(sink, events, namespace, log)


class Observer:
    """The syncer's eye on node changes between passes."""

    def __init__(
        self,
        namespace: str,
        log: Callable[[str], None],
        path: Path = paths.NODE_HISTORY,
        machines: Path = paths.MACHINES,
        seen: Path = paths.NODES_SEEN,
    ) -> None:
        self.namespace, self.log, self.path, self.machines_path = namespace, log, path, machines
        self.seen_path = seen
        self.before: dict[str, str | None] | None = None
        self.machines: dict[str, str] | None = None

    def _last_seen(self) -> tuple[dict[str, str | None], bool]:
        """What the last syncer saw, and whether this is the first pass of all: its own
        record (a compaction may have dropped a long drain's line from the history) and the
        history written after it; else the history alone."""
        try:
            data = json.loads(self.seen_path.read_text())
        except (OSError, ValueError):
            data = None
        nodes = data.get("nodes") if isinstance(data, dict) else None
        offset = data.get("offset") if isinstance(data, dict) else None
        try:
            if isinstance(nodes, dict) and isinstance(offset, int):
                seen: dict[str, str | None] = {
                    str(k): v for k, v in nodes.items() if isinstance(v, str)
                }
                seen.update(last_seen(history.follow(self.path, offset)[0]))
                return seen, False
            return last_seen(history.read(self.path)), history.end(self.path) == 0
        except OSError as err:
            self.log(f"cannot read the node history, starting from now: {err}")
            return {}, False

    def _save_seen(self, before: Mapping[str, str | None]) -> None:
        """After the history: the events before its end are in this record."""
        out = {node: reason for node, reason in before.items() if reason is not None}
        try:
            document = {"offset": history.end(self.path), "nodes": out}
            write_atomically(self.seen_path, json.dumps(document, sort_keys=True))
        except OSError as err:
            self.log(f"cannot save the nodes out of service: {err}")

    def observe(
        self,
        nodes: Mapping[str, NodeState],
        pods: Mapping[str, Mapping[str, Any]],
        sink: EventSink | None,
        when: float,
    ) -> list[history.Event]:
        catching_up = False
        if self.before is None:
            self.before, catching_up = self._last_seen()
        found = [
            event(kind, node, Pod.of(pods[node.name]) if node.name in pods else Pod(node.name),
                  reason, when)
            for kind, node, reason in changes(self.before, nodes.values())
        ]  # fmt: skip
        for e in found:
            self.before[e.node] = e.reason if e.event == "drain" else None
        if found:
            # The first pass of all (no history yet) records how things stand, as no news;
            # a pass's Events are bounded, as each is a call to the API before the syncer acts.
            told = [] if catching_up else found[:MAX_EVENTS_PER_PASS]
            if len(told) < len(found):
                self.log(f"{len(found) - len(told)} node events recorded, not sent as Events")
            record(found, None, self.namespace, self.log, self.path)
            if sink is not None:
                publish(sink, told, self.namespace, self.log)
        if found or catching_up:
            self._save_seen(self.before)
        self._save_machines(pods)
        return found

    def _save_machines(self, pods: Mapping[str, Mapping[str, Any]]) -> None:
        """Where each node's pod runs now, for `slonk nodes` (a pod not placed keeps its last)."""
        placed = {name: Pod.of(obj).machine for name, obj in pods.items()}
        if self.machines is None:
            self.machines = load_machines(self.machines_path)
        new = {**self.machines, **{n: m for n, m in placed.items() if m}}
        if new == self.machines:
            return
        try:
            write_atomically(self.machines_path, json.dumps(new, sort_keys=True))
            self.machines = new
        except OSError as err:
            self.log(f"cannot save where pods run: {err}")


def load_machines(path: Path = paths.MACHINES) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v[: history.MAX_NAME] for k, v in data.items() if isinstance(v, str)}
