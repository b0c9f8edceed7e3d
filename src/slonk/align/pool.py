"""`slonk pool scale POOL N`: lend a pool's highest ordinals (to inference, say) only once they
are drained and idle, or give them back.

Scaling down sets the pool's target first (slonk.align.lending) and drains the nodes above it
(`slonk:k8s:lent`), which the syncer then counts as lent; once none of them runs a job, the
StatefulSet is scaled and its controller removes exactly those pods. Scaling up just scales:
the syncer gives each node back once its pod runs. `kubectl scale` works too, without the wait: the
removed pods' preStop drains them and waits up to workers.drainTimeoutSeconds."""

from __future__ import annotations

import sys
import time

from slonk.align import lending
from slonk.align.kube import Cluster
from slonk.config.spec import ClusterSpec, SpecError
from slonk.slurm import power, slurm_nodes
from slonk.slurm.slurm_state import SlurmError

POLL_SECONDS = 2.0


def _not_yet_free(names: list[str]) -> list[str]:
    """The nodes that could still start a job or run one: not drained yet, or busy."""
    if not names:
        return []
    jobs = slurm_nodes.running_jobs()
    drained = {n.name for n in slurm_nodes.read_nodes(*names) if n.drained}
    return [n for n in names if n not in drained or jobs.get(n)]


def scale(spec: ClusterSpec, pool_name: str, replicas: int, timeout: float | None) -> str:
    pools = {p.name: p for p in spec.nodepools}
    if pool_name not in pools:
        raise SpecError(f"no pool {pool_name!r}: pools are {', '.join(sorted(pools)) or 'none'}")
    size = pools[pool_name].replicas
    if not 0 <= replicas <= size:
        raise SpecError(
            f"{pool_name} has {size} nodes in Slurm (nodepools.{pool_name}.replicas): "
            f"scale it between 0 and {size}, or change the chart's value"
        )
    kube = Cluster(spec.namespace, spec.release, resync_seconds=60)
    statefulset = f"{spec.release}-{pool_name}"
    leaving = [f"{statefulset}-{i}" for i in range(replicas, size)]
    lending.set_target(pool_name, replicas)  # the syncer drops it once the replicas follow
    try:
        why = f"slonk pool scale {pool_name} {replicas}"
        for node in slurm_nodes.read_nodes(*leaving) if leaving else []:
            if not node.drained:  # at once, syncer or not; anyone's drain stays as it is
                slurm_nodes.drain(node.name, power.lent_reason(why))
        deadline = None if timeout is None else time.monotonic() + timeout
        while busy := _not_yet_free(leaving):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{', '.join(busy)} not drained and idle")
            print(f"waiting for {', '.join(busy)} to drain", file=sys.stderr, flush=True)
            time.sleep(POLL_SECONDS)
        kube.scale(statefulset, replicas)
    except BaseException as err:  # a timeout, ^C, Slurm or the API: nothing is lent
        _give_up(pool_name, leaving)
        if isinstance(err, TimeoutError):
            return f"gave up: {err}; nothing lent"
        raise
    lent = f"; lent: {', '.join(leaving)}" if leaving else ""
    return f"scaled {statefulset} to {replicas}{lent}"


def _give_up(pool_name: str, leaving: list[str]) -> None:
    """Drop the target and lift the lent drains of nodes still up: none of them is lent."""
    lending.set_target(pool_name, None)
    try:
        for node in slurm_nodes.read_nodes(*leaving) if leaving else []:
            if node.drained and power.is_lent_reason(node.reason) and node.up:
                slurm_nodes.resume(node.name)
    except SlurmError as err:  # the syncer lifts them, if it runs
        print(f"could not lift the lent drains: {err}", file=sys.stderr, flush=True)
