"""Slurm's Prolog/Epilog (and task variants): health checks, then the active revision's
scripts, in order.

Runs for every job on every node, so it imports slonk's health code only where the phase has
checks, and its drain code only on a failure, and does no work when a phase has nothing to
run. Each prolog/epilog script's output goes to the
job's hook log, readable by root only (it holds the job's environment); the first failure
drains the node with a `slonk:hook:<phase>:<script>` reason (a script's fault, not the
machine's: never recycled, see slonk.health.reasons) and fails the phase, so Slurm requeues
the job (SchedulerParameters=nohold_on_prolog_fail).
Task prolog/epilog scripts run as the job's user with Slurm's stdout (it reads `export`
lines from it), so they neither log here nor drain.
"""

from __future__ import annotations

import os
import sys

from slonk import places

# Not typing's: importing typing costs the job-time path what the rest of it does.
TYPE_CHECKING = False
if TYPE_CHECKING:  # the job-time path imports pathlib, json and subprocess only for scripts
    from pathlib import Path
    from typing import TextIO

DRAINING_PHASES = ("prolog", "epilog")
JOB_ID_DIGITS = 20


def scripts(state: Path | str, phase: str) -> list[Path]:
    from pathlib import Path

    folder = Path(state) / "active" / phase
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    return [p for p in entries if not p.name.startswith(".") and p.is_file()]


def _has_scripts(state: Path | str, phase: str) -> bool:
    """Cheaply, whether the phase may have scripts to run (no pathlib: most nodes have none)."""
    try:
        return any(not name.startswith(".") for name in os.listdir(f"{state}/active/{phase}"))
    except OSError:
        return False


def drain(phase: str, script: str, detail: str) -> None:
    from slonk import slurm_nodes  # only on failure: jobs that pass import no more
    from slonk.health import reasons

    name = os.environ.get("SLURMD_NODENAME", "")
    try:
        slurm_nodes.drain(name, reasons.hook(phase, script, detail))
    except slurm_nodes.SlurmError as err:
        print(f"slonk hooks: could not drain {name}: {err}", file=sys.stderr)


def health_checks(phase: str) -> int:
    """The node's health checks for this phase, if a site put any there, before any script:
    a bad node drains and the job goes elsewhere (slonk.health.jobphase)."""
    if phase not in DRAINING_PHASES:
        return 0
    from slonk.health import jobphase

    return jobphase.check(phase)


def open_log(logs: Path, job: str) -> TextIO:
    """The job's hook log, root's alone: scripts print other users' job environments. Modes
    are set on every open, so a log or directory an older slonk left readable is closed."""
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(logs, 0o700)
    valid = job.isascii() and job.isdigit() and len(job) <= JOB_ID_DIGITS
    name = f"{job}.log" if valid else "no-job.log"
    fd = os.open(logs / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return open(fd, "a")


def run(
    phase: str, state: Path | str = places.HOOKS_STATE, logs: Path | str = places.HOOK_LOGS
) -> int:
    if health_checks(phase):
        return 1
    if not _has_scripts(state, phase):
        return 0
    todo = scripts(state, phase)
    if not todo:
        return 0
    import json
    import subprocess
    import time
    from pathlib import Path

    state, logs = Path(state), Path(logs)
    timeout = json.loads((state / "settings.json").read_text())["timeoutSeconds"]
    draining = phase in DRAINING_PHASES
    out = open_log(logs, os.environ.get("SLURM_JOB_ID", "")) if draining else None
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
                    drain(phase, script.name, detail)
                return 1
    finally:
        if out:
            out.close()
    return 0


def main() -> None:
    sys.exit(run(sys.argv[1]))


if __name__ == "__main__":
    main()
