"""The watch phase: the worker's agent runs the node's watch checks every
`health.watchSeconds` and drains the node as soon as one fails, with the check's own reason.

What jobs need of the machine (GPUs, storage, scratch) is checked here, beside the jobs,
rather than in a Prolog or Epilog: slurmd pays for every program it forks around a job (it
waits on it, then sleeps 10 ms before killing what it left), more than the checks' answer
is worth there. So by default slurm.conf names no Prolog, and its Epilog runs no check (it
clears what the job's user left on the node: slonk.health.leftovers); a fault reaches Slurm
within a period, as with any interval check, only sooner. A site that wants a
look in every job puts `prolog` or `epilog` in a check's phases and pays for it.

Slurm is asked about the node only when what fails changes (a fault, another, healed) and
on the agent's first round; until Slurm could be asked, every round asks again. A round where
a check could not tell (probe.Inconclusive) and none failed asks nothing. A thousand
nodes, healthy or failing the same way through an outage, ask slurmctld nothing. (A drain a
person lifts while the fault lasts comes back with the interval checks.) A probe that hangs
(a hung NFS mount, a lost GPU) is not started again while it hangs (slonk.health.probe): its
check fails at once, round after round.

Run by the worker's agent as a thread (`run(stop)`).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from slonk.base.paths import HEALTH_PLAN
from slonk.health import drains, runner

NO_PLAN_WAIT_SECONDS = 10.0  # health turned off, or a plan that does not load: look again
# Rounds in a row that may fail (Slurm restarting, a plan half written) before the watch
# gives up to the agent, which counts the failure where metrics show it, and starts it again.
FAILED_ROUNDS_LIMIT = 3


class WatchFailing(RuntimeError):
    """The watch's rounds keep failing: for the agent to count and restart."""


def run(stop: threading.Event, plan_path: Path = HEALTH_PLAN) -> None:
    """Watch until `stop` is set. A failing check is no error; a round that fails (a bad plan,
    a bug) says so on stderr and tries again later, and FAILED_ROUNDS_LIMIT in a row raise
    WatchFailing: a watch that cannot run must not look like one that finds nothing."""
    told: tuple[str, ...] | None = None  # what failed when Slurm was last asked; None: never
    failed_rounds = 0
    while not stop.is_set():
        period = NO_PLAN_WAIT_SECONDS
        try:
            plan = runner.load_plan(plan_path)
            period = plan.watch_seconds
            results, _ = drains.check_node("watch", drain=False, plan=plan)
            failing = tuple(r.reason for r in results if not r.ok)
            # A round where a check could not tell and none failed tells Slurm nothing: the
            # round it passes again does (it may resume the node).
            watched = {n for n, c in plan.checks.items() if "watch" in c["phases"]}
            untold = not failing and not watched <= {r.check for r in results}
            if failing != told and not untold and drains.act(plan, "watch", results)[1]:
                told = failing
            failed_rounds = 0
        except FileNotFoundError:
            failed_rounds = 0  # health checks are off on this node
        except Exception as err:
            failed_rounds += 1
            print(f"slonk health watch: {err!r}", file=sys.stderr, flush=True)
            if failed_rounds >= FAILED_ROUNDS_LIMIT:
                raise WatchFailing(f"{failed_rounds} rounds in a row failed: {err!r}") from err
        stop.wait(period)
