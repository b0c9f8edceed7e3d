"""Run a probe command with a bound on its time, even when it hangs in the kernel."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Sequence


class Unhealthy(Exception):
    """A check found a problem; the message is the drain reason's detail."""


# Probes killed at their timeout that have not ended, by command line: one in uninterruptible
# sleep (a hung NFS server, a lost GPU) outlives SIGKILL. A long-lived caller (the agent's
# watch, every few seconds) starts no second copy of such a probe while the first hangs, or a
# hung server would fill the pod's process table.
_ABANDONED: dict[tuple[str, ...], subprocess.Popen[str]] = {}
_ABANDONED_LOCK = threading.Lock()  # a check still running from an earlier round, beside this


def bounded(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    """(exit status, stdout and stderr) of `argv`. A probe of a hung NFS mount sits in
    uninterruptible sleep and survives SIGKILL until the server answers, so on timeout it is
    killed and left behind, never waited for; while it is still there, the same probe fails
    at once instead of starting again."""
    command = tuple(argv)
    with _ABANDONED_LOCK:
        stuck = _ABANDONED.get(command)
        if stuck is not None and stuck.poll() is None:
            raise Unhealthy(f"{' '.join(argv[:2])} still hangs since an earlier timeout")
        _ABANDONED.pop(command, None)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    except OSError as err:
        raise Unhealthy(f"cannot run {argv[0]}: {err.strerror}") from err
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        with _ABANDONED_LOCK:
            _ABANDONED[command] = proc
        raise Unhealthy(f"{' '.join(argv[:2])} did not answer within {timeout:g} s") from None
    return proc.returncode, output
