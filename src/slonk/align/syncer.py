"""The syncer (the controller's s6 service `syncer`) and `slonk align`: read both sides, plan,
act. Kubernetes comes from watches (slonk.align.kube), Slurm from one `scontrol show node
--json` and one `squeue` a pass (Slurm has no watch: passes also run every slurmPollSeconds,
which is how a node resumed by hand while its cause holds is drained again).

Writes go to Slurm only for nodes whose state must change and to the API only for pods whose
Slurm view changed: a pass where nothing changed makes no call. Replicas elect one leader
through a Lease; a syncer that loses it exits (s6 starts it again, as a follower) before
another can take over, as client-go's leader election advises."""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable

from slonk.align import lease, lending, topology
from slonk.align import plan as planning
from slonk.align.kube import BACKOFF_SECONDS, Cluster
from slonk.align.stats import Stats
from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.base.identity import pod_name
from slonk.config.spec import ClusterSpec, SpecError
from slonk.kube.api import KubeError
from slonk.metrics import node_events
from slonk.slurm import control, power, reasons, slurm_nodes
from slonk.slurm.slurm_state import SlurmError

LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS = 15, 10, 2
MIN_PASS_SECONDS = 0.2  # a burst of watch events makes one pass, not one each
# With a backup controller: how long passes see the other pod's slurmctld in control before
# this syncer gives way (its Lease keeps two from running at once meanwhile): a handback
# moves the heartbeat, and a look taken during it is not yet the outcome.
CONTROL_GRACE_SECONDS = 10.0


def log(message: str) -> None:
    print(f"slonk syncer: {message}", file=sys.stderr, flush=True)


def settings_of(spec: ClusterSpec) -> planning.Settings:
    syncer = spec.syncer
    return planning.Settings(
        release=spec.release,
        pools={pool.name: pool.replicas for pool in spec.nodepools},
        conditions=frozenset(syncer.node_conditions if syncer else ()),
        topology_labels=dict(syncer.topology_labels) if syncer else {},
        on_demand=spec.capacity.return_on_demand,
    )


def snapshot(spec: ClusterSpec, kube: Cluster) -> planning.Snapshot:
    """Both sides now; raises SlurmError when Slurm cannot be read (no pass then)."""
    found = slurm_nodes.read_nodes()
    try:
        found = power.keep_reasons(found)
    except SlonkError as err:  # a node powered up keeps its drain: the next pass tries again
        log(f"cannot keep or restore the reasons of powered-down nodes: {err}")
    nodes = {n.name: n for n in found}
    jobs = slurm_nodes.running_jobs()
    replicas = kube.replicas()
    for pool, target in lending.targets().items():
        statefulset = f"{spec.release}-{pool}"
        if statefulset not in replicas:
            continue
        if replicas[statefulset] <= target and kube.synced:
            lending.set_target(pool, None)  # scaled: the replicas say it from now on
        replicas[statefulset] = min(replicas[statefulset], target)
    asked: set[str] = set()
    if spec.capacity.return_on_demand:
        try:
            asked = power.asked_back(nodes.values())
        except SlonkError as err:  # it only withholds scale-ups: the pass goes on
            log(f"cannot read Slurm's requests for lent nodes: {err}")
    return planning.Snapshot(
        slurm=nodes,
        jobs=jobs,
        pods=kube.pods.snapshot(),
        nodes=kube.nodes.snapshot(),
        replicas=replicas,
        listed=kube.synced,
        asked=frozenset(asked),
    )


def carry_out(action: planning.Action, on_demand: bool) -> bool:
    """One Slurm change; False when a step of lending or giving back is still under way."""
    if action.verb == "drain":
        slurm_nodes.drain(action.node, action.reason)
    elif action.verb == "resume":
        # Read again: a person may have drained it since the snapshot; theirs stays.
        node = slurm_nodes.read_node(action.node)
        if node.cause is None or node.cause.kind != reasons.K8S:
            return False
        slurm_nodes.resume(action.node)
    elif action.verb == "down":
        slurm_nodes.down(action.node, action.reason)
    elif action.verb == "lend":
        return power.lend(action.node, action.why, action.pod_gone, on_demand)
    elif action.verb == "give-back":
        if not power.give_back(action.node):
            return False
        power.forget_requests([action.node])
    else:
        raise ValueError(f"no such Slurm action: {action.verb}")
    return True


EVENT_REASONS = {
    "drain": "SlurmDrain",
    "resume": "SlurmResume",
    "down": "SlurmDown",
    "lend": "SlurmLent",
    "give-back": "SlurmGivenBack",
}


def apply(
    result: planning.Plan,
    kube: Cluster,
    spec: ClusterSpec,
    stats: Stats | None = None,
    gate: topology.Gate | None = None,
) -> list[str]:
    """Carry the plan out; one line per change or failure. A node Slurm or the API refuses
    is tried again next pass: one never keeps the others waiting. The topology goes through
    the syncer's `gate` (slonk.align.topology), or at once without one."""
    said = []
    counts = stats or Stats()
    on_demand = spec.capacity.return_on_demand
    for action in result.actions:
        done = f"{action.verb} {action.node}: {action.reason or action.why}"
        try:
            if not carry_out(action, on_demand):
                continue  # under way, or moot: the next pass looks again
        except (SlonkError, ValueError) as err:  # Slurm, the power requests file
            said.append(f"could not {action.verb} {action.node}, next pass tries again: {err}")
            counts.errors += 1
            continue
        said.append(done)
        counts.actions[action.verb] = counts.actions.get(action.verb, 0) + 1
        try:  # for `kubectl describe pod`; the change is made whether it is told or not
            kube.event(action.node, EVENT_REASONS[action.verb], done)
        except KubeError as err:
            said.append(f"could not record an Event for {action.node}: {err}")
            counts.errors += 1
    for statefulset, replicas in result.scales.items():
        try:
            kube.scale(statefulset, replicas)
            said.append(f"scaled {statefulset} to {replicas}: Slurm asks its lent nodes back")
        except KubeError as err:
            said.append(f"could not scale {statefulset} up: {err}")
            counts.errors += 1
    for patch in result.patches:
        try:
            kube.patch_pod(patch.pod, patch.labels, patch.annotations)
        except KubeError as err:
            said.append(f"could not show Slurm's view on pod {patch.pod}: {err}")
            counts.errors += 1
    if spec.syncer and spec.syncer.topology_labels:
        said += topology.place(result.placement, spec, gate)
    return said


def pass_once(
    spec: ClusterSpec,
    kube: Cluster,
    fix: bool = True,
    observer: node_events.Observer | None = None,
    stats: Stats | None = None,
    gate: topology.Gate | None = None,
) -> planning.Plan:
    """One pass. The syncer's own (with an observer) records what changed on the nodes since
    its last pass, whoever changed it, before it acts."""
    now = snapshot(spec, kube)
    if observer is not None:
        observer.observe(now.slurm, now.pods, kube, time.time())
    result = planning.plan(now, settings_of(spec))
    if fix:
        for line in apply(result, kube, spec, stats, gate):
            log(line)
    return result


def converge(spec: ClusterSpec, kube: Cluster, result: planning.Plan, passes: int = 3) -> list[str]:
    """`slonk align --fix`: the syncer's actions, then the pods' view of what they did."""
    said: list[str] = []
    for _ in range(passes):
        if not result.drift:
            break
        said += apply(result, kube, spec)
        kube.list_once()
        result = pass_once(spec, kube, fix=False)
    return said


def connect(spec: ClusterSpec, resync_seconds: float) -> Cluster:
    """The API, waited for: a syncer that exits on an API outage would restart every second."""
    for attempt in itertools.count():
        try:
            return Cluster(spec.namespace, spec.release, resync_seconds)
        except KubeError as err:
            pause = BACKOFF_SECONDS[min(attempt, len(BACKOFF_SECONDS) - 1)]
            log(f"{err}; trying again in {pause} s")
            time.sleep(pause)
    raise AssertionError("unreachable")


def run(load: Callable[[], ClusterSpec]) -> None:
    """Forever: lead, then pass on every change and every slurmPollSeconds."""
    spec = load()
    if spec.syncer is None:
        from slonk.pod.services import idle

        idle("the syncer is off", log)
    poll_seconds = spec.syncer.slurm_poll_seconds
    kube = connect(spec, spec.syncer.resync_seconds)

    observer = node_events.Observer(spec.namespace, log)
    stats = Stats()
    gate = topology.Gate()

    def work() -> None:
        current, refused = spec, ""
        elsewhere_since: float | None = None
        kube.start()
        log(f"leading; watching Nodes, pods and StatefulSets of {spec.release}")
        while True:
            kube.changed.wait(next_pass(gate, poll_seconds))
            kube.changed.clear()
            try:
                current, refused = load(), ""
            except SpecError as err:  # the last good settings stay, said once
                if str(err) != refused:
                    log(f"keeping the last good settings: {err}")
                refused = str(err)
            holder = control.held_elsewhere(current, pod_name())
            if holder is None:
                elsewhere_since = None
            elif elsewhere_since is None:
                elsewhere_since = time.monotonic()
            elif time.monotonic() - elsewhere_since >= CONTROL_GRACE_SECONDS:
                log(f"{holder}'s slurmctld holds control; exiting for the syncer there")
                os._exit(1)
            if current.syncer is not None:  # the pace as the settings say now
                gate.window = current.syncer.topology_window_seconds
                gate.interval = current.syncer.topology_min_interval_seconds
            if not kube.synced:
                continue  # a list failed: its objects' absence would read as pods gone
            started = time.monotonic()
            try:
                pass_once(current, kube, observer=observer, stats=stats, gate=gate)
            except SlurmError as err:
                log(f"pass skipped, Slurm cannot be read: {err}")
                stats.errors += 1
            except Exception as err:  # whatever it was, a crash loop would stop all syncing
                log(f"pass failed, trying again: {type(err).__name__}: {err}")
                stats.errors += 1
            stats.passes += 1
            stats.last_pass_seconds = time.monotonic() - started
            try:
                stats.save()
            except OSError as err:
                log(f"cannot write {paths.SYNCER_STATS}: {err}")
            time.sleep(MIN_PASS_SECONDS)

    lead(spec, kube, work)


def next_pass(gate: topology.Gate, poll_seconds: float) -> float:
    """Seconds until the next pass without a change: a held topology is decided on time. One
    overdue (a pass skipped, the labels setting gone) waits for the usual poll, not a spin."""
    due, now = gate.due(), gate.clock()
    if due is None or due <= now:
        return poll_seconds
    return min(poll_seconds, due - now)


def lead(spec: ClusterSpec, kube: Cluster, work: Callable[[], None]) -> None:
    """Run `work` while this process holds the Lease <release>-syncer, in the controller pod
    whose slurmctld holds control (slonk.slurm.control); exit when it is lost."""
    from kubernetes import client

    identity = f"{pod_name()}_{os.getpid()}"
    if not control.in_control(spec, pod_name()):
        log("waits for this pod's slurmctld to hold control (values controller.backup)")
        while not control.in_control(spec, pod_name()):
            time.sleep(RETRY_SECONDS)

    def lost() -> None:
        log("lost the Lease; exiting so that only the new leader acts")
        os._exit(1)

    name = f"{spec.release}-syncer"
    elector = lease.Elector(
        client.CoordinationV1Api(kube.api_client), name, spec.namespace, identity,
        LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS,
    )  # fmt: skip
    log(f"{identity} waits for the Lease {name}")
    elector.run(work, lost)
