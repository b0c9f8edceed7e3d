"""Slurm's Prolog/Epilog (and task variants): health checks, then the active revision's
scripts, in order.

Runs for every job on every node, so it imports slonk's health code only where the phase has
checks, and its drain code only on a failure, and does no work when a phase has nothing to
run. Each prolog/epilog script's output goes to the job's hook log, readable by root only
(it holds the job's environment). Each script has its timeout, and the phase one for all of
them together (phaseTimeoutSeconds): running out fails the phase as a script's failure would.

The first failure drains the node with a `slonk:hook:<phase>:<script>: <detail> (revision R)`
reason (a script's fault, not the machine's: never recycled, see slonk.slurm.reasons) and
fails the phase, so Slurm requeues the job (SchedulerParameters=nohold_on_prolog_fail) and it
lands on another node. A script that fails there too (a tool no image has) must not walk
across the partition draining every node: when Slurm shows another node drained by the same
script of the same revision, this node stays in service. The phase then succeeds in Slurm's
eyes (any failure of a Prolog or Epilog makes Slurm drain the node itself, as "Prolog error"),
and a prolog holds its job instead, with `scontrol requeuehold` and a comment saying why;
a job Slurm cannot requeue (srun, salloc) is cancelled.
Every Epilog first ends the processes the job's user left on the node and removes what they
left in its scratch (/tmp, /var/tmp, /dev/shm), once Slurm shows no other job of theirs there
(slonk.health.leftovers).
Task prolog/epilog scripts run as the job's user with Slurm's stdout (it reads `export`
lines from it), so they neither log here nor drain.
"""

from __future__ import annotations

import os
import sys

from slonk.base import places

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
    from slonk.slurm import reasons, slurm_nodes  # only on failure: jobs that pass import no more

    name = os.environ.get("SLURMD_NODENAME", "")
    try:
        slurm_nodes.drain(name, reasons.hook(phase, script, detail))
    except slurm_nodes.SlurmError as err:
        print(f"slonk hooks: could not drain {name}: {err}", file=sys.stderr)


def active_revision(state: Path | str) -> str:
    """The active revision's commit id ("" when none is active)."""
    try:
        return os.path.basename(os.readlink(f"{state}/active"))
    except OSError:
        return ""


def revision_note(revision: str) -> str:
    """How a drain reason names the revision: what `drained_elsewhere` looks for."""
    return f"(revision {revision[:12]})"


def drained_elsewhere(phase: str, script: str, revision: str) -> str | None:
    """Another node this script of this revision drained, as Slurm says (one call); None
    when there is none, or when Slurm cannot say (then this node drains, as before)."""
    from slonk.slurm import reasons, slurm_nodes

    if not revision:
        return None
    here = os.environ.get("SLURMD_NODENAME", "")
    head = reasons.hook(phase, script, "")  # `slonk:hook:<phase>:<script>: `, as written
    note = revision_note(revision)
    try:
        nodes = slurm_nodes.read_nodes()
    except slurm_nodes.SlurmError as err:
        print(f"slonk hooks: could not read the nodes: {err}", file=sys.stderr)
        return None
    found = (n.name for n in nodes if n.drained and n.reason.startswith(head) and note in n.reason)
    return next((name for name in found if name != here), None)


def hold_job(job: str, why: str) -> str:
    """Keep the job from running here and from walking on: requeued and held, with `why` as
    its comment (`scontrol show job`, `squeue -O comment`); cancelled when Slurm cannot
    requeue it. Returns what was done."""
    from slonk.slurm import slurm_nodes

    if not (job.isascii() and job.isdigit()):
        return "no job to hold"
    try:
        slurm_nodes.scontrol("update", f"jobid={job}", f"comment={why}")
    except slurm_nodes.SlurmError as err:
        print(f"slonk hooks: could not comment job {job}: {err}", file=sys.stderr)
    try:
        slurm_nodes.scontrol("requeuehold", job)
        return f"job {job} held"
    except slurm_nodes.SlurmError as err:
        print(f"slonk hooks: could not hold job {job}: {err}", file=sys.stderr)
    try:
        slurm_nodes.run(["scancel", job])
        return f"job {job} cancelled"
    except slurm_nodes.SlurmError as err:
        print(f"slonk hooks: could not cancel job {job}: {err}", file=sys.stderr)
        return f"job {job} neither held nor cancelled"


def contain(phase: str, script: str, detail: str, state: Path | str) -> tuple[int, str]:
    """A draining phase's script failed: drain this node, unless the same script of the same
    revision drained another already. The phase's exit code, and what was done."""
    revision = active_revision(state)
    detail = f"{detail} {revision_note(revision)}" if revision else detail
    other = drained_elsewhere(phase, script, revision)
    if other is None:
        drain(phase, script, detail)
        return 1, f"drained this node: {detail}"
    here = os.environ.get("SLURMD_NODENAME", "")
    why = (
        f"slonk: {phase} script {script} failed on {here} ({detail}), as on {other} which it "
        f"drained; {here} stays in service until the script is fixed"
    )
    done = hold_job(os.environ.get("SLURM_JOB_ID", ""), why) if phase == "prolog" else ""
    print(f"slonk hooks: {why}{'; ' + done if done else ''}", file=sys.stderr)
    return 0, f"not drained: {why}{'; ' + done if done else ''}"


def health_checks(phase: str) -> int:
    """The node's health checks for this phase, if a site put any there, before any script:
    a bad node drains and the job goes elsewhere (slonk.health.jobphase)."""
    if phase not in DRAINING_PHASES:
        return 0
    from slonk.health import jobphase

    return jobphase.check(phase)


def clear_leftovers(logs: Path | str) -> None:
    """First in every Epilog, before any check looks: what the job's user left on the node
    goes, their processes and their entries in scratch (slonk.health.leftovers), said in the
    job's hook log. Nothing here fails the Epilog (Slurm would drain the node for what a
    user did): a failure is said."""
    try:
        from slonk.health import leftovers

        said = leftovers.after_job()
        if said:
            from pathlib import Path

            with open_log(Path(logs), os.environ.get("SLURM_JOB_ID", "")) as out:
                out.write(f"== epilog {said}\n")
    except Exception as err:  # whatever it is, the job's end must not drain the node
        print(f"slonk hooks: leftovers not cleared: {type(err).__name__}: {err}", file=sys.stderr)


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
    if phase == "epilog":
        clear_leftovers(logs)
    if health_checks(phase):
        return 1
    if not _has_scripts(state, phase):
        return 0
    todo = scripts(state, phase)
    if not todo:
        return 0
    import json
    import time
    from pathlib import Path

    state, logs = Path(state), Path(logs)
    settings = json.loads((state / "settings.json").read_text())
    timeout = settings["timeoutSeconds"]
    phase_timeout = settings.get("phaseTimeoutSeconds", timeout)  # an older watcher's file
    deadline = time.monotonic() + phase_timeout
    draining = phase in DRAINING_PHASES
    out = open_log(logs, os.environ.get("SLURM_JOB_ID", "")) if draining else None
    try:
        for script in todo:
            if out:
                out.write(f"== {time.strftime('%H:%M:%S')} {phase} {script.name}\n")
                out.flush()
            left = deadline - time.monotonic()
            code, detail = run_script(script, out, min(left, timeout))
            if code is None:  # out of time: the phase's, or the script's own
                detail = (
                    f"the {phase} phase timed out after {phase_timeout} s"
                    if left < timeout
                    else f"timed out after {timeout} s"
                )
            if code != 0:
                if not draining:
                    return 1
                exit_code, done = contain(phase, script.name, detail, state)
                if out:
                    out.write(f"== {phase} {script.name} failed: {detail}; {done}\n")
                return exit_code
    finally:
        if out:
            out.close()
    return 0


def run_script(script: Path, out: TextIO | None, seconds: float) -> tuple[int | None, str]:
    """Run one script for at most `seconds`: its exit code and how it ended; None when time
    ran out (then it is killed with everything it started in its session)."""
    import signal
    import subprocess

    if seconds <= 0:
        return None, ""
    try:
        child = subprocess.Popen(
            [str(script)], stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    except OSError as err:
        return -1, err.strerror or str(err)
    try:
        code = child.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return None, ""
    return code, f"exit {code}"


def main() -> None:
    sys.exit(run(sys.argv[1]))


if __name__ == "__main__":
    main()
