"""`slonk pool scale POOL N`: lend a pool's highest ordinals (to inference, say) only once they
are drained and idle, or give them back.

Scaling down writes the target to paths.LENDING first: the syncer then counts the nodes above
it as lent and drains them (`slonk:k8s:lent`); once none of them runs a job, the StatefulSet
is scaled and its controller removes exactly those pods. Scaling up just scales: the syncer
gives each node back once its pod runs. `kubectl scale` works too, without the wait: the
removed pods' preStop drains them and waits up to workers.drainTimeoutSeconds."""

from __future__ import annotations

import json
import sys
import time

from slonk import paths, slurm_nodes
from slonk.align.kube import Cluster
from slonk.align.syncer import lending
from slonk.config.spec import ClusterSpec, SpecError
from slonk.files import write_atomically

POLL_SECONDS = 2.0


def _set_lending(pool: str, target: int | None) -> None:
    targets = lending()
    if target is None:
        targets.pop(pool, None)
    else:
        targets[pool] = target
    paths.LENDING.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(paths.LENDING, json.dumps(targets, sort_keys=True))


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
    _set_lending(pool_name, replicas)
    deadline = None if timeout is None else time.monotonic() + timeout
    while busy := _not_yet_free(leaving):
        if deadline is not None and time.monotonic() > deadline:
            _set_lending(pool_name, None)  # nothing was taken: the syncer lifts the drains
            return f"gave up: {', '.join(busy)} not drained and idle; nothing lent"
        print(f"waiting for {', '.join(busy)} to drain", file=sys.stderr, flush=True)
        time.sleep(POLL_SECONDS)
    kube.scale(statefulset, replicas)
    _set_lending(pool_name, None)  # the StatefulSet's replicas say it from now on
    lent = f"; lent: {', '.join(leaving)}" if leaving else ""
    return f"scaled {statefulset} to {replicas}{lent}"
