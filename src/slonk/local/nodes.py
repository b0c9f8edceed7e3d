"""A local cluster's Slurm nodes as its controller sees them: the wait for them to be up, and
what `down` asks of the controller once the workers stopped."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TextIO

import hostlist

from slonk.local.manifests import LocalModeError
from slonk.local.state import Cluster
from slonk.pod.worker_stop import (
    DOWN_WAIT_SECONDS,
    REASON,
    drained_by_another,
    holds_jobs,
)
from slonk.slurm.slurm_state import SHOW_NODES, NodeState, SlurmError, parse_nodes

NODES_UP_TIMEOUT_SECONDS = 120.0
# Each node adds to a wait's timeout: slurmctld registers a few hundred nodes a minute on a
# loaded small machine, and a pod starting late is no fault.
NODES_UP_SECONDS_PER_NODE = 1.0
NOT_REGISTERED = "not registered"
NODES_LINE = "  nodes: "
# The wait asks Slurm again after this, or after twice what the last asking took if that is
# longer: `scontrol show node --json` for 256 nodes is work for slurmctld and this process
# both, taken from the pods that are starting.
POLL_SECONDS = 0.05
SHOWN_NAMES = 10  # nodes named in a timeout's message; the rest are counted
RETRY_SECONDS = 1.0  # `down` asks a controller that did not answer again after this


def printer(stream: TextIO) -> Callable[[str], None]:
    """Progress for a person: on a terminal, each nodes line is rewritten in place."""
    rewriting = False

    def show(message: str) -> None:
        nonlocal rewriting
        nodes = message.startswith(NODES_LINE) and stream.isatty()
        if nodes:
            stream.write(("\r\033[K" if rewriting else "") + message)
        else:
            stream.write(("\n" if rewriting else "") + message + "\n")
        rewriting = nodes
        stream.flush()

    return show


def node_states(cluster: Cluster) -> dict[str, NodeState]:
    """Slurm's state of every node, as the controller sees it ({} while it does not answer).
    Output that cannot be read is an error, never an empty answer."""
    controller = cluster.running_controller()
    if controller is None:
        return {}
    result = cluster.run(controller, list(SHOW_NODES))
    if result.returncode != 0:
        return {}
    try:
        return {node.name: node for node in parse_nodes(result.stdout)}
    except SlurmError as err:
        raise LocalModeError(str(err)) from None


def summary(states: dict[str, NodeState], expected: Collection[str]) -> str:
    """One short line however many nodes: how many are in each state ("200 idle, 56 not
    registered"), the most first."""
    counts = Counter(states[n].label if n in states else NOT_REGISTERED for n in expected)
    return ", ".join(f"{n} {label}" for label, n in sorted(counts.items(), key=lambda i: -i[1]))


def wait_nodes_up(
    cluster: Cluster,
    timeout: float | None = None,
    progress: Callable[[str], None] = print,
    pods: Sequence[str] | None = None,
) -> float:
    """Wait until the worker pods among `pods` (default: every pod) are registered, responding
    Slurm nodes that no stopped pod holds drained; returns the seconds it took. Fails as
    soon as one of `pods` or the controller stops, or after `timeout` (default:
    NODES_UP_TIMEOUT_SECONDS and a little per node), naming the nodes not up. Progress: one
    line of counts, each time they change."""
    started = time.monotonic()
    watched = set(cluster.pod_names() if pods is None else pods)
    watched |= set(cluster.pod_names("controller"))
    expected = sorted(watched & set(cluster.pod_names("worker")))
    if timeout is None:
        timeout = NODES_UP_TIMEOUT_SECONDS + NODES_UP_SECONDS_PER_NODE * len(expected)
    last = None
    while True:
        asked = time.monotonic()
        for name in sorted(watched):
            if cluster.pid(name) is None:
                log = cluster.log(name).splitlines()[-15:]
                raise LocalModeError(f"pod {name} stopped while starting:\n" + "\n".join(log))
        states = node_states(cluster)
        counts = summary(states, expected)
        if counts != last:
            progress(f"{NODES_LINE}{counts or 'none'}")
            last = counts
        waiting = [
            n
            for n in expected
            if n not in states or not states[n].up or held_by_a_stopped_pod(states[n])
        ]
        if not waiting:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            named = ", ".join(
                f"{n} {states[n].label if n in states else NOT_REGISTERED}"
                for n in waiting[:SHOWN_NAMES]
            )
            more = f" and {len(waiting) - SHOWN_NAMES} more" if len(waiting) > SHOWN_NAMES else ""
            raise LocalModeError(f"nodes not up after {timeout:.0f} s: {named}{more} ({counts})")
        time.sleep(max(POLL_SECONDS, 2 * (time.monotonic() - asked)))


def _controller_run(cluster: Cluster, *command: str) -> str | None:
    """A Slurm command's output in the controller pod; None when it is not running or the
    command failed."""
    controller = cluster.running_controller()
    if controller is None:
        return None
    result = cluster.run(controller, list(command))
    return result.stdout if result.returncode == 0 else None


def _states(cluster: Cluster) -> dict[str, NodeState]:
    """node_states, {} when the controller's answer cannot be had or read: `down` goes on."""
    try:
        return node_states(cluster)
    except (LocalModeError, OSError):
        return {}


def _down_reason(node: NodeState) -> str | None:
    """The reason `down` marks a stopped worker's node DOWN with; None to leave it as it is:
    DOWN or powered down already, or drained by another with no job left there (their
    drain says all). Over another's drain it keeps their words: DOWN keeps the DRAIN, and
    requeues the jobs still held there."""
    if node.state == "down" or node.powered_down:
        return None
    if drained_by_another(node):
        return (node.reason or REASON) if holds_jobs(node) else None
    return REASON


def held_by_a_stopped_pod(node: NodeState) -> bool:
    """Drained as `slonk:pod:` (a pod stopping, or `down`): its new pod lifts it once its
    slurmd registered (slonk.pod.worker_stop.release)."""
    return node.drained and not drained_by_another(node)


def _update(cluster: Cluster, names: Collection[str], *settings: str) -> bool:
    nodelist = hostlist.collect_hostlist(sorted(names))  # one argument, however many nodes
    command = ("scontrol", "update", f"nodename={nodelist}", *settings)
    return _controller_run(cluster, *command) is not None


def _mark(cluster: Cluster, reasons: Mapping[str, str]) -> bool:
    """DOWN, each node in its reason. Ours DRAIN first: DOWN keeps it, and no message a node
    sent before it stopped (answered late, it returns a DOWN node to service) can bring a
    job onto it before the controller stops: it takes none until its new pod lifts that."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in reasons.items():
        by_reason.setdefault(reason, []).append(name)
    return all(
        (reason != REASON or _update(cluster, names, "state=drain", f"reason={reason}"))
        and _update(cluster, names, "state=down", f"reason={reason}")
        for reason, names in by_reason.items()
    )


def mark_down(cluster: Cluster, nodes: Collection[str], progress: Callable[[str], None]) -> None:
    """After `down` powered these workers off, before the controller: their nodes DOWN, so
    that slurmctld requeues their jobs and saves no stopped node as up (a job it still held
    there would be a ghost after the next `up`), not-responding ones too. One call for all
    but the drains of others that still hold jobs (_down_reason); asked again until
    DOWN_WAIT_SECONDS while the controller does not answer."""
    deadline = time.monotonic() + DOWN_WAIT_SECONDS
    left: dict[str, str] = {}
    marked = 0
    answered = False
    while nodes:
        states = _states(cluster)
        if states:
            answered = True
            left = {n: r for n in nodes if n in states and (r := _down_reason(states[n]))}
            if not left:
                break
            if _mark(cluster, left):
                marked, left = len(left), {}
                break
        if time.monotonic() >= deadline:
            break
        time.sleep(RETRY_SECONDS)
    if marked:
        progress(f"  marked {marked} nodes down")
    if nodes and not answered:
        progress(
            f"  the controller did not answer for {DOWN_WAIT_SECONDS:g} s: {len(nodes)} nodes not "
            "marked down; jobs it saved as running there are not requeued (after `up`, "
            "`squeue -t R` lists them)"
        )
    elif left:
        progress(f"  could not mark {len(left)} nodes down: {hostlist.collect_hostlist(left)}")
