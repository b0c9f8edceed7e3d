"""A job phase's health checks (Prolog, Epilog: from slonk.hooks.dispatch), for checks a site
put in the `prolog` or `epilog` phase. None is there by default: the agent watches the machine
beside the jobs (slonk.health.watch), and slurm.conf names a Prolog or Epilog only for hooks
from git or for such a check.

Slurm forks this for every job, so a phase with no check of its own costs reading the plan
and nothing heavier than `json`; the checks and their drains are imported only to run.
"""

from __future__ import annotations

from slonk.base import places


def check(phase: str, plan_path: str = places.HEALTH_PLAN) -> int:
    """0 when the node may take (or has cleanly finished) the job, 1 when it was drained."""
    try:
        with open(plan_path, "rb") as plan:
            text = plan.read()
    except FileNotFoundError:
        return 0  # health checks are off, or this is no worker
    import json

    if not any(phase in c["phases"] for c in json.loads(text)["checks"].values()):
        return 0
    from slonk.health import runner
    from slonk.health.drains import check_node

    results, _ = check_node(phase, drain=True, plan=runner.parse_plan(text))
    return 0 if all(r.ok for r in results) else 1
