"""Turn check results into Slurm node state: drain with slonk's reason, resume what slonk
drained once the same check passes, and never touch a drain a person made. `check_node` runs
a phase's checks and does that: for `slonk health run`, Slurm's HealthCheckProgram, the
agent's watch (slonk.health.watch) and the job hooks' dispatcher alike."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from pathlib import Path

from slonk.config.check_names import TREND_PREFIX
from slonk.health import blast, runner
from slonk.health.runner import Result
from slonk.slurm import reasons, slurm_nodes
from slonk.slurm.slurm_state import NodeState, SlurmError

LOG = Path("/var/log/slonk/health.log")
# Slurm stamps a reason in whole seconds: looked at this long after a drain, every drain
# stamped in the same second is there to see, so nodes that drained together rank the same
# set (slonk.health.blast). A node that looked sooner could keep its drain beside another's.
CONFIRM_AFTER_SECONDS = 2.0
JOB_PHASES = ("prolog", "epilog")


# A health drain that replaced the syncer's says so first in its detail: once the check
# passes, the node goes back to the syncer (`slonk:k8s:recheck`) rather than into service,
# since its Kubernetes cause may still hold. The syncer lifts that, or drains for the cause.
OVER_K8S = "[k8s] "


def lifted_by_a_pass(cause: reasons.Cause | None) -> bool:
    """Whether a drain goes once its check passes: a health check's, but a trend rule's
    (slonk.health.trend): a drained GPU makes no errors, so its count stops rising while the
    board stays as worn as it was. That drain waits for a person."""
    return (
        cause is not None
        and cause.kind == reasons.HEALTH
        and not cause.name.startswith(TREND_PREFIX)
    )


def decide(
    node: NodeState,
    results: Sequence[Result],
    undrain: bool,
    planned: Collection[str] | None = None,
) -> tuple[str, str] | None:
    """('drain', reason), ('resume', old reason) or None. A drain slonk made for one check is
    replaced only once that check passes, or once it is no longer among the node's `planned`
    checks (turned off, or a site's command removed: nothing would ever lift it); hooks' and
    quarantine drains are not health's to lift or replace, and a person's drain is theirs.
    The syncer's (`slonk:k8s:`) gives way to a failed check, the machine's fault being the one
    to recycle for, and is handed back to the syncer once the check passes."""
    failed = [r for r in results if not r.ok]
    passed = {r.check for r in results if r.ok}
    cause = node.cause
    if (
        planned is not None
        and cause is not None
        and cause.kind == reasons.HEALTH
        and cause.name not in planned
    ):
        passed.add(cause.name)  # a check the node no longer runs holds nothing
    if node.drained and (cause is None or cause.kind not in (reasons.HEALTH, reasons.K8S)):
        return None
    if cause is not None and cause.kind == reasons.HEALTH and not lifted_by_a_pass(cause):
        return None  # a trend's drain: a person's to lift, nothing of a check's to replace
    if failed:
        if cause is not None and cause.kind == reasons.K8S:
            return ("drain", reasons.health(failed[0].check, OVER_K8S + failed[0].detail))
        if cause is None or cause.name in passed:
            return ("drain", failed[0].reason)
        return None
    if undrain and cause is not None and cause.kind == reasons.HEALTH and cause.name in passed:
        if node.reason.startswith(f"{reasons.PREFIX}{cause.name}: {OVER_K8S}"):
            return ("drain", reasons.k8s("recheck", f"{cause.name} passes again"))
        return ("resume", node.reason)
    return None


def apply(
    name: str,
    results: Sequence[Result],
    undrain: bool,
    max_drained_percent: int = 100,
    trend_drained_percent: int = 100,
    planned: Collection[str] | None = None,
) -> str:
    """Act on the node in Slurm; returns what was done, for the log. Trend rules drain
    within a limit of their own; `planned`: every check of the node's plan (decide)."""
    node = slurm_nodes.read_node(name)
    action = decide(node, results, undrain, planned)
    if action is None:
        return f"left {node.label}" + (
            f" ({node.reason!a}, set by {node.reason_by!a})" if node.reason else ""
        )
    verb, reason = action
    if verb == "resume":
        slurm_nodes.resume(name)
        return f"resumed (was: {reason})"
    cause = reasons.classify(reason)
    check = cause.name if cause is not None and cause.kind == reasons.HEALTH else None
    if check is not None and check.startswith(TREND_PREFIX):
        max_drained_percent = trend_drained_percent
    if check is None or max_drained_percent >= 100:
        slurm_nodes.drain(name, reason)
        return f"drained: {reason}"
    # The blast-radius limit: looked at before the drain, and again after it, since nodes
    # failing together drain in the same second.
    drained = False
    if blast.within(slurm_nodes.read_nodes(), check, name, max_drained_percent):
        slurm_nodes.drain(name, reason)
        time.sleep(CONFIRM_AFTER_SECONDS)
        if blast.within(slurm_nodes.read_nodes(), check, name, max_drained_percent):
            return f"drained: {reason}"
        drained = True
    return _step_back(node, check, reason, undrain, drained)


def _step_back(node: NodeState, check: str, reason: str, undrain: bool, drained: bool) -> str:
    """`check` fails past its limit: the node is left as it was before this failure (in
    service, or drained by the syncer, whose cause may still hold), undoing the drain just
    made if there was one; a health drain whose own check passes again is lifted as usual."""
    said = (
        f"not drained for {reason}: {check} has drained its share of the nodes already; "
        "a failure so many share is a shared dependency's, not this machine's"
    )
    cause = node.cause
    if cause is None:
        if drained:
            slurm_nodes.resume(node.name)
        return f"{said}; left in service"
    if lifted_by_a_pass(cause) and undrain:  # its own check passes again
        slurm_nodes.resume(node.name)
        return f"{said}; resumed (was: {node.reason})"
    if drained:
        slurm_nodes.drain(node.name, node.reason)
    return f"{said}; left {node.label} ({node.reason!a})"


def with_boot_failures(results: list[Result], boot: list[Result]) -> list[Result]:
    """A check that failed at boot counts as failing, whatever it says now: what was wrong
    when the node came up (a GPU missing) is not fixed without a new pod."""
    failed = [r for r in boot if not r.ok]
    failed_at_boot = {r.check for r in failed}
    return [*failed, *(r for r in results if r.check not in failed_at_boot)]


def act(plan: runner.CheckPlan, phase: str, results: list[Result]) -> tuple[str, bool]:
    """Set the node's Slurm state from a run's results and log what was done (a healthy node
    left alone is no news): what was done, and whether Slurm could be asked at all."""
    try:
        action, asked = (
            apply(
                plan.node.name,
                results,
                plan.undrain,
                plan.max_drained_percent,
                plan.trend_drained_percent,
                set(plan.checks),
            ),
            True,
        )
    except SlurmError as err:
        action, asked = f"could not update the node: {err}", False
    failed = "; ".join(r.reason for r in results if not r.ok)
    if failed or not action.startswith("left"):
        LOG.parent.mkdir(parents=True, exist_ok=True)
        with LOG.open("a") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            log.write(f"{stamp} {phase}: {failed or 'all passed'}; {action}\n")
    return action, asked


def check_node(
    phase: str, drain: bool, rerun: bool = True, plan: runner.CheckPlan | None = None
) -> tuple[list[Result], str | None]:
    """Run the phase's checks (of `plan`, else the node's); with `drain`, set the node's Slurm
    state from them. Around a job the node is allocated, so there is nothing to resume: Slurm
    is asked only on failure, not once per job."""
    plan = plan or runner.load_plan()
    boot = runner.boot_results()
    results = with_boot_failures(runner.run(plan, phase) if rerun else boot, boot)
    if not drain or (phase in JOB_PHASES and all(r.ok for r in results)):
        return results, None
    return results, act(plan, phase, results)[0]
