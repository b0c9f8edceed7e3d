"""The machine checks jobs need, on their own schedule, so that Prolog and Epilog reuse a
result seconds old instead of forking nvidia-smi, a shell and a storage write for every job.

Every PERIOD_SECONDS, the checks of the node's prolog and epilog phases run as a prolog runs
them (the machine: GPU count, ECC, remaps, XIDs; storage; scratch), and the verdict on each
phase is written for slonk.health.verdict to read. The refresher never drains: a phase that
finds no passing verdict runs its checks itself, as it always did, and drains with the same
reasons. The parts about the job just ended (processes or memory left on a GPU,
jobphase.AFTER_JOB) still run in every epilog.

Run by the worker's agent as a thread (`run(stop)`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path

from slonk import places
from slonk.files import write_atomically
from slonk.health import runner, verdict
from slonk.health.jobphase import AFTER_JOB
from slonk.paths import HEALTH_PLAN

# Half the age a job phase accepts (verdict.MAX_AGE_SECONDS): one late run is no miss.
PERIOD_SECONDS = verdict.MAX_AGE_SECONDS / 2
MAX_PERIOD_SECONDS = 320.0  # after rounds that failed (run)
JOB_PHASES = ("prolog", "epilog")
VERDICT = Path(places.HEALTH_VERDICT)


def passing_phases(
    plan: runner.CheckPlan, results: list[runner.Result], boot: list[runner.Result]
) -> dict[str, tuple[str, ...]]:
    """Each job phase whose checks all passed (and none failed at boot: those count as failing
    for the pod's life, slonk.health.drains), with its checks' parts about the job."""
    if any(not r.ok for r in boot):
        return {}
    failed = {r.check for r in results if not r.ok}
    passing = {}
    for phase in JOB_PHASES:
        names = [n for n, c in plan.checks.items() if phase in c["phases"]]
        if not failed & set(names):
            after_job = tuple(n for n in names if n in AFTER_JOB) if phase == "epilog" else ()
            passing[phase] = after_job
    return passing


def refresh_once(plan_path: Path = HEALTH_PLAN, out: Path = VERDICT) -> bool:
    """One run of the job phases' checks and its verdict; whether they all passed (then the
    job phases run their checks themselves, and drain). True with no plan: nothing failed."""
    try:
        text = plan_path.read_bytes()
    except FileNotFoundError:
        out.unlink(missing_ok=True)  # health turned off: nothing may reuse an old verdict
        return True
    plan = runner.parse_plan(text)
    names = [n for n, c in plan.checks.items() if set(JOB_PHASES) & set(c["phases"])]
    started = time.time()  # a result is as old as the moment its check began
    results = runner.run_checks(plan, names, "prolog")
    boot = runner.boot_results(plan_path.parent / runner.BOOT_RESULTS.name)
    phases = passing_phases(plan, results, boot)
    # Root's alone: when it was made tells a job's user when the next look comes.
    write_atomically(out, verdict.encode(started, phases, text), mode=0o600)
    return all(r.ok for r in results)


def unread(path: Path) -> bool:
    """Whether no job phase read the verdict since it was written: with relatime, Linux's
    default, the first read after a write moves a file's atime past its mtime. On a mount
    without atimes every verdict looks unread: jobs then run their checks, as before."""
    try:
        info = path.stat()
    except OSError:
        return False
    return info.st_atime_ns <= info.st_mtime_ns


def run(stop: threading.Event, plan_path: Path = HEALTH_PLAN, out: Path = VERDICT) -> None:
    """Refresh until `stop` is set; waits while the node has no health plan. Never raises
    for a failing check or a bad plan: it says so on stderr and tries again later. After a
    round that did not pass, the next waits twice as long (up to MAX_PERIOD_SECONDS): a probe
    stuck on a hung mount or a lost GPU cannot be killed, and one every period would fill the
    pod's process table; the job phases, seeing no passing verdict, check and drain.
    A node no job used the last verdict of is not looked at again: idle, a thousand workers
    would each write to the shared /home every period for nobody. The first job after reads
    a stale verdict and runs its checks itself; the next round looks again."""
    wait = PERIOD_SECONDS
    passed = False
    while not stop.is_set():
        if passed and unread(out):
            stop.wait(PERIOD_SECONDS)
            continue
        try:
            passed = refresh_once(plan_path, out)
        except Exception as err:  # a job phase then runs its checks itself: still safe
            with contextlib.suppress(OSError):
                out.unlink(missing_ok=True)
            print(f"slonk health refresh: {err!r}", file=sys.stderr, flush=True)
            passed = False
        wait = PERIOD_SECONDS if passed else min(wait * 2, MAX_PERIOD_SECONDS)
        stop.wait(wait)
