"""A job phase's health checks (Prolog, Epilog: from slonk.hooks.dispatch), at the cost of
reading two small files when the refresher's verdict on the machine is fresh.

Slurm forks this for every job, so what the common case needs imports nothing but `os`,
`time` and `stat`: the plan is compared as bytes, never parsed. Only what the verdict cannot
answer pays for more: an epilog's checks of what the job left behind (checks.AFTER_JOB), and,
when the verdict is missing, stale, failing or untrusted, the phase's whole run with its
drains (slonk.health.drains), exactly as without a refresher.
"""

from __future__ import annotations

from slonk import places
from slonk.health import verdict


def _read_plan(path: str) -> bytes | None:
    try:
        with open(path, "rb") as plan:
            return plan.read()
    except FileNotFoundError:
        return None


def _after_job_passes(plan_text: bytes, names: tuple[str, ...], phase: str) -> bool:
    """Whether the job's own parts of these checks pass (any failure: the full run says why
    and drains, with the same reason as ever)."""
    if not names:
        return True
    from slonk.health import runner
    from slonk.health.checks import AFTER_JOB
    from slonk.health.probe import Unhealthy

    plan = runner.parse_plan(plan_text)
    for name in names:
        settings = plan.checks.get(name)
        if settings is None or name not in AFTER_JOB:
            return False
        try:
            AFTER_JOB[name](plan.node, settings["options"], phase, settings["timeoutSeconds"])
        except Unhealthy:
            return False
        except Exception:  # a bug reads as "unknown": the full run reports it
            return False
    return True


def check(
    phase: str, plan_path: str = places.HEALTH_PLAN, verdict_path: str = places.HEALTH_VERDICT
) -> int:
    """0 when the node may take (or has cleanly finished) the job, 1 when it was drained."""
    plan = _read_plan(plan_path)
    if plan is None:
        return 0  # health checks are off, or this is no worker
    after_job = verdict.passes(phase, plan, verdict.read_trusted(verdict_path))
    if after_job is not None and _after_job_passes(plan, after_job, phase):
        return 0
    from slonk.health.drains import check_node

    results, _ = check_node(phase, drain=True)
    return 0 if all(r.ok for r in results) else 1
