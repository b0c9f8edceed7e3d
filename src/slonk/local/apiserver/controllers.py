"""What Kubernetes does on its own, for a local cluster: kubelet's pod status (a relist every
second, as kubelet's PLEG: the pods are processes that `slonk local restart` and `upgrade`
also start and stop, so looking is the one way to be right about all of them), StatefulSets
(a deleted pod made again while its ordinal is below replicas, a scale stopping the highest
ordinals or starting them again), graceful deletion, and evictions that honour PDBs."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from slonk.local.apiserver import objects
from slonk.local.apiserver.selectors import selector
from slonk.local.apiserver.status import ApiError, invalid
from slonk.local.apiserver.store import Object, Store, now

PODS, NODES, STS, PDBS = "/pods", "/nodes", "apps/statefulsets", "policy/poddisruptionbudgets"
EVENTS = "/events"
RELIST_SECONDS = 1.0
# A deleted pod is made again by a later sync of its StatefulSet, as on Kubernetes, where the
# controller hears of the deletion through its watch. At once, `kubectl delete --wait` could
# list the new pod before it saw the old one go, and wait for a deletion it never sees.
RECREATE_SECONDS = 1.0


class Backend(Protocol):
    """The kubelet side: local mode's pods as processes (slonk.local.fake_apiserver's, or a
    test's stub)."""

    def pods(self) -> Mapping[str, str]:
        """The pods local mode can run: {name: address}."""
        ...

    def running(self, name: str) -> int | None:
        """The pod's process id while it runs."""
        ...

    def stop(self, name: str) -> None:
        """Stop the pod as kubelet would (SIGTERM, SIGKILL after the grace); returns when
        it has stopped."""
        ...

    def start(self, name: str) -> None:
        """Start the pod again from its saved template."""
        ...


class Controllers:
    def __init__(self, store: Store, backend: Backend, namespace: str) -> None:
        self.store, self.backend, self.namespace = store, backend, namespace
        self._busy: set[str] = set()  # pods being stopped or started: the relist keeps off
        self._due: dict[str, float] = {}  # deleted pods to make again, by monotonic time
        self._seen: dict[str, tuple[int | None, int, str | None]] = {}  # pid, restarts, start
        self._lock = threading.Lock()
        self.stopped = threading.Event()  # set: the server's relist loop ends

    def _event(self, about: Object, reason: str, message: str, kind: str = "Normal") -> None:
        """A core/v1 Event, as kubelet and the controllers record theirs."""
        meta, stamp = about["metadata"], now()
        self.store.create(EVENTS, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                         "namespace": self.namespace},
            "involvedObject": {"apiVersion": about.get("apiVersion", "v1"),
                               "kind": about.get("kind", ""), "name": meta["name"],
                               "namespace": self.namespace, "uid": meta.get("uid", "")},
            "reason": reason, "message": message, "type": kind, "count": 1,
            "firstTimestamp": stamp, "lastTimestamp": stamp,
            "source": {"component": "slonk-local"},
            "reportingComponent": "slonk-local", "reportingInstance": "",
        })  # fmt: skip

    # -- the relist ----------------------------------------------------------------------

    def relist(self) -> None:
        self._recreate()
        known = self.backend.pods()
        for name, address in known.items():
            if self.store.find(NODES, "", objects.node_name(name)) is None:
                self.store.create(NODES, objects.node_object(name, address, self._selector(name)))
        for pod in self.store.list(PODS, self.namespace)[0]:
            name = pod["metadata"]["name"]
            with self._lock:
                if name in self._busy:
                    continue
            if not pod["spec"].get("nodeName"):
                self._bind(pod)
                continue
            self._pod_status(pod)
        for sts in self.store.list(STS, self.namespace)[0]:
            self._reconcile(sts, known)
        self._budgets()

    def _selector(self, pod: str) -> dict[str, str]:
        base, _ = objects.ordinal(pod)
        sts = self.store.find(STS, self.namespace, base)
        return dict(sts["spec"]["template"]["spec"].get("nodeSelector") or {}) if sts else {}

    def _reconcile(self, sts: Object, known: Mapping[str, str]) -> None:
        """Pod objects for the pods the StatefulSet wants that local mode has (upgrade may
        have added some), none for those it removed; then the StatefulSet's status."""
        base, replicas = sts["metadata"]["name"], int(sts["spec"].get("replicas", 1))
        for number in range(replicas):
            name = f"{base}-{number}"
            with self._lock:
                if name in self._busy or name in self._due or name not in known:
                    continue
            if self.store.find(PODS, self.namespace, name) is None:
                self._pod_status(
                    self.store.create(PODS, objects.pod_object(sts, number, known[name]))
                )
        for pod in self.store.list(PODS, self.namespace)[0]:
            name = pod["metadata"]["name"]
            owned = name.rpartition("-")[0] == base
            with self._lock:
                gone = owned and name not in known and name not in self._busy
            if gone:
                self.store.delete(PODS, self.namespace, name)
        self._sts_status(base)

    def _pod_status(self, pod: Object) -> None:
        name = pod["metadata"]["name"]
        pid = self.backend.running(name)
        last_pid, restarts, started = self._seen.get(name, (None, 0, None))
        if pid != last_pid and pid is not None:
            if last_pid is not None or started is not None:
                restarts += 1  # `slonk local restart`: the same pod, a new container
            started = now()
        self._seen[name] = (pid, restarts, started)
        status = objects.pod_status(pod, pid, restarts, started)
        if status != pod.get("status"):
            self.store.modify(PODS, self.namespace, name, _status(status))

    def _sts_status(self, name: str) -> None:
        pods = [
            p
            for p in self.store.list(PODS, self.namespace)[0]
            if p["metadata"]["name"].rpartition("-")[0] == name
        ]
        ready = sum(1 for p in pods if _ready(p))

        def update(sts: Object) -> None:
            sts["status"] = {
                **sts.get("status", {}),
                "observedGeneration": sts["metadata"].get("generation", 1),
                "replicas": len(pods),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "currentReplicas": len(pods),
                "updatedReplicas": len(pods),
            }

        self.store.modify(STS, self.namespace, name, update)

    def _budgets(self) -> None:
        pods = self.store.list(PODS, self.namespace)[0]
        sets = self.store.list(STS, self.namespace)[0]
        for pdb in self.store.list(PDBS, self.namespace)[0]:
            status = budget_status(pdb, pods, sets)
            if status != pdb.get("status"):
                self.store.modify(PDBS, self.namespace, pdb["metadata"]["name"], _status(status))

    # -- deletion, scaling, eviction -----------------------------------------------------
    def delete_pod(self, name: str) -> Object:
        """Graceful deletion: deletionTimestamp now (watchers see MODIFIED), the process
        stopped by kubelet, then the object goes (DELETED); its StatefulSet makes it again
        if its ordinal is still wanted. Deleting a terminating pod changes nothing."""
        pod = self.store.get(PODS, self.namespace, name)
        if pod["metadata"].get("deletionTimestamp"):
            return pod
        with self._lock:
            self._busy.add(name)

        def mark(p: Object) -> None:
            p["metadata"]["deletionTimestamp"] = now()
            p["metadata"]["deletionGracePeriodSeconds"] = p["spec"].get(
                "terminationGracePeriodSeconds", 30
            )

        marked = self.store.modify(PODS, self.namespace, name, mark) or pod
        self._event({"kind": "Pod", **marked}, "Killing", "Stopping the pod's containers")
        threading.Thread(target=self._terminate, args=(name,), daemon=True).start()
        return marked

    def _terminate(self, name: str) -> None:
        try:
            self.backend.stop(name)
            with contextlib.suppress(ApiError):  # gone already: `upgrade` removed the pod
                self.store.delete(PODS, self.namespace, name)
            self._seen.pop(name, None)
            with self._lock:  # made again by a later sync of its StatefulSet (see relist)
                self._due[name] = time.monotonic() + RECREATE_SECONDS
        finally:
            with self._lock:
                self._busy.discard(name)

    def _recreate(self) -> None:
        """Deleted pods whose StatefulSet still wants them, made again once due."""
        with self._lock:
            due = [n for n, at in self._due.items() if at <= time.monotonic()]
            for name in due:
                del self._due[name]
        for name in due:
            base, number = objects.ordinal(name)
            sts = self.store.find(STS, self.namespace, base)
            if sts and number < int(sts["spec"].get("replicas", 1)):
                self._make(sts, number)

    def _make(self, sts: Object, number: int) -> None:
        """The StatefulSet's pod made again: bound to its Node and started, or left
        Pending (unbound) while the scheduler would not place it there (cordoned, tainted);
        the relist binds it once it would."""
        name = f"{sts['metadata']['name']}-{number}"
        address = self.backend.pods()[name]
        node = self.store.find(NODES, "", objects.node_name(name))
        why = objects.unschedulable(sts["spec"]["template"]["spec"], node)
        if self.store.find(PODS, self.namespace, name) is None:
            made = self.store.create(PODS, objects.pod_object(sts, number, address, not why))
            self._event(sts, "SuccessfulCreate", f"create Pod {name} in StatefulSet "
                        f"{sts['metadata']['name']} successful")  # fmt: skip
            if why:
                self._event({"kind": "Pod", **made}, "FailedScheduling", why, "Warning")
                status = objects.unscheduled_status(made, why)
                self.store.modify(PODS, self.namespace, name, _status(status))
        if not why and self.backend.running(name) is None:
            self.backend.start(name)

    def _bind(self, pod: Object) -> None:
        """An unbound pod whose Node now takes it: bound, then started (kubelet's part)."""
        name = pod["metadata"]["name"]
        node = self.store.find(NODES, "", objects.node_name(name))
        if objects.unschedulable(pod["spec"], node):
            return
        with self._lock:
            if name in self._busy:
                return
            self._busy.add(name)

        def bind(p: Object) -> None:
            p["spec"]["nodeName"] = objects.node_name(name)

        try:
            self.store.modify(PODS, self.namespace, name, bind)
            if self.backend.running(name) is None:
                self.backend.start(name)
        finally:
            with self._lock:
                self._busy.discard(name)

    def check_scale(self, sts: Object, replicas: int) -> None:
        """422 for a scale local mode cannot follow: pods beyond those `up` or `upgrade`
        made have no network namespace or template here."""
        base = sts["metadata"]["name"]
        known = self.backend.pods()
        most = sum(1 for n in known if n.rpartition("-")[0] == base)
        if not 0 <= replicas <= most:
            raise invalid(
                "StatefulSet",
                base,
                "spec.replicas",
                f"Invalid value: {replicas}: local mode "
                f"runs at most the {most} pods the chart's values made (raise the pool's "
                "replicas with `slonk local upgrade` first)",
                group="apps",
            )

    def scaled(self, sts: Object) -> None:
        """After spec.replicas changed: stop the pods above it, highest ordinal first, one at
        a time (OrderedReady) or together (Parallel); start those below it that are not."""
        base, after = sts["metadata"]["name"], int(sts["spec"].get("replicas", 1))
        owned = [
            objects.ordinal(p["metadata"]["name"]) for p in self.store.list(PODS, self.namespace)[0]
        ]
        going = [f"{b}-{n}" for b, n in sorted(owned, reverse=True) if b == base and n >= after]
        parallel = sts["spec"].get("podManagementPolicy") == "Parallel"

        def act() -> None:
            for name in going:
                try:
                    self.delete_pod(name)
                except ApiError:
                    continue  # gone meanwhile (`upgrade` removed it)
                self._event(sts, "SuccessfulDelete", f"delete Pod {name} in StatefulSet {base} "
                            "successful")  # fmt: skip
                if not parallel:
                    self._wait_gone(name)
            for number in range(after):
                name = f"{base}-{number}"
                with self._lock:
                    if name in self._busy:
                        continue
                current = self.store.find(STS, self.namespace, base)
                if current and number < int(current["spec"].get("replicas", 1)):
                    self._make(current, number)

        threading.Thread(target=act, daemon=True).start()

    def _wait_gone(self, name: str) -> None:
        while True:
            with self._lock:
                if name not in self._busy:
                    return
            with self.store.changed:
                self.store.changed.wait(RELIST_SECONDS)

    def evict(self, name: str) -> None:
        """policy/v1 Eviction: refused (429) while the pod's budget allows no disruption,
        500 for a pod two budgets match (as Kubernetes), else a graceful deletion."""
        pod = self.store.get(PODS, self.namespace, name)
        if pod["metadata"].get("deletionTimestamp"):
            return
        budgets = [
            b
            for b in self.store.list(PDBS, self.namespace)[0]
            if selector(b["spec"].get("selector") or {})(pod)
        ]
        if len(budgets) > 1:
            raise ApiError(
                500,
                "This pod has more than one PodDisruptionBudget, which the "
                "eviction subresource does not support.",
            )
        if budgets and _ready(pod):
            pods = self.store.list(PODS, self.namespace)[0]
            status = budget_status(budgets[0], pods, self.store.list(STS, self.namespace)[0])
            if status["disruptionsAllowed"] <= 0:
                message = (
                    f"The disruption budget {budgets[0]['metadata']['name']} needs "
                    f"{status['desiredHealthy']} healthy pods and has {status['currentHealthy']}"
                )
                raise ApiError(
                    429,
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    "TooManyRequests",
                    causes=[{"reason": "DisruptionBudget", "message": message}],
                )
        self.delete_pod(name)


def _status(status: Object) -> Callable[[Object], None]:
    return lambda obj: obj.update(status=status)


def _ready(pod: Object) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def _count(value: Any, total: int, round_up: bool) -> int:
    """An int-or-percent of `total`, as the disruption controller rounds it."""
    if isinstance(value, str) and value.endswith("%"):
        share = int(value[:-1]) * total
        return -(-share // 100) if round_up else share // 100
    return int(value)


def budget_status(pdb: Object, pods: list[Object], sets: list[Object]) -> Object:
    """As the disruption controller computes it: the pods expected are their StatefulSets'
    replicas (a pod deleted and not yet made again still counts), the healthy ones Ready."""
    match = selector(pdb["spec"].get("selector") or {})
    matched = [p for p in pods if match(p)]
    owners = [s for s in sets if match({"metadata": s["spec"]["template"]["metadata"]})]
    expected = sum(int(s["spec"].get("replicas", 1)) for s in owners) if owners else len(matched)
    healthy = sum(1 for p in matched if _ready(p))
    spec = pdb["spec"]
    if "minAvailable" in spec:
        desired = _count(spec["minAvailable"], expected, round_up=True)
    else:
        desired = expected - _count(spec.get("maxUnavailable", 0), expected, round_up=True)
    return {
        **pdb.get("status", {}),
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "expectedPods": expected,
        "currentHealthy": healthy,
        "desiredHealthy": max(desired, 0),
        "disruptionsAllowed": max(healthy - max(desired, 0), 0),
    }
