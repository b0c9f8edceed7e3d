"""The controller's schedule of active checks (the agent's task `health-active`).

Each node of a pool with active checks (slonk.config.active_checks) runs them as a Slurm job
every `intervalSeconds`, only while it is idle: the job goes to the node by name, whole
(`--exclusive`, every GPU), in the hidden partition of the lowest PriorityTier, where any
user's job preempts it (PreemptMode=CANCEL, slonk.config.render): no user waits on a check.
On the node it runs `slonk health run --phase active --drain` as root, which drains
`slonk:active:<check>` with the figure that failed (slonk.health.active).

Submissions are spread: at most `startsPerMinute` a minute, cluster-wide, the longest-unchecked
nodes first, so a round over thousands of nodes never reaches slurmctld as a herd. A check
preempted by a user's job is tried again after RETRY_SECONDS; one that ran, passed or not, is
due again after the interval. A node's new pod ran its checks at boot (the gate), so a node
whose slurmd started within the interval counts as checked then. Checks that span a block
(slonk.align.fabric) go first in each pass, within the same allowance.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from slonk.align import check_jobs, fabric
from slonk.base import paths
from slonk.base.files import exclusive
from slonk.base.identity import pod_name
from slonk.config import active_checks
from slonk.config.model import NodePool
from slonk.config.spec import ClusterSpec, SpecError
from slonk.slurm import control, gate, slurm_nodes
from slonk.slurm.slurm_state import NodeState, SlurmError

PASS_LOCK = paths.STATE_SAVE / "slonk-active.lock"
PERIOD_SECONDS = 10.0
# A check a user's job preempted waits this long before its next try: a node in steady use
# is not offered a check every pass, each costing its next job a preemption.
RETRY_SECONDS = 600.0
JOB_NAME = "slonk-active"
COMMAND = "exec /usr/local/bin/slonk health run --phase active --drain"


@dataclass
class Schedule(check_jobs.Saved):
    """When each node last ran its checks or was last tried, and the check jobs in flight."""

    path = paths.STATE_SAVE / "slonk-active.json"
    ran: dict[str, float] = field(default_factory=dict)
    tried: dict[str, float] = field(default_factory=dict)  # preempted or refused
    jobs: dict[str, str] = field(default_factory=dict)  # job id -> node
    queued: dict[str, float] = field(default_factory=dict)  # job id -> when it was submitted
    tokens: float = 0.0  # starts this pass may still make (allowance)
    stamp: float = 0.0  # when tokens were counted

    @classmethod
    def parse(cls, data: Any) -> Schedule:
        return cls(
            ran={str(k): float(v) for k, v in data["ran"].items()},
            tried={str(k): float(v) for k, v in data["tried"].items()},
            jobs={str(k): str(v) for k, v in data["jobs"].items()},
            queued={str(k): float(v) for k, v in data.get("queued", {}).items()},  # 0.19.0
            tokens=float(data.get("tokens", 0.0)),
            stamp=float(data.get("stamp", 0.0)),
        )


def settle(
    schedule: Schedule, states: dict[str, str], now: float, nodes: Iterable[NodeState]
) -> None:
    """Forget the jobs that ended: a check that ran (whatever it found: it drained by itself)
    makes its node due after the interval; one that never ran (preempted, or withdrawn from
    the queue, check_jobs.settled_state), after RETRY_SECONDS."""
    quiet = {n.name for n in nodes if check_jobs.quiet(n)}
    for job, node in list(schedule.jobs.items()):
        queued_at = schedule.queued.get(job, 0.0)
        state = check_jobs.settled_state(job, states.get(job, ""), queued_at, now, node in quiet)
        if state in check_jobs.LIVE:
            continue
        del schedule.jobs[job]
        schedule.queued.pop(job, None)
        if state in check_jobs.NOT_RUN:
            schedule.tried[node] = now
            check_jobs.log(f"check job {job} on {node} {state.lower()}: tried again later")
        else:
            schedule.ran[node] = now


def own_checks(spec: ClusterSpec, pool: NodePool) -> bool:
    """Whether the pool's nodes have checks of their own to run (not only ones that span a
    block, slonk.align.fabric)."""
    return any(not active_checks.spans_block(c) for c in spec.active_checks(pool).values())


def due(spec: ClusterSpec, nodes: Iterable[NodeState], schedule: Schedule, now: float) -> list[str]:
    """The quiet nodes whose checks are due, longest unchecked first."""
    assert spec.health is not None and spec.health.active is not None
    settings = spec.health.active
    busy = set(schedule.jobs.values())
    found = []
    for node in nodes:
        pool = spec.pool_of(node.name)
        if (
            pool is None
            or not own_checks(spec, pool)
            or node.name in busy
            or not check_jobs.quiet(node)
        ):
            continue
        last = schedule.ran.get(node.name, 0.0)
        if settings.gate and node.slurmd_started.isdigit():
            last = max(last, float(node.slurmd_started))  # its pod ran them at boot
        if now - last < settings.interval_seconds:
            continue
        if now - schedule.tried.get(node.name, 0.0) < RETRY_SECONDS:
            continue
        found.append((last, node.name))
    return [name for _, name in sorted(found)]


def allowance(schedule: Schedule, per_minute: int, now: float) -> int:
    """How many jobs this pass may submit: a bucket filled at `per_minute`, holding one start
    more than a pass's worth (so no fraction is lost between passes), so starts stay spread
    whatever the passes' timing."""
    rate = per_minute / 60.0
    elapsed = now - schedule.stamp if 0 < schedule.stamp <= now else PERIOD_SECONDS
    schedule.tokens = min(schedule.tokens + rate * elapsed, rate * PERIOD_SECONDS + 1.0)
    schedule.stamp = now
    return math.floor(schedule.tokens)


def submit_argv(spec: ClusterSpec, node: str) -> list[str]:
    """sbatch for one node's checks (check_jobs.submit_argv), every GPU of it; its time limit
    holds every check of the node."""
    pool = spec.pool_of(node)
    assert pool is not None
    minutes = active_checks.time_limit_minutes(spec.active_checks(pool))
    gpus = pool.gpus.count if pool.gpus else 0
    return check_jobs.submit_argv([node], gpus, minutes, JOB_NAME, COMMAND)


def pass_once(spec: ClusterSpec, schedule: Schedule, blocks: fabric.Schedule, now: float) -> None:
    """One pass: the checks that span a block first (each needs several idle nodes at once),
    then each node's own, within one allowance of starts."""
    assert spec.health is not None and spec.health.active is not None
    said: dict[str, str] = {}
    states = check_jobs.states(said)
    nodes = slurm_nodes.read_nodes()
    settle(schedule, states, now, nodes)
    starts = allowance(schedule, spec.health.active.starts_per_minute, now)
    # Always: a check turned off still has its jobs to settle and its state to forget. At
    # most half the starts (rounded up): the nodes' own checks are never starved.
    share = (starts + 1) // 2
    busy = set(schedule.jobs.values())
    made = fabric.pass_once(spec, blocks, states, nodes, busy, share, now, RETRY_SECONDS, said)
    schedule.tokens -= made
    starts -= made
    # Not a node a block run holds, nor one the gate holds (drained this pass by a search, as
    # `nodes` was read before: a job there would wait in the queue, and keep the block's next
    # run off the node, until withdrawn).
    taken = {n for job in blocks.jobs.values() for n in job.nodes} | set(blocks.held)
    candidates = [n for n in due(spec, nodes, schedule, now) if n not in taken]
    for node in candidates[:starts]:
        try:
            job = slurm_nodes.run(submit_argv(spec, node), failed=f"sbatch for {node}").strip()
        except SlurmError as err:
            schedule.tried[node] = now  # taken meanwhile: it is not quiet, and waits
            check_jobs.log(f"not checking {node} now: {err}")
        else:
            schedule.jobs[job.split(";")[0]] = node
            schedule.queued[job.split(";")[0]] = now
            check_jobs.log(f"checking {node}: job {job}")
        schedule.tokens -= 1


def _gate_opened(in_control: bool) -> bool:
    """Whether the block checks' gate holds nobody (slonk.slurm.gate): the pod in control
    withdraws the runs in its reservation (Slurm deletes none a job uses) and lets every node
    out, since no pass will; the other waits for that (a takeover meanwhile)."""
    try:
        still = gate.held()
        if still and in_control:
            slurm_nodes.run(["scancel", f"--reservation={gate.NAME}"], failed="scancel")
            still = gate.release(still)
    except (SlurmError, OSError) as err:
        check_jobs.log(f"gate: could not let its nodes out yet: {err}")
        return False
    return not still


def run_forever(load: Callable[[], ClusterSpec], stop: threading.Event) -> None:
    """A pass every PERIOD_SECONDS, by the controller pod in control, until `stop`."""
    schedule: Schedule | None = None
    blocks = fabric.Schedule()
    spec = load()
    while not stop.wait(PERIOD_SECONDS):
        try:
            spec = load()
        except SpecError as err:
            check_jobs.log(f"keeping the last good settings: {err}")
        if spec.health is None or spec.health.active is None:
            if _gate_opened(control.in_control(spec, pod_name())):
                check_jobs.log("active checks are off")
                return
            continue
        if not control.in_control(spec, pod_name()):
            schedule = None  # read again when this pod holds control again
            continue
        with exclusive(PASS_LOCK, wait=False) as mine:
            if not mine:
                continue
            if schedule is None or spec.backup_controller is not None:
                schedule, blocks = Schedule.load(), fabric.Schedule.load()
            try:
                pass_once(spec, schedule, blocks, time.time())
            except SlurmError as err:
                check_jobs.log(f"pass skipped: {err}")
            except Exception as err:  # a crash-loop would stop every check
                check_jobs.log(
                    f"pass failed, trying again next period: {type(err).__name__}: {err}"
                )
            schedule.save()
            blocks.save()
