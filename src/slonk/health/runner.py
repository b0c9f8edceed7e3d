"""Run a phase's checks on this node, in parallel, each within its own time bound.

The node's plan (which checks, their options, what the node is) is written once by
`slonk init` as JSON, so that checks run by Slurm for every job read no YAML.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from slonk.base.files import write_atomically
from slonk.base.paths import HEALTH_PLAN, HEALTH_STATE
from slonk.config import check_names
from slonk.health import probe
from slonk.health.checks import Node, find
from slonk.slurm import reasons

if TYPE_CHECKING:  # job-time callers must not pay for the spec's YAML import
    from slonk.config.spec import ClusterSpec

BOOT_RESULTS = HEALTH_STATE / "boot.json"
# A check returns within its timeout by itself (its probes are bounded); this is the slack
# before the runner stops waiting for one that does not.
JOIN_SLACK_SECONDS = 1.0
READY_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Result:
    check: str
    ok: bool
    detail: str
    seconds: float
    timed_out: bool = False  # out of time, not starved (probe.TimedOut)

    @property
    def reason(self) -> str:
        """Slurm's drain reason: `slonk:<check>: <detail>`."""
        return reasons.health(self.check, self.detail)

    def line(self) -> str:
        status = "ok  " if self.ok else "FAIL"
        return f"{status} {self.check:<10} {self.detail} ({self.seconds * 1000:.0f} ms)"


class PlannedCheck(TypedDict):
    """One check in the plan file, as the spec's CheckSettings says it (kept here as the
    plan's JSON: the job-time path reads it without importing the spec's model)."""

    phases: list[str]
    timeoutSeconds: float
    options: dict[str, Any]


@dataclass(frozen=True)
class CheckPlan:
    """One node's health checks: which run in which phase, with what options."""

    node: Node
    undrain: bool
    checks: Mapping[str, PlannedCheck]
    watch_seconds: float  # between the agent's runs of the watch phase (slonk.health.watch)
    max_drained_percent: int = 100  # of the nodes, by one check (slonk.health.blast)
    trend_drained_percent: int = 100  # the same, by one trend rule: their own limit


def plan_for(spec: ClusterSpec, node_name: str) -> CheckPlan | None:
    """This node's checks, or None when health checks are off or it is no worker."""
    from slonk.config.active_checks import MEASURES, spans_block  # with the spec: not at job time
    from slonk.health.nvml import NVLINK_FIELDS

    pool = spec.pool_of(node_name)
    if spec.health is None or pool is None:
        return None
    node = Node(
        name=node_name,
        gpus=pool.gpus.count if pool.gpus else 0,
        peers=tuple(pool.node_names(spec.release)),
    )
    checks = {
        name: PlannedCheck(
            phases=list(c.phases), timeoutSeconds=c.timeout_seconds, options=dict(c.options)
        )
        for name, c in spec.health_checks(pool).items()
    }
    assert spec.health is not None
    gate = spec.health.active is not None and spec.health.active.gate
    for name, a in spec.active_checks(pool).items():
        # A site's command is run as it is; slonk's probe is told what to measure.
        measure: dict[str, str] = {}
        if "command" not in a.options:
            measure["measure"], measure["unit"] = MEASURES[name]
        # With the gate, at boot too: before slurmd starts, the node out of service. One that
        # spans a block is run by the controller alone; the node's plan keeps it, so its drain
        # holds, and a new pod's boot lifts it (slonk.health.active.BLOCK_AT_BOOT).
        phases = [check_names.ACTIVE, *(["boot"] if gate else [])]
        if spans_block(a):
            phases = ["boot"]
        checks[f"{check_names.ACTIVE_PREFIX}{name}"] = PlannedCheck(
            phases=phases,
            timeoutSeconds=a.timeout_seconds,
            options={**a.options, **measure},
        )
    gpu_check = checks.get("gpu")
    trends = spec.health.trends
    if gpu_check is not None and trends is not None:
        for name, rule in trends.rules.items():
            program = "nvml" if rule.field in NVLINK_FIELDS else "nvidiaSmi"
            command = gpu_check["options"].get(program)
            if not command:  # a site that emptied the reader: nothing reads the counter
                continue
            checks[f"{check_names.TREND_PREFIX}{name}"] = PlannedCheck(
                phases=["watch"],  # beside the GPU check, with its programs and timeout
                timeoutSeconds=gpu_check["timeoutSeconds"],
                options={
                    "rule": name,
                    "field": rule.field,
                    "maxIncrease": rule.max_increase,
                    "windowSeconds": rule.window_seconds,
                    "command": command,
                },
            )
    return CheckPlan(
        node=node,
        undrain=spec.health.undrain,
        checks=checks,
        watch_seconds=spec.health.watch_seconds,
        max_drained_percent=spec.health.max_drained_percent,
        trend_drained_percent=trends.max_drained_percent if trends else 100,
    )


def write_plan(plan: CheckPlan, path: Path = HEALTH_PLAN) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(asdict(plan), indent=1) + "\n")


def load_plan(path: Path = HEALTH_PLAN) -> CheckPlan:
    return parse_plan(path.read_bytes())


def parse_plan(text: bytes) -> CheckPlan:
    data = json.loads(text)
    node = data["node"]
    return CheckPlan(
        node=Node(**{**node, "peers": tuple(node["peers"])}),
        undrain=data["undrain"],
        checks=data["checks"],
        watch_seconds=data["watch_seconds"],
        max_drained_percent=data.get("max_drained_percent", 100),
        trend_drained_percent=data.get("trend_drained_percent", 100),
    )


def results_path(phase: str, state: Path = HEALTH_STATE) -> Path:
    """The last results of a phase, for the `metrics` service (slonk.metrics.health)."""
    return state / f"results-{phase}.json"


def save_results(results: list[Result], phase: str, started: float, state: Path) -> bool:
    """Each check's result with when it ended (`time`, seconds since the epoch), replaced
    atomically. Only where the plan lives (a worker pod): a run by hand elsewhere keeps
    nothing, and a write that fails never fails the checks' run. Whether they were saved."""
    if not state.is_dir():
        return False
    # Not rounded: a next run that began right after this one ended must find that it did
    # (_timed_out_before); rounded up, a run 0.4 ms later seemed to have run beside it.
    records = [{**asdict(r), "time": started + r.seconds} for r in results]
    try:  # already loaded by the job-time path: no new cost
        write_atomically(results_path(phase, state), json.dumps(records) + "\n")
    except OSError:
        return False
    return True


def run_phase(plan: CheckPlan, names: list[str], phase: str) -> list[Result]:
    """The checks `names`: the passive ones started together, then each active check alone,
    one after another (two on one GPU at once would each measure the other's share: both
    slow), results in the plan's order."""
    alone = [n for n in names if n.startswith(check_names.ACTIVE_PREFIX)]
    results = run_checks(plan, [n for n in names if n not in alone], phase)
    for name in alone:
        results += run_checks(plan, [name], phase)
    order = {name: i for i, name in enumerate(names)}
    return sorted(results, key=lambda r: order[r.check])


def run(plan: CheckPlan, phase: str, state: Path = HEALTH_STATE) -> list[Result]:
    """Every check of `phase` (run_phase); results in the plan's order, also saved as the
    phase's last (save_results). A check out of time, not starved (probe.TimedOut), fails
    the second time in a row: at boot (once per pod, before slurmd) it runs again at once;
    in another phase, its last run there, ended before this one began, must have been out of
    time too. The first time it has no result, as one that cannot tell: under a loaded host
    a disk read or a kernel lock can outlast a timeout once. Where the results are not kept
    (no pod, a write that fails) there is no first time. Active checks have no first time:
    each ran alone on an idle node, and the next is an interval away."""
    wall_started = time.time()
    results = run_phase(plan, [n for n, c in plan.checks.items() if phase in c["phases"]], phase)
    if phase == "boot":
        again = {r.check: r for r in run_phase(plan, _timed_out(results), phase)}
        results = [
            again[r.check] if r.timed_out else r
            for r in results
            if r.check in again or not r.timed_out
        ]
    first = set()
    if phase not in ("boot", check_names.ACTIVE):
        first = set(_timed_out(results)) - _timed_out_before(phase, state, wall_started)
    if not save_results(results, phase, wall_started, state):
        first = set()
    for result in results:
        if result.check in first:
            print(
                f"slonk health: {phase}: {result.check} out of time, once: {result.detail}",
                file=sys.stderr,
            )
    return [r for r in results if r.check not in first]


def _timed_out(results: list[Result]) -> list[str]:
    return [r.check for r in results if r.timed_out]


def _timed_out_before(phase: str, state: Path, started: float) -> set[str]:
    """The checks out of time in the phase's last saved run, where they ended before
    `started` (a run still going beside this one sees the same stall: no second look)."""
    try:
        records = json.loads(results_path(phase, state).read_text())
        return {
            r["check"]
            for r in records
            if r.get("timed_out") is True
            and isinstance(r.get("time"), int | float)
            and r["time"] < started
        }
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return set()


def run_checks(plan: CheckPlan, names: list[str], phase: str) -> list[Result]:
    """The plan's checks `names`, started together, as `phase` runs them; results in that
    order. A check that could not tell (probe.Inconclusive) has none: it neither drains nor
    resumes the node, nor fails at boot; stderr says so."""
    selected = {n: plan.checks[n] for n in names}
    outcomes: dict[str, Result | str] = {}  # a result, or why the check could not tell
    lock = threading.Lock()  # a late check's thread against the timeout given it

    def settle(name: str, outcome: Result | str) -> None:
        with lock:
            outcomes.setdefault(name, outcome)

    def one(name: str, settings: PlannedCheck) -> None:
        started = time.perf_counter()
        try:
            ok, detail = (
                True,
                find(name)(plan.node, settings["options"], phase, settings["timeoutSeconds"]),
            )
        except probe.Inconclusive as err:
            settle(name, str(err))
            return
        except probe.TimedOut as err:
            settle(name, Result(name, False, str(err), time.perf_counter() - started, True))
            return
        except probe.Unhealthy as err:
            ok, detail = False, str(err)
        except Exception as err:  # a bug in a check must read as that check failing
            ok, detail = False, f"check failed to run: {err!r}"
        settle(name, Result(name, ok, detail, time.perf_counter() - started))

    # Daemon threads: one stuck in the kernel (DNS, a hung mount) must not hold the exit.
    started = time.monotonic()
    threads = {
        n: threading.Thread(target=one, args=(n, c), daemon=True) for n, c in selected.items()
    }
    for thread in threads.values():
        thread.start()
    for name, thread in threads.items():
        limit = selected[name]["timeoutSeconds"]
        task = probe.PROC / "self" / "task" / str(thread.native_id)
        deadline = started + limit + JOIN_SLACK_SECONDS
        thread.join(max(0.0, deadline - time.monotonic()))
        # Ready to run, it has its answer and lacks only a CPU to give it on: a while more.
        while thread.is_alive() and probe.ready(task) and time.monotonic() < deadline + limit:
            thread.join(READY_POLL_SECONDS)
        if thread.is_alive():
            elapsed = time.monotonic() - started  # before the scan (probe.bounded)
            # Asleep on a probe (a check runs several in turn): that probe's time counts too.
            queued = probe.queued_seconds(task)
            waited_on = probe.PROBING.get(thread.native_id or 0)
            if queued is not None and waited_on is not None:
                queued += probe.group_queued_seconds(waited_on) or 0.0
            late = probe.out_of_time(f"timed out after {limit:g} s", elapsed, queued)
            if isinstance(late, probe.Inconclusive):
                settle(name, str(late))
            else:
                settle(name, Result(name, False, str(late), limit, True))
    with lock:
        decided = dict(outcomes)
    for name, outcome in decided.items():
        if isinstance(outcome, str):
            print(f"slonk health: {phase}: {name} inconclusive: {outcome}", file=sys.stderr)
    return [r for n in selected if isinstance(r := decided.get(n), Result)]


def save_boot_results(results: list[Result], path: Path = BOOT_RESULTS) -> None:
    write_atomically(path, json.dumps([asdict(r) for r in results]) + "\n")


def boot_results(path: Path = BOOT_RESULTS) -> list[Result]:
    try:
        return [Result(**d) for d in json.loads(path.read_text())]
    except FileNotFoundError:
        return []
