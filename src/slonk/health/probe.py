"""Run a probe command with a bound on its time, even when it hangs in the kernel."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

PROC = Path("/proc")
# A probe out of time that spent this share of it or more ready to run, given no CPU, was
# starved, not hung, as hundreds of `slonk local` pods on two cores are. Draining for it would
# take healthy nodes out by the dozen (and the recycle loop would then delete their pods,
# loading the machine further). A probe hung on a mount, a GPU or the network sleeps: it waits
# on no run queue, however busy the node, so a busy job cannot pass a hung probe off as
# starved; and a job sharing the CPU fairly with the probe's cgroup leaves the probe half.
STARVED_SHARE = 0.75


class Unhealthy(Exception):
    """A check found a problem; the message is the drain reason's detail."""


class Inconclusive(Unhealthy):
    """A check could not tell: it ran out of time starved of CPU (STARVED_SHARE), or what it
    saw is a running job's (a full scratch). Neither a failure nor a pass: the node's state
    is left as it is until a later round can tell."""


class TimedOut(Unhealthy):
    """A check out of time that was not starved: hung, or slowed by what run-queue time does
    not show (a disk read, a kernel lock under a loaded host). Once can be the load; it fails
    the node the second time in a row (slonk.health.runner.run)."""


def queued_seconds(task: Path) -> float | None:
    """How long a task (/proc/<pid>, /proc/self/task/<tid>) was ready to run with no CPU to
    run on: its schedstat's second field. None where the kernel keeps no count."""
    try:
        return int((task / "schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _stat(task: Path) -> list[str]:
    """A task's /proc stat fields after its command's name (state, ppid, pgrp, ...); [] once
    it ended."""
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def ready(task: Path) -> bool:
    """Whether a task is ready to run (or running): it has its answer, and at most lacks a
    CPU to give it on."""
    return _stat(task)[:1] == ["R"]


def group_queued_seconds(pgid: int) -> float | None:
    """queued_seconds summed over the live processes of a process group (a probe started in
    a session of its own, and its children)."""
    total = None
    for task in PROC.iterdir():
        if not task.name.isdigit():
            continue
        if _stat(task)[2:3] == [str(pgid)] and (queued := queued_seconds(task)) is not None:
            total = (total or 0.0) + queued
    return total


def out_of_time(message: str, elapsed: float, queued: float | None) -> TimedOut | Inconclusive:
    """The error for a probe or check out of time after `elapsed` seconds, `queued` of them
    ready to run with no CPU: Inconclusive when that is STARVED_SHARE of them or more, else
    TimedOut."""
    if queued is None or elapsed <= 0 or queued < STARVED_SHARE * elapsed:
        return TimedOut(message)
    share = min(queued / elapsed, 1.0)
    return Inconclusive(f"{message}, starved of CPU {share:.0%} of that time")


# Probes killed at their timeout that have not ended, by command line: one in uninterruptible
# sleep (a hung NFS server, a lost GPU) outlives SIGKILL. A long-lived caller (the agent's
# watch, every few seconds) starts no second copy of such a probe while the first hangs, or a
# hung server would fill the pod's process table.
_ABANDONED: dict[tuple[str, ...], subprocess.Popen[str]] = {}
# The probe each thread waits on, by the thread's id: a check out of time asleep on a probe is
# judged with that probe's processes (slonk.health.runner).
PROBING: dict[int, int] = {}
_ABANDONED_LOCK = threading.Lock()  # a check still running from an earlier round, beside this


def bounded(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    """(exit status, stdout and stderr) of `argv`. A probe of a hung NFS mount sits in
    uninterruptible sleep and survives SIGKILL until the server answers, so on timeout it is
    killed and left behind, never waited for (Inconclusive if it was starved of CPU rather
    than hung); while it is still there, the same probe fails at once instead of starting
    again."""
    command, name = tuple(argv), " ".join(argv[:2])  # name: what errors call the probe
    with _ABANDONED_LOCK:
        stuck = _ABANDONED.pop(command, None)
    if stuck is not None:
        try:
            stuck.wait(timeout)  # one killed slow, not hung, ends once it gets a CPU or a read
        except subprocess.TimeoutExpired:
            with _ABANDONED_LOCK:
                _ABANDONED.setdefault(command, stuck)
            raise TimedOut(f"{name} still hangs since an earlier timeout") from None
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",  # a program's stray bytes are its words, never the check's failure
            start_new_session=True,
        )
    except OSError as err:
        raise Unhealthy(f"cannot run {argv[0]}: {err.strerror}") from err
    PROBING[threading.get_native_id()] = proc.pid
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if _ended(proc.pid):  # this thread, starved of CPU, was the one late: its answer counts
            return _late_answer(proc, name, timeout)
        # Before the scan, which may itself wait for a CPU: a probe asleep (hung) gains no
        # run-queue time meanwhile, one starved does.
        elapsed = time.monotonic() - started
        queued = group_queued_seconds(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        message = f"{name} did not answer within {timeout:g} s"
        error = out_of_time(message, elapsed, queued)
        if not isinstance(error, Inconclusive):  # a starved probe dies once it gets a CPU
            with _ABANDONED_LOCK:
                _ABANDONED[command] = proc
        raise error from None
    finally:
        PROBING.pop(threading.get_native_id(), None)
    return proc.returncode, output


def _ended(pid: int) -> bool:
    """Whether a child ended, left unreaped: while it is a zombie, its process group's id
    cannot be given to another group (killpg stays safe)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _late_answer(proc: subprocess.Popen[str], name: str, timeout: float) -> tuple[int, str]:
    """What a probe that ended before its late reader looked said; what it left behind is
    killed, and one of those holding its output open past another timeout is a timeout."""
    os.killpg(proc.pid, signal.SIGKILL)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimedOut(f"{name} left a process holding its output") from None
    return proc.returncode, output
