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
whose slurmd started within the interval counts as checked then.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from slonk.base import paths
from slonk.base.files import exclusive, write_atomically
from slonk.base.identity import pod_name
from slonk.config import active_checks
from slonk.config.spec import ClusterSpec, SpecError
from slonk.slurm import control, slurm_nodes
from slonk.slurm.slurm_state import NodeState, SlurmError

STATE = paths.STATE_SAVE / "slonk-active.json"
PASS_LOCK = paths.STATE_SAVE / "slonk-active.lock"
PERIOD_SECONDS = 10.0
# A check a user's job preempted waits this long before its next try: a node in steady use
# is not offered a check every pass, each costing its next job a preemption.
RETRY_SECONDS = 600.0
JOB_NAME = "slonk-active"
COMMAND = "exec /usr/local/bin/slonk health run --phase active --drain"
# The states of a job still queued or running; any other state has ended.
LIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "RESIZING", "SUSPENDED"})
NOT_RUN = frozenset({"PREEMPTED", "CANCELLED", "BOOT_FAIL", "DEADLINE"})


def log(message: str) -> None:
    print(f"slonk health-active: {message}", file=sys.stderr, flush=True)


@dataclass
class Schedule:
    """When each node last ran its checks or was last tried, and the check jobs in flight."""

    ran: dict[str, float] = field(default_factory=dict)
    tried: dict[str, float] = field(default_factory=dict)  # preempted or refused
    jobs: dict[str, str] = field(default_factory=dict)  # job id -> node
    tokens: float = 0.0  # starts this pass may still make (allowance)
    stamp: float = 0.0  # when tokens were counted

    @classmethod
    def load(cls) -> Schedule:
        try:
            data = json.loads(STATE.read_text())
            return cls(
                ran={str(k): float(v) for k, v in data["ran"].items()},
                tried={str(k): float(v) for k, v in data["tried"].items()},
                jobs={str(k): str(v) for k, v in data["jobs"].items()},
                tokens=float(data.get("tokens", 0.0)),
                stamp=float(data.get("stamp", 0.0)),
            )
        except FileNotFoundError:
            return cls()
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            log(f"{STATE} unreadable, starting afresh: {err}")
            return cls()

    def save(self) -> None:
        record = asdict(self)
        try:
            write_atomically(STATE, json.dumps(record) + "\n")
        except OSError as err:
            log(f"could not save {STATE}: {err}")


def settle(schedule: Schedule, states: dict[str, str], now: float) -> None:
    """Forget the jobs that ended: a check that ran (whatever it found: it drained by itself)
    makes its node due after the interval; one that never ran (preempted, or still pending a
    pass after its submission, then cancelled), after RETRY_SECONDS."""
    for job, node in list(schedule.jobs.items()):
        state = states.get(job, "")
        if state == "PENDING":
            # The node was taken between the look and the submission: the check waits for
            # the node to be idle again, not in the queue.
            with contextlib.suppress(SlurmError):
                slurm_nodes.run(["scancel", job], failed=f"scancel {job}")
            state = "CANCELLED"
        if state in LIVE:
            continue
        del schedule.jobs[job]
        if state in NOT_RUN:
            schedule.tried[node] = now
            log(f"check job {job} on {node} {state.lower()}: tried again later")
        else:
            schedule.ran[node] = now


def quiet(node: NodeState) -> bool:
    """Idle, answering, and nothing else: no drain, no power change, no reservation."""
    return node.state == "idle" and not node.flags


def due(spec: ClusterSpec, nodes: Iterable[NodeState], schedule: Schedule, now: float) -> list[str]:
    """The quiet nodes whose checks are due, longest unchecked first."""
    assert spec.health is not None and spec.health.active is not None
    settings = spec.health.active
    busy = set(schedule.jobs.values())
    found = []
    for node in nodes:
        pool = spec.pool_of(node.name)
        if pool is None or not spec.active_checks(pool) or node.name in busy or not quiet(node):
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
    """sbatch for one node's checks: the whole node, by name, in the checks' partition.
    (sbatch has no --immediate: one still pending at the next pass is cancelled, `settle`.)"""
    assert spec.health is not None and spec.health.active is not None
    pool = spec.pool_of(node)
    assert pool is not None
    gres = [f"--gres=gpu:{pool.gpus.count}"] if pool.gpus else []
    return [
        "sbatch",
        "--parsable",
        f"--partition={active_checks.PARTITION}",
        f"--nodelist={node}",
        "--exclusive",
        "--mem=0",
        *gres,
        f"--time={active_checks.time_limit_minutes(spec.active_checks(pool))}",
        f"--job-name={JOB_NAME}",
        "--chdir=/",  # not the agent's directory, nor slurmstepd's /tmp if that is missing
        "--output=/dev/null",
        f"--wrap={COMMAND}",
    ]


def job_states() -> dict[str, str]:
    """Every check job Slurm still shows, with its state (ended ones stay MinJobAge)."""
    out = slurm_nodes.run(
        [
            "squeue",
            "--noheader",
            "--all",
            "--states=all",
            f"--partition={active_checks.PARTITION}",
            "--format=%i %T",
        ],
        failed="squeue",
    )
    return dict(line.split(maxsplit=1) for line in out.splitlines() if " " in line)


def pass_once(spec: ClusterSpec, schedule: Schedule, now: float) -> None:
    assert spec.health is not None and spec.health.active is not None
    settle(schedule, job_states(), now)
    candidates = due(spec, slurm_nodes.read_nodes(), schedule, now)
    for node in candidates[: allowance(schedule, spec.health.active.starts_per_minute, now)]:
        try:
            job = slurm_nodes.run(submit_argv(spec, node), failed=f"sbatch for {node}").strip()
        except SlurmError as err:
            schedule.tried[node] = now  # taken meanwhile: it is not quiet, and waits
            log(f"not checking {node} now: {err}")
        else:
            schedule.jobs[job.split(";")[0]] = node
            log(f"checking {node}: job {job}")
        schedule.tokens -= 1


def run_forever(load: Callable[[], ClusterSpec], stop: threading.Event) -> None:
    """A pass every PERIOD_SECONDS, by the controller pod in control, until `stop`."""
    schedule: Schedule | None = None
    spec = load()
    while not stop.wait(PERIOD_SECONDS):
        try:
            spec = load()
        except SpecError as err:
            log(f"keeping the last good settings: {err}")
        if spec.health is None or spec.health.active is None:
            log("active checks are off")
            return
        if not control.in_control(spec, pod_name()):
            schedule = None  # read again when this pod holds control again
            continue
        with exclusive(PASS_LOCK, wait=False) as mine:
            if not mine:
                continue
            if schedule is None or spec.backup_controller is not None:
                schedule = Schedule.load()
            try:
                pass_once(spec, schedule, time.time())
            except SlurmError as err:
                log(f"pass skipped: {err}")
            except Exception as err:  # a crash-loop would stop every check
                log(f"pass failed, trying again next period: {type(err).__name__}: {err}")
            schedule.save()
