"""Topology from the Kubernetes Nodes' labels (`syncer.topologyLabels`), applied to Slurm at a
pace slurmctld can bear, whatever the labels do.

A new topology reaches Slurm by `scontrol reconfigure`: slurmctld 24.11 saves its state and
re-executes itself, and users' commands wait (or fail) until the new process answers. Labels
are written by whoever may label a Node, a node's own kubelet included: a label flapping 40
times in 40 s once meant 40 re-executions. So the placement the passes find goes through a
Gate. Its first difference from the placement Slurm runs opens a window of WINDOW_SECONDS;
every change within it is merged, and at its end the placement as it is then is applied once,
or not at all when the labels came back to what Slurm runs. A topology is applied at most once
per MIN_INTERVAL_SECONDS, counted from the saved placement's time so that a restarted syncer
keeps the pace. Each decision is one log line saying how many changes it coalesced.

Why these bounds: a topology only steers where new jobs land (a stale one costs placement
quality, never a job), so waiting is cheap; the re-execution is not, and grows with the
cluster (it saves and recovers every node and job). 30 s between reconfigures keeps even a
re-execution of several seconds on a large cluster to a small share of slurmctld's time (in
local mode, 4 nodes, a user's `squeue` looping across one took 121 ms at worst, 20 ms as a
rule: tests/integration/test_local_topology.py); a window of 10 s merges what one operator's
script or a node's relabelling does in a burst (21 kubectl label calls took 6.5 s).
The waiting is the syncer's alone: users' commands only ever wait for the re-execution.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from slonk.base import paths
from slonk.config import placement
from slonk.config.model import SyncerSettings, default_of
from slonk.config.spec import ClusterSpec, SpecError, load_spec

# The defaults of syncer.topologyWindowSeconds and topologyMinIntervalSeconds.
WINDOW_SECONDS = float(default_of(SyncerSettings, "topology_window_seconds"))
MIN_INTERVAL_SECONDS = float(default_of(SyncerSettings, "topology_min_interval_seconds"))
SHOWN_NODES = 5  # a log line names this many moved nodes, then counts the rest

Places = dict[str, dict[str, str]]


def merged(saved: Places, found: Mapping[str, Mapping[str, str]]) -> Places:
    """The placement to run: what the pass found, and the last place of every node it did
    not find (a node whose pod is not running: lending a node must not reconfigure Slurm)."""
    new = {n: dict(w) for n, w in saved.items() if n not in found}
    new |= {n: dict(w) for n, w in found.items() if w}
    return placement.clean(new)


def moved(old: Places, new: Places) -> str:
    """`slonk-b-1 block=nvl1 (was nvl2)`, for each node whose place differs, bounded."""
    names = sorted(n for n in old.keys() | new.keys() if old.get(n) != new.get(n))

    def where(node: str) -> str:
        now, was = new.get(node, {}), old.get(node, {})
        parts = [
            f"{k}={now.get(k, '-')} (was {was.get(k, '-')})"
            for k in placement.ATTRIBUTES
            if now.get(k) != was.get(k)
        ]
        return f"{node} {' '.join(parts)}"

    shown = ", ".join(where(n) for n in names[:SHOWN_NODES])
    more = len(names) - SHOWN_NODES
    return shown + (f" and {more} more" if more > 0 else "")


def saved_at() -> float | None:
    """When a placement was last applied (the saved file's time), None if never."""
    try:
        return paths.PLACEMENT.stat().st_mtime
    except OSError:
        return None


@dataclass
class Gate:
    """Holds placement changes back: see the module's docstring. Times are the clock's
    (wall-clock seconds, comparable with the saved placement's time)."""

    window: float = WINDOW_SECONDS
    interval: float = MIN_INTERVAL_SECONDS
    clock: Callable[[], float] = time.time
    applied_at: float | None = field(default_factory=saved_at)
    opened: float | None = None  # when the held change was first seen; None: nothing held
    seen: int = 0  # distinct placements seen since
    latest: Places | None = None

    def due(self) -> float | None:
        """When the held change is decided; None when nothing is held."""
        if self.opened is None:
            return None
        at = self.opened + self.window
        return at if self.applied_at is None else max(at, self.applied_at + self.interval)

    def offer(self, applied: Places, found: Places) -> tuple[bool, str | None]:
        """One pass's placement against the applied one: (apply it now?, what to log)."""
        now = self.clock()
        if self.opened is None:
            if found == applied:
                return False, None
            self.opened, self.seen, self.latest = now, 1, found
            if self.applied_at is not None:  # a clock set back must not hold it for ever
                self.applied_at = min(self.applied_at, now)
            wait = (self.due() or now) - now
            return False, (
                f"placement changed: {moved(applied, found)}; applied in {wait:.0f} s "
                "with any change that follows, unless the labels come back"
            )
        if found != self.latest:
            self.seen, self.latest = self.seen + 1, found
        due = self.due()
        if due is None or now < due:
            return False, None
        seen, took = self.seen, now - self.opened
        self.opened, self.latest = None, None
        if found == applied:
            return False, (
                f"{seen} placement change(s) seen in {took:.0f} s came back to the applied "
                "topology: no reconfigure"
            )
        return (
            True,
            f"{seen} placement change(s) seen in {took:.0f} s coalesced into one reconfigure",
        )

    def tried(self) -> None:
        """slurmctld was asked to run it (whether it did or refused): the pace counts from now."""
        self.applied_at = self.clock()

    def postpone(self) -> None:
        """slurmctld could not take it now (nothing was asked of it): held for another window."""
        self.opened, self.seen, self.latest = self.clock(), 0, None


def place(
    found: Mapping[str, Mapping[str, str]], spec: ClusterSpec, gate: Gate | None = None
) -> list[str]:
    """Save where pods landed and have slurmctld run the topology when it changed: through
    the syncer's gate, or at once without one (`slonk align --fix`, a person's one pass)."""
    old = placement.load()
    new = merged(old, found)
    if gate is None:
        return [_apply(old, new, spec, "placement changed")] if new != old else []
    go, said = gate.offer(old, new)
    if not go:
        return [said] if said else []
    return [_apply(old, new, spec, said or "placement changed", gate)]


def _apply(old: Places, new: Places, spec: ClusterSpec, said: str, gate: Gate | None = None) -> str:
    """Save the placement and have slurmctld run it; returns the line to log."""
    placement.save(new)
    from slonk.pod.config_watch import Controller, NotApplied, NotNow  # the controller's alone

    said += f" ({moved(old, new)})"
    try:
        done = Controller().apply(lambda: load_spec(paths.CLUSTER_SPEC))
    except NotNow as err:
        placement.save(old)  # tried again, as a change still
        if gate is not None:
            gate.postpone()
        return f"{said}: topology waits for slurmctld: {err}"
    except (NotApplied, SpecError) as err:
        done = f"topology not applied: {err}"
    if gate is not None:
        gate.tried()
    return f"{said}: {done}"
