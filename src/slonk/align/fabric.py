"""Active checks that span a block (`span: block`, slonk.config.active_checks): the controller
runs each as one Slurm job over the idle nodes that share a block or a leaf switch (a pool,
without a topology: slonk.config.render.neighbours), and the site's program spans them itself
(`srun`, `mpirun`: an NCCL all-reduce). They keep the single-node checks' rules
(slonk.align.active): the hidden partition any user's job preempts, the same interval, the
same wait after a run that never ran, and at most half of each pass's starts.

A failing run starts a search of its group (slonk.align.narrowing): runs over fewer nodes, one
at a time, each when its nodes are idle. The nodes it names when it ends drain
`slonk:active:<check>` through the health path (slonk.health.drains: the blast-radius limit),
and the recycle loop takes them as any health drain. A check that spans a block passes at a
new pod's boot (slonk.health.active.BLOCK_AT_BOOT): the recycle is the repair, and the node is
due for its next run at once; one failing again is recycled again, then quarantined
(maxRecycles).

With the gate (`health.active.gate`), a node coming back is held out of users' reach until a
run over it passes (slonk.slurm.gate): the recycle loop holds a node before it deletes its pod,
a search holds the nodes it drains, and a pass holds a node Slurm has down (a new pod not yet
registered, a lost one). Only a run that passed after the hold and after the node's slurmd
started lets it out. Without the gate, a recycled node is in service again at its boot.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slonk.align import check_jobs
from slonk.align.narrowing import MIN_NODES, Run, blame, named, next_runs
from slonk.base import paths
from slonk.config import active_checks, check_names, placement
from slonk.config.model import ActiveCheckSettings
from slonk.config.render import neighbours
from slonk.config.spec import ClusterSpec
from slonk.health import drains, runner
from slonk.health.runner import Result
from slonk.pod import worker_stop
from slonk.slurm import gate, slurm_nodes
from slonk.slurm.slurm_state import NodeState, SlurmError

JOB_NAME = "slonk-fabric"
# A first run needs this many idle nodes (all of a smaller group): two alone could not be
# told apart, had their run failed.
FIRST_RUN_NODES = 3
# A search whose next run found its nodes busy this long after its last run ended is dropped
# (what it named stays drained): users' jobs ran there meanwhile.
SEARCH_SECONDS = 3600.0
PASSED = frozenset({"COMPLETED"})
FAILED = frozenset({"FAILED", "TIMEOUT", "OUT_OF_MEMORY"})  # any other end: never ran


@dataclass
class Search:
    """A group's failing check, narrowed down run by run."""

    moved: float  # when its last run ended
    runs: list[Run] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)  # the nodes it named, drained
    spared: list[str] = field(default_factory=list)  # named, not drained (blast radius)


@dataclass
class Job:
    check: str
    group: str
    nodes: list[str]
    queued_at: float = 0.0  # when it was submitted (images 0.18.0: not kept)


@dataclass
class Schedule(check_jobs.Saved):
    """What each check that spans a block ran, tried, runs now, and is searching."""

    path = paths.STATE_SAVE / "slonk-fabric.json"
    ran: dict[str, dict[str, float]] = field(default_factory=dict)  # check -> node -> when
    tried: dict[str, dict[str, float]] = field(default_factory=dict)  # check -> group -> when
    jobs: dict[str, Job] = field(default_factory=dict)  # job id -> what it runs
    searches: dict[str, dict[str, Search]] = field(default_factory=dict)  # check -> group ->
    held: dict[str, float] = field(default_factory=dict)  # node -> since when the gate holds it
    # check -> node -> when a run over it last passed (or found the program missing there)
    passed: dict[str, dict[str, float]] = field(default_factory=dict)
    down: list[str] = field(default_factory=list)  # the gate's nodes Slurm had down last pass

    @classmethod
    def parse(cls, data: Any) -> Schedule:
        return cls(
            ran={c: {n: float(t) for n, t in v.items()} for c, v in data["ran"].items()},
            tried={c: {g: float(t) for g, t in v.items()} for c, v in data["tried"].items()},
            jobs={j: Job(**v) for j, v in data["jobs"].items()},
            searches={
                c: {
                    g: Search(
                        float(s["moved"]),
                        [Run(**r) for r in s["runs"]],
                        [str(n) for n in s["drained"]],
                        [str(n) for n in s["spared"]],
                    )
                    for g, s in v.items()
                }
                for c, v in data["searches"].items()
            },
            # Neither in images 0.18.0's schedule.
            held={n: float(t) for n, t in data.get("held", {}).items()},
            passed={
                c: {n: float(t) for n, t in v.items()} for c, v in data.get("passed", {}).items()
            },
            down=[str(n) for n in data.get("down", [])],
        )

    def forget_all_but(self, checks: Iterable[str]) -> None:
        """Drop what it holds of checks no longer there (their jobs are settled first)."""
        keep = set(checks)
        for kept in (self.ran, self.tried, self.searches, self.passed):
            for name in set(kept) - keep:
                del kept[name]


def block_checks(spec: ClusterSpec) -> dict[str, ActiveCheckSettings]:
    active = spec.health.active if spec.health is not None else None
    checks = active.checks if active is not None else {}
    return {name: c for name, c in checks.items() if active_checks.spans_block(c)}


def _gpu_nodes(spec: ClusterSpec) -> dict[str, int]:
    """Every node whose pool runs active checks, with its GPUs."""
    found: dict[str, int] = {}
    for pool in spec.nodepools:
        if pool.gpus and spec.active_checks(pool):
            found |= dict.fromkeys(pool.node_names(spec.release), pool.gpus.count)
    return found


def gate_members(spec: ClusterSpec, groups: Mapping[str, list[str]] | None = None) -> set[str]:
    """The nodes the gate keeps (slonk.slurm.gate): with the gate on, every node of a group
    that checks spanning a block can run over (two nodes or more with GPUs)."""
    active = spec.health.active if spec.health is not None else None
    if active is None or not active.gate or not block_checks(spec):
        return set()
    gpus = _gpu_nodes(spec)
    found: set[str] = set()
    for members in (groups if groups is not None else neighbours(spec, placement.load())).values():
        mine = [m for m in members if m in gpus]
        if len(mine) >= MIN_NODES:
            found.update(mine)
    return found


def _lent(node: NodeState) -> bool:
    """Slurm's power saving has it, or is bringing it back for a job that asked for it."""
    return node.powered_down or node.powering_down or node.powering_up


def _idle(node: NodeState | None) -> bool:
    """Idle and nothing else, or idle in a reservation alone (the gate's, for `ready`)."""
    return node is not None and node.state == "idle" and node.flags <= {"RESERVED"}


def _gone(node: NodeState) -> bool:
    """Down in Slurm's eyes (its pod's preStop hook, or SlurmdTimeout), or never registered: a
    node that answers nothing for a moment (NOT_RESPONDING alone) is not."""
    return node.state in ("down", "unknown") and not _lent(node)


def keep_gate(
    spec: ClusterSpec,
    schedule: Schedule,
    checks: Iterable[str],
    members: set[str],
    by_name: Mapping[str, NodeState],
    now: float,
) -> set[str]:
    """The gate's pass: keep its reservation open (gate.keep_open); let out each held node
    that is up and over which a run of every check, submitted since its hold and its slurmd's
    start, passed, and any node the gate no longer covers; then hold the members Slurm has
    down, unless more went down since the last pass than maxDrainedPercent allows (the
    controller's own trouble, not theirs), and a pod stopped on purpose whatever the count.
    Returns the nodes held."""
    held, ends = gate.read()
    gate.keep_open(ends, now)
    for node in held - set(schedule.held):  # by the recycle loop, or by the other controller
        schedule.held[node] = now
    for node in set(schedule.held) - held:  # let out by a person
        del schedule.held[node]

    def passed(node: str) -> bool:
        """Up, and every check passed over it since its hold and since its slurmd started (a
        pass before a later recycle is the old pod's)."""
        state = by_name.get(node)
        if state is None or not state.up:
            return False
        started = float(state.slurmd_started) if state.slurmd_started.isdigit() else 0.0
        since = max(schedule.held[node], started)
        return all(schedule.passed.get(c, {}).get(node, 0.0) >= since for c in checks)

    out = {n for n in held if n not in members or passed(n)}
    try:
        if out:
            held = gate.release(out)
            for node in out:
                schedule.held.pop(node, None)
            check_jobs.log(f"gate: let out {', '.join(sorted(out))}")
    except (SlurmError, OSError) as err:  # a run still in the reservation: the holds go on
        check_jobs.log(f"gate: not letting {', '.join(sorted(out))} out yet: {err}")
    down = {n for n in members if n in by_name and _gone(by_name[n])}
    fresh = down - set(schedule.down)  # went down since the last pass
    stopped = {n for n in down - held if by_name[n].reason == worker_stop.REASON}
    assert spec.health is not None
    most = max(len(members) * spec.health.max_drained_percent // 100, 1)
    if len(fresh) > most:
        check_jobs.log(f"gate: {len(fresh)} nodes went down at once, more than {most}")
        fresh = set()  # the controller's trouble, or a first start: none held but the stopped
    gone = (fresh | stopped) - held
    if gone:
        held = gate.hold(gone)
        schedule.held.update(dict.fromkeys(gone, now))
        said = ", ".join(sorted(gone))
        check_jobs.log(f"gate: holding {said} (down) until a run over it passes")
    schedule.down = sorted(down)  # once held: one Slurm refused is fresh again next pass
    return held


def submit_argv(
    check: ActiveCheckSettings, nodes: list[str], gpus: int, held: bool = False
) -> list[str]:
    """sbatch for one run (check_jobs.submit_argv): the program runs on the first node with
    the job's environment (SLURM_JOB_NODELIST). First a step on every node looks for it: as
    a node's own check (slonk.health.active.run_command), it does not run where it is not,
    and the run says so (check_jobs.NOT_HERE). A run over a node the gate holds runs in its
    reservation (`held`)."""
    minutes = math.ceil(check.timeout_seconds / 60) + 1
    command = check.options["command"]
    program = shlex.split(command)[0]
    there = f"test -x {program}" if program.startswith("/") else f"command -v {program}"
    # Missing on a node: its task exits 3, which srun returns (the highest); any other
    # failure of the step is the run's (a node that cannot start one).
    look = f"srun --ntasks-per-node=1 --quiet sh -c {shlex.quote(there + ' >/dev/null || exit 3')}"
    not_here = f"scontrol update JobId=$SLURM_JOB_ID Comment={check_jobs.NOT_HERE}; exit 0"
    # Failing, its last line goes into the job's Comment, for the drain's reason.
    last = f"tail -n 1 \"$out\" | tr -cd '[:print:]' | cut -c 1-{check_jobs.WORDS}"
    said = f'scontrol update JobId=$SLURM_JOB_ID "Comment={check_jobs.SAID}$({last})"'
    run = (
        f'out="${{TMPDIR:-/tmp}}/slonk-fabric-$SLURM_JOB_ID.out"; {command} > "$out" 2>&1; '
        f"status=$?; "
        f'[ $status -eq 0 ] || {said} || true; rm -f "$out"; exit $status'
    )
    wrap = f"{look}; case $? in 0) ;; 3) {not_here} ;; *) exit 2 ;; esac; {run}"
    # --no-requeue: a run no longer followed never runs.
    more: tuple[str, ...] = (f"--nodes={len(nodes)}", "--no-requeue")
    if held:
        more += (f"--reservation={gate.NAME}",)
    return check_jobs.submit_argv(nodes, gpus, minutes, JOB_NAME, wrap, *more)


def settle(
    schedule: Schedule,
    states: Mapping[str, str],
    now: float,
    by_name: Mapping[str, NodeState],
    said: Mapping[str, str],
) -> None:
    """Take in the runs that ended: a pass or a failure joins its group's search (or, with
    none, a pass is a round done); a run that never ran makes its group wait (`tried`). A
    pass counts for the gate from when the run was submitted (`_passed`)."""

    for job, run in list(schedule.jobs.items()):
        waiting = all(_idle(by_name.get(n)) for n in run.nodes)
        state = check_jobs.settled_state(job, states.get(job, ""), run.queued_at, now, waiting)
        if state in check_jobs.LIVE:
            continue
        del schedule.jobs[job]
        search = schedule.searches.get(run.check, {}).get(run.group)
        if state == check_jobs.NOT_HERE:  # not run, not to be tried before the interval
            _ran(schedule, run.check, run.nodes, now)
            _passed(schedule, run, run.nodes)  # the check does not apply there
            check_jobs.log(f"{run.check} job {job}: its program is not on every node it had")
            if search is not None:
                conclude(schedule, run.check, run.group, now, "stopped: a program missing")
            continue
        if state not in PASSED | FAILED:
            schedule.tried.setdefault(run.check, {})[run.group] = now
            how = state.lower() or "gone"
            check_jobs.log(f"{run.check} job {job} over {','.join(run.nodes)} {how}")
            continue
        passed = state in PASSED
        if passed:
            _passed(schedule, run, run.nodes)
        if search is None and passed:
            _ran(schedule, run.check, run.nodes, now)
            continue
        if search is None:
            search = schedule.searches.setdefault(run.check, {})[run.group] = Search(now)
            check_jobs.log(
                f"{run.check} failed over {','.join(run.nodes)} (job {job}): narrowing it down"
            )
        search.runs.append(Run(run.nodes, passed, job, said.get(job, "")))
        search.moved = now


def _ran(schedule: Schedule, check: str, nodes: Iterable[str], now: float) -> None:
    schedule.ran.setdefault(check, {}).update(dict.fromkeys(nodes, now))


def _passed(schedule: Schedule, run: Job, nodes: Iterable[str]) -> None:
    """What lets a node out of the gate: unlike `ran`, never a search's conclusion, and dated
    when the run was submitted (one submitted before a node's hold does not count)."""
    schedule.passed.setdefault(run.check, {}).update(dict.fromkeys(nodes, run.queued_at))


def drain_named(
    spec: ClusterSpec, name: str, search: Search, schedule: Schedule, now: float
) -> None:
    """Drain the nodes the search names that it has not drained yet, each through the health
    path with its own plan's checks (a drain of another of its checks is left as it is); one
    Slurm could not be asked about is tried again next pass. The gate holds each one drained
    (none without the gate), so that it returns only through a run that passes, whoever lifts
    the drain."""
    assert spec.health is not None and spec.health.active is not None
    program = os.path.basename(shlex.split(spec.health.active.checks[name].options["command"])[0])
    check = f"{check_names.ACTIVE_PREFIX}{name}"
    kept = gate_members(spec)
    for node in sorted(named(search.runs) - set(search.drained) - set(search.spared)):
        plan = runner.plan_for(spec, node)
        if plan is None or check not in plan.checks:
            search.spared.append(node)
            continue
        result = Result(check, False, blame(node, search.runs, program), 0.0)
        try:
            done = drains.apply(
                node,
                [result],
                spec.health.undrain,
                spec.health.max_drained_percent,
                planned=set(plan.checks),
            )
        except SlurmError as err:
            check_jobs.log(f"{name} names {node}, not drained yet: {err}")
            continue
        (search.drained if done.startswith("drained") else search.spared).append(node)
        check_jobs.log(f"{name} names {node}: {done}")
        if done.startswith("drained") and node in kept:
            try:
                gate.hold([node])
                schedule.held[node] = now  # what passed over it before counts no more
            except (SlurmError, OSError) as err:  # the recycle loop holds it before its pod goes
                check_jobs.log(f"gate: could not hold {node} yet: {err}")


def conclude(schedule: Schedule, name: str, group: str, now: float, why: str = "") -> None:
    """A search that is over (`why`: stopped before its end). The nodes it cleared count as
    checked now; the ones it named are due again with their new slurmd (a recycle). One that
    ran to its end naming nobody counts every node it ran on as checked: a failure nothing
    narrows down (a program that fails everywhere) is not searched again before the interval.
    One stopped early makes its group wait as a run that never ran does (`tried`)."""
    search = schedule.searches[name].pop(group)
    cleared = {n for r in search.runs if r.passed for n in r.nodes} | set(search.spared)
    everyone = {n for r in search.runs for n in r.nodes}
    _ran(schedule, name, everyone if not (why or search.drained) else cleared, now)
    if why:
        schedule.tried.setdefault(name, {})[group] = now
    said = ", ".join(search.drained) or "no node"
    how = f"{why} after" if why else "narrowed down in"
    check_jobs.log(f"{name} over {group}: {how} {len(search.runs)} runs, naming {said}")


def pass_once(
    spec: ClusterSpec,
    schedule: Schedule,
    states: Mapping[str, str],
    nodes: list[NodeState],
    busy: set[str],
    starts: int,
    now: float,
    retry_seconds: float,
    said: Mapping[str, str] | None = None,
) -> int:
    """One pass over every check that spans a block: runs taken in (with what a failed one
    `said`, check_jobs.states), named nodes drained, searches carried on or concluded, due
    groups started, never on a node in `busy` (another check's job holds it). Returns how
    many jobs it submitted (at most `starts`); a group whose run never ran (a user's job
    preempted it) waits `retry_seconds`."""
    by_name = {n.name: n for n in nodes}
    settle(schedule, states, now, by_name, said or {})
    checks = block_checks(spec)
    schedule.forget_all_but(checks)
    gpus = _gpu_nodes(spec)
    busy = busy | {n for job in schedule.jobs.values() for n in job.nodes}
    groups = neighbours(spec, placement.load())
    for name, searches in schedule.searches.items():
        for group in set(searches) - set(groups):  # its nodes placed elsewhere since
            conclude(schedule, name, group, now, "dropped, its group gone")
    try:
        held = keep_gate(spec, schedule, checks, gate_members(spec, groups), by_name, now)
    except (SlurmError, OSError) as err:  # OSError: the lock on the state volume
        held = set(schedule.held)
        check_jobs.log(f"gate: not changed this pass: {err}")

    def ready(node: str) -> bool:
        """Idle and nothing else, or idle in the gate alone (not in a site's reservation)."""
        state = by_name.get(node)
        if state is None or node in busy or not _idle(state):
            return False
        return check_jobs.quiet(state) or node in held

    submitted = 0
    for group, members in groups.items():
        members = [m for m in members if m in gpus]
        for name, check in checks.items():
            if any(j.check == name and j.group == group for j in schedule.jobs.values()):
                continue
            if now - schedule.tried.get(name, {}).get(group, 0.0) < retry_seconds:
                continue
            tries = _next_runs(spec, schedule, name, group, members, by_name, ready, held, now)
            run = next((t for t in tries if all(map(ready, t))), None)
            if run is None or submitted >= starts:
                continue  # a search's next run waits for its nodes to be idle again
            in_gate = bool(held & set(run))
            argv = submit_argv(check, run, min(gpus[m] for m in run), in_gate)
            try:
                job = slurm_nodes.run(argv, failed=f"sbatch {name} over {group}").strip()
            except SlurmError as err:
                schedule.tried.setdefault(name, {})[group] = now
                check_jobs.log(f"not running {name} over {group} now: {err}")
                continue
            schedule.jobs[job.split(";")[0]] = Job(name, group, run, now)
            busy |= set(run)
            submitted += 1
            check_jobs.log(f"running {name} over {','.join(run)}: job {job}")
    return submitted


def _next_runs(
    spec: ClusterSpec,
    schedule: Schedule,
    name: str,
    group: str,
    members: list[str],
    by_name: Mapping[str, NodeState],
    ready: Callable[[str], bool],
    held: set[str],
    now: float,
) -> list[list[str]]:
    """The runs the check may make over the group now, best first: its search's (drained and
    concluded once it has none left), or, once a node is due (one the gate holds is), one over
    every ready member."""
    assert spec.health is not None and spec.health.active is not None
    search = schedule.searches.get(name, {}).get(group)
    if search is not None and any(n not in members for r in search.runs for n in r.nodes):
        conclude(schedule, name, group, now, "dropped, its group changed")
        return []
    if search is not None:
        # Drained at the end alone: a node the runs name may be cleared by a later one.
        tries = next_runs(search.runs, members)
        if not tries:
            drain_named(spec, name, search, schedule, now)
        if not tries and named(search.runs) <= {*search.drained, *search.spared}:
            conclude(schedule, name, group, now)
        elif tries and now - search.moved > SEARCH_SECONDS:
            conclude(schedule, name, group, now, "dropped, its nodes busy")
            tries = []
        return tries
    interval = spec.health.active.interval_seconds
    ran = schedule.ran.get(name, {})
    quiet = [m for m in members if ready(m)]
    # One the gate holds is due until a run over it ends (passed or not: a program failing
    # everywhere is not searched again before the interval, and its held nodes wait).
    unrun = {m for m in held if ran.get(m, 0.0) <= schedule.held.get(m, 0.0)}
    due = [m for m in quiet if m in unrun or _due(by_name[m], ran.get(m, 0.0), interval, now)]
    # A node the gate holds waits for one partner alone: a pass lets it out; a failure is
    # narrowed down as any other, once more of its group is idle.
    enough = max(MIN_NODES, min(FIRST_RUN_NODES, len(members)))
    if held & set(quiet):
        enough = MIN_NODES
    return [quiet] if len(quiet) >= enough and due else []


def _due(node: NodeState, last: float, interval: int, now: float) -> bool:
    """Due after the interval, and at once on a new slurmd (a recycled node's new pod)."""
    started = float(node.slurmd_started) if node.slurmd_started.isdigit() else 0.0
    return now - last >= interval or started > last
