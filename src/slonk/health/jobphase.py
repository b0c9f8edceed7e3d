"""A job phase's health checks (Prolog, Epilog: from slonk.hooks.dispatch), at the cost of
reading two small files when the refresher's verdict on the machine is fresh.

Slurm forks this for every job, so what the common case needs imports nothing but `os`,
`time` and `stat`: the plan is compared as bytes, never parsed. Only what the verdict cannot
answer pays for more: an epilog's checks of what the job left behind (AFTER_JOB), and,
when the verdict is missing, stale, failing or untrusted, the phase's whole run with its
drains (slonk.health.drains), exactly as without a refresher.
"""

from __future__ import annotations

from slonk import places
from slonk.health import verdict

# The checks with a part about the job just ended rather than the machine (processes or
# memory left on a GPU): an epilog runs it even when the refresher's verdict is fresh.
AFTER_JOB = ("gpu",)


def _read_plan(path: str) -> bytes | None:
    try:
        with open(path, "rb") as plan:
            return plan.read()
    except FileNotFoundError:
        return None


def _after_job_passes(plan_text: bytes, names: tuple[str, ...]) -> bool:
    """Whether the job's own parts of these checks pass (any failure: the full run says why
    and drains, with the same reason as ever). Only the gpu check has one."""
    if not names:
        return True
    import json

    from slonk.health import gpu

    try:
        plan = json.loads(plan_text)
        for name in names:
            if name not in AFTER_JOB:
                return False
            settings = plan["checks"][name]
            options = settings["options"]
            expected = gpu.expected_count(options, plan["node"]["gpus"])
            gpu.check_after_job(options, expected, settings["timeoutSeconds"])
    except Exception:  # Unhealthy, a bug or a strange plan: the full run says why, and drains
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
    if after_job is not None and _after_job_passes(plan, after_job):
        return 0
    from slonk.health.drains import check_node

    results, _ = check_node(phase, drain=True)
    return 0 if all(r.ok for r in results) else 1
