"""Slurm's Prolog/Epilog (and task variants): health checks, then the active revision's
scripts, in order.

Runs for every job on every node, so it imports slonk's health code only where the node has
checks, and its drain code only on a failure, and does no work when a phase has nothing to
run. Each prolog/epilog script's output goes to the
job's hook log; the first failure drains the node with a `slonk:<phase>:<script>` reason and
fails the phase, so Slurm requeues the job (SchedulerParameters=nohold_on_prolog_fail).
Task prolog/epilog scripts run as the job's user with Slurm's stdout (it reads `export`
lines from it), so they neither log here nor drain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from slonk.paths import HEALTH_PLAN, HOOKS_STATE

LOGS = Path("/var/log/slonk/hooks")
DRAINING_PHASES = ("prolog", "epilog")


def scripts(state: Path, phase: str) -> list[Path]:
    folder = state / "active" / phase
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    return [p for p in entries if not p.name.startswith(".") and p.is_file()]


def drain(reason: str) -> None:
    from slonk.health import node  # only on failure: jobs that pass import nothing more

    name = os.environ.get("SLURMD_NODENAME", "")
    try:
        node.drain(name, reason)
    except node.SlurmError as err:
        print(f"slonk hooks: could not drain {name}: {err}", file=sys.stderr)


def health_checks(phase: str) -> int:
    """The node's health checks for this phase, before any script: a bad node drains and the
    job goes elsewhere (slonk.health)."""
    if phase not in DRAINING_PHASES or not HEALTH_PLAN.exists():
        return 0
    from slonk.health import command

    results, _ = command.check_node(phase, drain=True)
    return 0 if all(r.ok for r in results) else 1


def run(phase: str, state: Path = HOOKS_STATE, logs: Path = LOGS) -> int:
    if health_checks(phase):
        return 1
    todo = scripts(state, phase)
    if not todo:
        return 0
    timeout = json.loads((state / "settings.json").read_text())["timeoutSeconds"]
    draining = phase in DRAINING_PHASES
    out = None
    if draining:
        logs.mkdir(parents=True, exist_ok=True)
        out = open(logs / f"{os.environ.get('SLURM_JOB_ID', 'no-job')}.log", "a")  # noqa: SIM115
    try:
        for script in todo:
            if out:
                out.write(f"== {time.strftime('%H:%M:%S')} {phase} {script.name}\n")
                out.flush()
            try:
                code = subprocess.run(
                    [str(script)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    timeout=timeout,
                    check=False,
                ).returncode
                detail = f"exit {code}"
            except subprocess.TimeoutExpired:
                code, detail = -1, f"timed out after {timeout} s"
            except OSError as err:
                code, detail = -1, err.strerror or str(err)
            if code != 0:
                if out:
                    out.write(f"== {phase} {script.name} failed: {detail}\n")
                if draining:
                    drain(f"slonk:{phase}:{script.name}: {detail}")
                return 1
    finally:
        if out:
            out.close()
    return 0


def main() -> None:
    sys.exit(run(sys.argv[1]))


if __name__ == "__main__":
    main()
