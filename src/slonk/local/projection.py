"""ConfigMap and Secret volumes as kubelet lays them out, so pods see the same files.

kubelet writes a volume's files into a fresh `..<timestamp>` directory, points the
`..data` symlink at it with one rename, and exposes each key as a symlink through
`..data`. A reader sees the old or the new set of files, never a mix.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

DATA_LINK = "..data"


def project(volume: Path, files: Mapping[str, bytes], mode: int = 0o644) -> None:
    """Atomically replace the contents of a projected volume directory."""
    volume.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()) + f"{time.monotonic_ns()}"
    payload = volume / stamp
    payload.mkdir(mode=0o755)
    for name, data in files.items():
        (payload / name).write_bytes(data)
        os.chmod(payload / name, mode)
    previous = os.readlink(volume / DATA_LINK) if (volume / DATA_LINK).is_symlink() else None
    tmp_link = volume / f"{DATA_LINK}_tmp"
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(stamp)
    os.replace(tmp_link, volume / DATA_LINK)
    for name in files:
        link = volume / name
        if not link.is_symlink():
            link.symlink_to(f"{DATA_LINK}/{name}")
    for entry in volume.iterdir():
        if entry.is_symlink() and not entry.name.startswith("..") and entry.name not in files:
            entry.unlink()
    if previous:
        shutil.rmtree(volume / previous, ignore_errors=True)


def read(volume: Path) -> dict[str, bytes]:
    """The files a projected volume shows now."""
    return (
        {
            p.name: p.read_bytes()
            for p in sorted(volume.iterdir())
            if not p.name.startswith("..") and p.is_file()
        }
        if volume.is_dir()
        else {}
    )
