"""Each role's sources: what one scrape reads. Slurm is read once per scrape whatever the
node count: three commands, never one per node."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from slonk.base import paths
from slonk.base.identity import pod_name
from slonk.config.model import ClusterSpec
from slonk.metrics.cluster import job_families, node_families
from slonk.metrics.events import EventCounter, syncer_families
from slonk.metrics.family import Family
from slonk.metrics.gpus import gpu_families, nvlink_families
from slonk.metrics.health import health_families
from slonk.metrics.sdiag import COMMAND as SDIAG
from slonk.metrics.sdiag import sdiag_families
from slonk.slurm import control
from slonk.slurm.slurm_nodes import run
from slonk.slurm.slurm_state import QUEUE, SHOW_NODES

Source = Callable[[], list[Family]]
CONTROL_LOOK_SECONDS = 2.0


class Spec:
    """cluster.yaml's pools and partitions, read again when the file changes (config-watch
    applies a new one without restarting this service)."""

    def __init__(self, path: Path = paths.CLUSTER_SPEC) -> None:
        self.path = path
        self.seen: tuple[int, int] | None = None
        self.pools: dict[str, str] = {}
        self.partitions: frozenset[str] = frozenset()
        self.cluster: ClusterSpec | None = None
        self.lock = threading.Lock()
        self.control: tuple[float, bool] | None = None  # when it was looked at, and the answer

    def refresh(self) -> None:
        stat = self.path.stat()
        if (stat.st_mtime_ns, stat.st_size) == self.seen:
            return
        from slonk.config.spec import load_spec

        spec = load_spec(self.path)
        self.cluster = spec
        self.pools = {
            node: pool.name for pool in spec.nodepools for node in pool.node_names(spec.release)
        }
        self.partitions = frozenset(p.name for p in spec.partitions)
        self.seen = (stat.st_mtime_ns, stat.st_size)

    def pool_of(self, node: str) -> str:
        return self.pools.get(node, "")

    def in_control(self) -> bool:
        """Whether this controller pod's slurmctld holds control (slonk.slurm.control). One
        look serves CONTROL_LOOK_SECONDS: a scrape reads its sources at once, in threads, and
        each asks (with a backup, a read of Slurm's heartbeat a look)."""
        with self.lock:
            now = time.monotonic()
            if self.control is None or now - self.control[0] >= CONTROL_LOOK_SECONDS:
                self.refresh()
                held = self.cluster is not None and control.in_control(self.cluster, pod_name())
                self.control = (now, held)
            return self.control[1]


def controller(spec: Spec | None = None) -> dict[str, Source]:
    spec = spec or Spec()
    counter: EventCounter | None = None

    def nodes() -> list[Family]:
        spec.refresh()
        return node_families(run(list(SHOW_NODES)), spec.pool_of)

    def jobs() -> list[Family]:
        spec.refresh()
        per_job = spec.cluster is not None and not spec.cluster.jobs_private()
        return job_families(run(list(QUEUE)), spec.partitions, spec.pool_of, per_job)

    def history() -> list[Family]:
        nonlocal counter
        counter = counter or EventCounter(paths.NODE_HISTORY)
        return counter.families()

    def once(source: Source) -> Source:
        """The cluster's figures from the pod in control alone: with a backup controller,
        both pods would export the same nodes and jobs, and every sum would count them twice."""
        return lambda: source() if spec.in_control() else []

    return {
        "nodes": once(nodes),
        "jobs": once(jobs),
        "sdiag": once(lambda: sdiag_families(run(list(SDIAG)))),
        "history": once(history),
        "syncer": once(lambda: syncer_families(paths.SYNCER_STATS)),
    }


def worker(node: str) -> dict[str, Source]:
    return {
        "health": lambda: health_families(paths.HEALTH_STATE, node),
        "gpus": lambda: gpu_families(node),
        "nvlink": lambda: nvlink_families(node),
    }
