"""`slonk health run`: by hand, as Slurm's HealthCheckProgram, and from the job hooks."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from slonk.health import node, runner
from slonk.paths import HEALTH_PLAN, HEALTH_STATE

LOG = Path("/var/log/slonk/health.log")
JOB_PHASES = ("prolog", "epilog")
STARTED = HEALTH_STATE / "slurmd-started"


def with_boot_failures(
    results: list[runner.Result], boot: list[runner.Result]
) -> list[runner.Result]:
    """A check that failed at boot counts as failing, whatever it says now: what was wrong
    when the node came up (a GPU missing) is not fixed without a new pod."""
    failed = [r for r in boot if not r.ok]
    failed_at_boot = {r.check for r in failed}
    return [*failed, *(r for r in results if r.check not in failed_at_boot)]


def check_node(
    phase: str, drain: bool, rerun: bool = True
) -> tuple[list[runner.Result], str | None]:
    """Run the phase's checks; with `drain`, set the node's Slurm state from them. Around a
    job the node is allocated, so there is nothing to resume: Slurm is asked only on failure,
    not once per job."""
    plan = runner.load_plan()
    boot = runner.boot_results()
    results = with_boot_failures(runner.run(plan, phase) if rerun else boot, boot)
    if not drain or (phase in JOB_PHASES and all(r.ok for r in results)):
        return results, None
    try:
        action = node.apply(plan.node.name, results, plan.undrain)
    except node.SlurmError as err:
        action = f"could not update the node: {err}"
    failed = "; ".join(r.reason for r in results if not r.ok)
    if failed or not action.startswith("left"):  # a healthy node left alone is no news
        LOG.parent.mkdir(parents=True, exist_ok=True)
        with LOG.open("a") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            log.write(f"{stamp} {phase}: {failed or 'all passed'}; {action}\n")
    return results, action


def slurmd_program() -> int:
    """Slurm's HealthCheckProgram. slurmd runs it once at start, before it registers, and
    then every HealthCheckInterval. The first run only applies the boot checks' results:
    the controller and peers may still be starting, and munged beside slurmd too. slurmd
    logs what a failing run prints."""
    if STARTED.exists():
        results, _ = check_node("interval", drain=True)
    else:
        STARTED.touch()
        results, _ = check_node("boot", drain=True, rerun=False)
    failed = [r.reason for r in results if not r.ok]
    print("; ".join(failed))
    return 1 if failed else 0


def main(phase: str, as_json: bool = False, drain: bool = False) -> int:
    if not HEALTH_PLAN.exists():
        print(
            f"slonk health: no {HEALTH_PLAN}: health checks are off, or this is no worker",
            file=sys.stderr,
        )
        return 2
    results, action = check_node(phase, drain)
    ok = all(r.ok for r in results)
    if as_json:
        document = {
            "phase": phase,
            "ok": ok,
            "checks": [asdict(r) for r in results],
            "action": action,
        }
        print(json.dumps(document, indent=1))
    else:
        for result in results:
            print(result.line())
        if action:
            print(f"node: {action}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(slurmd_program())
