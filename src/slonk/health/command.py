"""`slonk health run` by hand, and Slurm's HealthCheckProgram (`python -m`, see
slonk.pod.job_programs). What runs the checks and acts on them is slonk.health.drains'."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from slonk.base.errors import SlonkError
from slonk.base.paths import HEALTH_PLAN, HEALTH_STATE
from slonk.health import runner, serials
from slonk.health.drains import check_node

STARTED = HEALTH_STATE / "slurmd-started"


def slurmd_program() -> int:
    """Slurm's HealthCheckProgram. slurmd runs it once at start, before it registers, and
    then every HealthCheckInterval. The first run only applies the boot checks' results:
    the controller and peers may still be starting, and munged beside slurmd too. slurmd
    logs what a failing run prints."""
    # Before a drain (the node history reads them with it); until Slurm took them, each run.
    try:
        serials.report(runner.load_plan().node.name)
    except (SlonkError, OSError, ValueError) as err:
        print(f"slonk health: GPU serials not reported yet: {err}", file=sys.stderr)
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
