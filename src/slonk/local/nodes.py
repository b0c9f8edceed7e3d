"""A local cluster's Slurm nodes as its controller sees them, and the wait for them to be up."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from slonk.local.manifests import LocalModeError
from slonk.local.state import Cluster
from slonk.slurm_state import SHOW_NODES, NodeState, SlurmError, parse_nodes

NODES_UP_TIMEOUT_SECONDS = 120.0


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


def wait_nodes_up(
    cluster: Cluster,
    timeout: float = NODES_UP_TIMEOUT_SECONDS,
    progress: Callable[[str], None] = print,
    pods: Sequence[str] | None = None,
) -> float:
    """Wait until the worker pods among `pods` (default: every pod) are registered, responding
    Slurm nodes; returns the seconds it took. Fails as soon as one of `pods` or the controller
    stops, or after `timeout` naming each node's state."""
    started = time.monotonic()
    watched = set(cluster.pod_names() if pods is None else pods)
    watched |= set(cluster.pod_names("controller"))
    expected = watched & set(cluster.pod_names("worker"))
    last = None
    while True:
        for name in sorted(watched):
            if cluster.pid(name) is None:
                log = cluster.log(name).splitlines()[-15:]
                raise LocalModeError(f"pod {name} stopped while starting:\n" + "\n".join(log))
        states = node_states(cluster)
        summary = ", ".join(
            f"{n} {states[n].label if n in states else 'not registered'}" for n in sorted(expected)
        )
        if summary != last:
            progress(f"  nodes: {summary or 'none'}")
            last = summary
        if all(n in states and states[n].up for n in expected):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise LocalModeError(f"nodes not up after {timeout:.0f} s: {summary}")
        time.sleep(0.05)
