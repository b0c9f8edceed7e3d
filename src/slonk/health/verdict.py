"""The refresher's verdict on the machine checks, which a job phase reuses instead of running
them (slonk.health.refresh writes it, slonk.hooks.dispatch reads it).

Read by the program Slurm forks for every job, so it imports nothing but `os` and `time`: the
file is a few lines of ASCII, then the exact bytes of the plan the checks ran under (no JSON
to parse; a changed plan simply does not match):

    slonk-machine-checks 1
    started 1795407449.823
    pass prolog
    pass epilog gpu          <- the machine part passed; gpu's part about the job still runs
    <empty line>
    <the plan's bytes>

It can only ever let a phase skip checks that passed: anything else (no file, a failure, a
boot failure, another plan, a result older than MAX_AGE_SECONDS or dated in the future, a
file another user could have written, a link) reads as "unknown", and the phase runs its
checks itself, as without a refresher. Only the reader's own user (root, for Slurm's Prolog
and Epilog) may have written the file or its directory.
"""

from __future__ import annotations

import os
import stat
import time

HEADER = b"slonk-machine-checks 1\n"
# A phase reuses a verdict this young at most: two refresh periods (slonk.health.refresh),
# so one late run does not send every job back to running the checks. A fault that appears
# meanwhile is seen by the next job at worst this late, and by Slurm's interval checks.
MAX_AGE_SECONDS = 10.0
# The plan lists every node of the pool (the dns check resolves them): large pools, long plans.
MAX_BYTES = 8 * 1024 * 1024
_UNSAFE_MODE = stat.S_IWGRP | stat.S_IWOTH


def _owned_by_me(info: os.stat_result) -> bool:
    return info.st_uid == os.geteuid() and not info.st_mode & _UNSAFE_MODE


def read_trusted(path: str, max_bytes: int = MAX_BYTES) -> bytes | None:
    """The file's bytes if only this user can have written it: a regular file, not a link,
    with one name, in a directory of this user's, neither writable by others. None
    otherwise, or when it is missing or too large."""
    try:
        folder = os.lstat(os.path.dirname(path) or ".")
        if not stat.S_ISDIR(folder.st_mode) or not _owned_by_me(folder):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not _owned_by_me(info) or info.st_nlink != 1:
            return None
        data = os.read(fd, max_bytes + 1)
        chunks = [data]
        while data and sum(map(len, chunks)) <= max_bytes:
            data = os.read(fd, max_bytes + 1)
            chunks.append(data)
        whole = b"".join(chunks)
        return whole if len(whole) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)


def encode(started: float, phases: dict[str, tuple[str, ...]], plan: bytes) -> bytes:
    """The verdict: `phases` maps each phase whose machine checks all passed to the checks
    whose part about the job still runs per job."""
    lines = [f"started {started:.3f}"]
    lines += [" ".join(("pass", phase, *rest)) for phase, rest in phases.items()]
    return HEADER + "\n".join(lines).encode("ascii") + b"\n\n" + plan


def passes(
    phase: str, plan: bytes, data: bytes | None, now: float | None = None
) -> tuple[str, ...] | None:
    """For a phase about to run under `plan`: the checks whose part about the job must still
    run (none: the phase passes) if the verdict `data` says its machine checks passed,
    recently, under this very plan; None when it does not say so (run the checks)."""
    if data is None or not data.startswith(HEADER):
        return None
    head, separator, ran_under = data[len(HEADER) :].partition(b"\n\n")
    if not separator or ran_under != plan:
        return None
    try:
        lines = head.decode("ascii").split("\n")
        key, value = lines[0].split(" ")
        started = float(value)
    except ValueError:
        return None
    age = (time.time() if now is None else now) - started
    if key != "started" or not 0.0 <= age <= MAX_AGE_SECONDS:  # NaN fails both
        return None
    for line in lines[1:]:
        words = line.split(" ")
        if len(words) >= 2 and words[0] == "pass" and words[1] == phase:
            return tuple(words[2:])
    return None
