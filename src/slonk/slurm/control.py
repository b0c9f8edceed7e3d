"""Which controller pod's slurmctld is in control (values controller.backup).

Slurm's own record decides: the slurmctld in control writes StateSaveLocation/heartbeat on
the state volume both pods share, every SlurmctldTimeout / 4 seconds (30 at most), with the
time and its index in SlurmctldHost's list; the backup takes over only once that record is
older than SlurmctldTimeout, and a returning primary takes the beat back. A ping cannot tell:
a standby slurmctld answers pings too. What must happen once per cluster — sacctmgr's
associations, node recycling, the syncer, applying a new Slurm configuration — happens in
the pod whose index beats; the other keeps its files current and waits. A record older than
SlurmctldTimeout names nobody (the one in control is gone and the other has not yet taken
over): nobody's duties run then. With one controller there is no record, and it is always in
control.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path

from slonk.base import paths
from slonk.config.model import ClusterSpec

# Slurm's heartbeat: the time and the writer's index, each a big-endian 64-bit integer.
BEAT = struct.Struct(">QQ")
OPEN_TRIES, OPEN_RETRY_SECONDS = 3, 0.1  # as Slurm's own reader of it

Beat = tuple[float, int]  # when (seconds since the epoch), by which controller (its index)


def heartbeat(path: Path) -> Beat | None:
    """Slurm's last heartbeat in `path`; None without one (not written yet, unreadable, cut
    short)."""
    for attempt in range(OPEN_TRIES):
        try:
            with path.open("rb") as file:
                data = file.read(BEAT.size)
            break
        except FileNotFoundError:  # Slurm replaces it by unlink, then link: a moment apart
            if attempt + 1 == OPEN_TRIES:
                return None
            time.sleep(OPEN_RETRY_SECONDS)
        except OSError:
            return None
    if len(data) != BEAT.size:
        return None
    when, index = BEAT.unpack(data)
    return float(when), int(index)


def _settings(spec: ClusterSpec) -> dict[str, str]:
    """slurm.conf's settings as rendered: slurmConf's own values win."""
    from slonk.config.render import slurm_settings  # Jinja: only where a backup asks

    return slurm_settings(spec)


def takeover_seconds(settings: dict[str, str]) -> int:
    """slurm.conf's SlurmctldTimeout."""
    value = settings.get("SlurmctldTimeout", "120")
    return int(value) if value.isdigit() else 120


def heartbeat_of(settings: dict[str, str]) -> Beat | None:
    """The heartbeat in slurm.conf's StateSaveLocation (the shared volume's, unless slurmConf
    moved it)."""
    return heartbeat(Path(settings.get("StateSaveLocation", str(paths.STATE_SAVE))) / "heartbeat")


def holder(
    spec: ClusterSpec,
    beat: Callable[[], Beat | None] | None = None,
    now: Callable[[], float] = time.time,
) -> str | None:
    """The controller pod in control: the one whose slurmctld's heartbeat is younger than
    SlurmctldTimeout (the only one, without a backup, unread); None when no beat is."""
    names = spec.controller_names
    if len(names) == 1:
        return names[0]
    settings = _settings(spec)
    found = beat() if beat else heartbeat_of(settings)
    if found is None:
        return None
    when, index = found
    if now() - when > takeover_seconds(settings) or not 0 <= index < len(names):
        return None
    return names[index]


def in_control(spec: ClusterSpec, pod: str, beat: Callable[[], Beat | None] | None = None) -> bool:
    """Whether `pod`'s slurmctld holds control: without a backup, always. With one, only
    while its beat is Slurm's: the duty waits for the next look otherwise."""
    return len(spec.controller_names) == 1 or holder(spec, beat) == pod


def held_elsewhere(
    spec: ClusterSpec, pod: str, beat: Callable[[], Beat | None] | None = None
) -> str | None:
    """The other controller pod, when it is seen holding control; None without a backup, or
    when nobody can be seen holding it."""
    if len(spec.controller_names) == 1:
        return None
    found = holder(spec, beat)
    return found if found not in (None, pod) else None
