"""A local cluster's Slurm nodes as its controller sees them: the wait for them to be up, and
what `down` asks of the controller once the workers stopped."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import TextIO

from slonk.local.manifests import LocalModeError
from slonk.local.state import Cluster
from slonk.slurm_state import SHOW_NODES, NodeState, SlurmError, parse_nodes
from slonk.worker_stop import REASON, drained_by_another

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
    controller = cluster.pod_names("controller")
    if not controller or cluster.pid(controller[0]) is None:
        return {}
    result = cluster.run(controller[0], list(SHOW_NODES))
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
    Slurm nodes; returns the seconds it took. Fails as soon as one of `pods` or the controller
    stops, or after `timeout` (default: NODES_UP_TIMEOUT_SECONDS and a little per node),
    naming the nodes not up. Progress: one line of counts, each time they change."""
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
        waiting = [n for n in expected if n not in states or not states[n].up]
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
    controller = cluster.pod_names("controller")
    if not controller or cluster.pid(controller[0]) is None:
        return None
    result = cluster.run(controller[0], list(command))
    return result.stdout if result.returncode == 0 else None


def _left_up(node: NodeState) -> bool:
    return not (node.state == "down" or node.powered_down or drained_by_another(node))


def mark_down(cluster: Cluster, nodes: Collection[str], progress: Callable[[str], None]) -> None:
    """After `down` powered these workers off, before the controller: their nodes DOWN in one
    call, so that slurmctld requeues their jobs and saves no stopped node as up. A node
    drained by anyone but a pod is left as it is, as a stopping pod leaves it, and so is one
    DOWN or powered down already. A node slurmctld counts as not responding is marked too:
    a job it still holds there would be a ghost after the next `up`."""
    states = node_states(cluster)
    if nodes and not states:
        progress(f"  the controller did not answer: {len(nodes)} nodes left as it last saw them")
        return
    ours = [n for n in nodes if n in states and _left_up(states[n])]
    if ours:
        update = ["scontrol", "update", f"nodename={','.join(sorted(ours))}"]
        said = _controller_run(cluster, *update, "state=down", f"reason={REASON}")
        # DOWN alone, as the pods leave it (slonk.worker_stop): the new slurmd returns it.
        drained = [n for n in ours if states[n].drained]
        if said is not None and drained:
            undrain = ["scontrol", "update", f"nodename={','.join(sorted(drained))}"]
            said = _controller_run(cluster, *undrain, "state=undrain")
        failed = "" if said is not None else " (scontrol failed)"
        progress(f"  marked {len(ours)} nodes down{failed}")
