"""Whether this image's slurmctld may start on the state it finds in StateSaveLocation.

Measured (slonk 0.2.0's Slurm 22.05 state with running jobs, then Debian 13's 24.11
slurmctld on it): 24.11 refuses it ("fatal: Can not recover assoc_usage state, incompatible
version, got 9728 need >= 9984 <= 10752, start with '-i' ..."), but first rewrites the
state's `clustername` file, after which 22.05's slurmctld refuses the state too ("fatal:
CLUSTER NAME MISMATCH"): a rollback no longer finds the jobs. With `-i`, as it advises, it
starts with no job and purges every job's files while the jobs run on. A downgrade onto a
newer state fails the same way. So slonk decides before slurmctld touches the state.

Slurm heads its job and node state files with its protocol version: the string
"PROTOCOL_VERSION" then a 16-bit number whose high byte counts major releases (22.05 is 38,
24.11 is 42). The files are on a volume the slurm user writes: read as untrusted bytes,
and a state slonk cannot read is not started on either.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from slonk.base.errors import SlonkError

# The files that carry the header, in the order they are read.
HEADED_FILES = ("job_state", "node_state")
_TAG = b"PROTOCOL_VERSION\0"
_HEADER = struct.Struct(">I17sH")

# Protocol majors of the releases before Slurm's six-monthly cadence; from 24.05 (41) on,
# YY.05 and YY.11 follow each other.
_EARLY = {35: (20, 2), 36: (20, 11), 37: (21, 8), 38: (22, 5), 39: (23, 2), 40: (23, 11)}
_CADENCE_START = 41  # 24.05
_VERSION = re.compile(r"(?:slurm(?:-wlm)? )?(\d{2})\.(\d{2})\.\d{1,3}(?:-\d{1,3})?", re.ASCII)


class StateError(SlonkError):
    """slurmctld must not start on this state; the message says what to do."""


@dataclass(frozen=True, order=True)
class Release:
    """A Slurm major release, by its protocol major (one more for each release)."""

    protocol: int

    def __str__(self) -> str:
        if self.protocol in _EARLY:
            year, month = _EARLY[self.protocol]
        else:
            offset = self.protocol - _CADENCE_START
            year, month = 24 + offset // 2, 11 if offset % 2 else 5
        return f"{year:02d}.{month:02d}"

    def oldest_readable(self) -> Release:
        """The oldest release whose state it recovers: three back from 24.11 on (measured:
        24.11 needs >= 23.02's), two back before (SchedMD's rule for those releases)."""
        return Release(self.protocol - (3 if self.protocol >= 42 else 2))


def release_of_version(text: str) -> Release:
    """`slurmctld -V`'s output ("slurm-wlm 24.11.5") as a release; ValueError otherwise."""
    match = _VERSION.fullmatch(text.strip()[:64])
    if not match:
        raise ValueError(f"not a Slurm version: {text.strip()[:64]!r}")
    year, month = int(match[1]), int(match[2])
    for protocol, known in _EARLY.items():
        if known == (year, month):
            return Release(protocol)
    if year >= 24 and month in (5, 11):
        return Release(_CADENCE_START + 2 * (year - 24) + (month == 11))
    raise ValueError(f"not a Slurm release: {year:02d}.{month:02d}")


def release_of_header(data: bytes) -> Release:
    """The release a state file's first bytes name; ValueError when they name none."""
    if len(data) < _HEADER.size:
        raise ValueError(f"{len(data)} bytes, shorter than Slurm's header")
    length, tag, version = _HEADER.unpack_from(data)
    if length != len(_TAG) or tag != _TAG:
        raise ValueError("no PROTOCOL_VERSION header")
    major, age = divmod(version, 256)
    if age or not min(_EARLY) <= major < 100:
        raise ValueError(f"protocol version {version} is no Slurm release's")
    return Release(major)


def _read_head(path: Path) -> bytes | None:
    """The file's first bytes; None when there is no such file. A link or a non-regular
    file is not followed (the directory is the slurm user's)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ValueError(f"cannot open it: {err.strerror}") from err
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        return os.read(fd, _HEADER.size)
    finally:
        os.close(fd)


def state_release(directory: Path) -> tuple[Release, str] | None:
    """The release that wrote the state, with the file that says so; None for no state."""
    for name in HEADED_FILES:
        try:
            head = _read_head(directory / name)
            if head is not None:
                return release_of_header(head), name
        except ValueError as err:
            raise StateError(
                f"{directory / name}: cannot tell which Slurm release wrote it ({err}); "
                "slurmctld is not started on it and nothing in it is changed"
            ) from err
    return None


def check(directory: Path, slurmctld_version: str) -> str:
    """A line for the log when slurmctld may start on `directory`; StateError otherwise."""
    found = state_release(directory)
    if found is None:
        return f"no Slurm state in {directory}: slurmctld starts a new one"
    state, name = found
    try:
        image = release_of_version(slurmctld_version)
    except ValueError as err:
        raise StateError(
            f"slurmctld -V: {err}; cannot tell whether it reads the state in {directory} "
            f"(Slurm {state}'s), so it is not started on it"
        ) from err
    if image.oldest_readable() <= state <= image:
        return f"{directory} holds Slurm {state}'s state, which {image}'s slurmctld recovers"
    move = "a downgrade" if state > image else "more releases than it spans"
    raise StateError(
        f"{directory} holds Slurm {state}'s state ({name}); this image's slurmctld is {image}, "
        f"which recovers state from {image.oldest_readable()} to {image} only ({move}). "
        f"slurmctld is not started and the state is left untouched: slurmctld itself would "
        f"drop every job, or leave a state {state} no longer starts on. Jobs keep running "
        f"on the workers: go back to the chart version with Slurm {state} (helm rollback) "
        f"and it finds them. To move to {image}: on {state}, drain every node and let the "
        f"jobs finish, stop slurmctld and move the state aside, then upgrade and delete the "
        f"worker pods (README: Upgrading across Slurm releases)"
    )
