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
new pod's boot (slonk.health.active.BLOCK_AT_BOOT): the recycle is the repair, and the node,
in service again, is due for its next run at once; one failing again is recycled again, then
quarantined (maxRecycles).
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Iterable, Mapping
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
from slonk.slurm import slurm_nodes
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


@dataclass
class Schedule(check_jobs.Saved):
    """What each check that spans a block ran, tried, runs now, and is searching."""

    path = paths.STATE_SAVE / "slonk-fabric.json"
    ran: dict[str, dict[str, float]] = field(default_factory=dict)  # check -> node -> when
    tried: dict[str, dict[str, float]] = field(default_factory=dict)  # check -> group -> when
    jobs: dict[str, Job] = field(default_factory=dict)  # job id -> what it runs
    searches: dict[str, dict[str, Search]] = field(default_factory=dict)  # check -> group ->

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
        )

    def forget_all_but(self, checks: Iterable[str]) -> None:
        """Drop what it holds of checks no longer there (their jobs are settled first)."""
        keep = set(checks)
        for held in (self.ran, self.tried, self.searches):
            for name in set(held) - keep:
                del held[name]


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


def submit_argv(check: ActiveCheckSettings, nodes: list[str], gpus: int) -> list[str]:
    """sbatch for one run (check_jobs.submit_argv): the program runs on the first node with
    the job's environment (SLURM_JOB_NODELIST). First a step on every node looks for it: as
    a node's own check (slonk.health.active.run_command), it does not run where it is not,
    and the run says so (check_jobs.NOT_HERE)."""
    minutes = math.ceil(check.timeout_seconds / 60) + 1
    command = check.options["command"]
    program = shlex.split(command)[0]
    there = f"test -x {program}" if program.startswith("/") else f"command -v {program}"
    # Missing on a node: its task exits 3, which srun returns (the highest); any other
    # failure of the step is the run's (a node that cannot start one).
    look = f"srun --ntasks-per-node=1 --quiet sh -c {shlex.quote(there + ' >/dev/null || exit 3')}"
    not_here = f"scontrol update JobId=$SLURM_JOB_ID Comment={check_jobs.NOT_HERE}; exit 0"
    wrap = f"{look}; case $? in 0) ;; 3) {not_here} ;; *) exit 2 ;; esac; exec {command}"
    more = (f"--nodes={len(nodes)}", "--no-requeue")  # a run no longer followed never runs
    return check_jobs.submit_argv(nodes, gpus, minutes, JOB_NAME, wrap, *more)


def settle(schedule: Schedule, states: Mapping[str, str], now: float) -> None:
    """Take in the runs that ended: a pass or a failure joins its group's search (or, with
    none, a pass is a round done); a run that never ran makes its group wait (`tried`)."""
    for job, run in list(schedule.jobs.items()):
        state = check_jobs.settled_state(job, states.get(job, ""))
        if state in check_jobs.LIVE:
            continue
        del schedule.jobs[job]
        search = schedule.searches.get(run.check, {}).get(run.group)
        if state == check_jobs.NOT_HERE:  # not run, not to be tried before the interval
            _ran(schedule, run.check, run.nodes, now)
            check_jobs.log(f"{run.check} job {job}: its program is not on every node it had")
            if search is not None:
                conclude(schedule, run.check, run.group, now, "stopped: a program missing")
            continue
        if state not in PASSED | FAILED:
            schedule.tried.setdefault(run.check, {})[run.group] = now
            said = state.lower() or "gone"
            check_jobs.log(f"{run.check} job {job} over {','.join(run.nodes)} {said}")
            continue
        passed = state in PASSED
        if search is None and passed:
            _ran(schedule, run.check, run.nodes, now)
            continue
        if search is None:
            search = schedule.searches.setdefault(run.check, {})[run.group] = Search(now)
            check_jobs.log(
                f"{run.check} failed over {','.join(run.nodes)} (job {job}): narrowing it down"
            )
        search.runs.append(Run(run.nodes, passed, job))
        search.moved = now


def _ran(schedule: Schedule, check: str, nodes: Iterable[str], now: float) -> None:
    schedule.ran.setdefault(check, {}).update(dict.fromkeys(nodes, now))


def drain_named(spec: ClusterSpec, name: str, search: Search) -> None:
    """Drain the nodes the search names that it has not drained yet, each through the health
    path with its own plan's checks (a drain of another of its checks is left as it is); one
    Slurm could not be asked about is tried again next pass."""
    assert spec.health is not None and spec.health.active is not None
    program = os.path.basename(shlex.split(spec.health.active.checks[name].options["command"])[0])
    check = f"{check_names.ACTIVE_PREFIX}{name}"
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
) -> int:
    """One pass over every check that spans a block: runs taken in, named nodes drained,
    searches carried on or concluded, due groups started, never on a node in `busy` (another
    check's job holds it). Returns how many jobs it submitted (at most `starts`); a group
    whose run never ran (a user's job preempted it) waits `retry_seconds`."""
    settle(schedule, states, now)
    checks = block_checks(spec)
    schedule.forget_all_but(checks)
    gpus = _gpu_nodes(spec)
    by_name = {n.name: n for n in nodes}
    busy = busy | {n for job in schedule.jobs.values() for n in job.nodes}

    def free(node: str) -> bool:
        return node in by_name and check_jobs.quiet(by_name[node]) and node not in busy

    groups = neighbours(spec, placement.load())
    for name, searches in schedule.searches.items():
        for group in set(searches) - set(groups):  # its nodes placed elsewhere since
            conclude(schedule, name, group, now, "dropped, its group gone")
    submitted = 0
    for group, members in groups.items():
        members = [m for m in members if m in gpus]
        for name, check in checks.items():
            if any(j.check == name and j.group == group for j in schedule.jobs.values()):
                continue
            if now - schedule.tried.get(name, {}).get(group, 0.0) < retry_seconds:
                continue
            tries = _next_runs(spec, schedule, name, group, members, by_name, now)
            run = next((t for t in tries if all(map(free, t))), None)
            if run is None or submitted >= starts:
                continue  # a search's next run waits for its nodes to be idle again
            argv = submit_argv(check, run, min(gpus[m] for m in run))
            try:
                job = slurm_nodes.run(argv, failed=f"sbatch {name} over {group}").strip()
            except SlurmError as err:
                schedule.tried.setdefault(name, {})[group] = now
                check_jobs.log(f"not running {name} over {group} now: {err}")
                continue
            schedule.jobs[job.split(";")[0]] = Job(name, group, run)
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
    now: float,
) -> list[list[str]]:
    """The runs the check may make over the group now, best first: its search's (drained and
    concluded once it has none left), or, once a node is due, one over every quiet member."""
    assert spec.health is not None and spec.health.active is not None
    search = schedule.searches.get(name, {}).get(group)
    if search is not None and any(n not in members for r in search.runs for n in r.nodes):
        conclude(schedule, name, group, now, "dropped, its group changed")
        return []
    if search is not None:
        # Drained at the end alone: a node the runs name may be cleared by a later one.
        tries = next_runs(search.runs, members)
        if not tries:
            drain_named(spec, name, search)
        if not tries and named(search.runs) <= {*search.drained, *search.spared}:
            conclude(schedule, name, group, now)
        elif tries and now - search.moved > SEARCH_SECONDS:
            conclude(schedule, name, group, now, "dropped, its nodes busy")
            tries = []
        return tries
    interval = spec.health.active.interval_seconds
    ran = schedule.ran.get(name, {})
    quiet = [m for m in members if m in by_name and check_jobs.quiet(by_name[m])]
    due = [m for m in quiet if _due(by_name[m], ran.get(m, 0.0), interval, now)]
    enough = max(MIN_NODES, min(FIRST_RUN_NODES, len(members)))
    return [quiet] if len(quiet) >= enough and due else []


def _due(node: NodeState, last: float, interval: int, now: float) -> bool:
    """Due after the interval, and at once on a new slurmd (a recycled node's new pod)."""
    started = float(node.slurmd_started) if node.slurmd_started.isdigit() else 0.0
    return now - last >= interval or started > last
