"""The controller's record of its Slurm configuration, kept on slurmctld's state volume.

It holds the files slurmctld last accepted and the last configuration it refused, with what
slurmctld said. config-watch writes it; `slonk init` reads it, so that a controller pod
restarted with a cluster.yaml slurmctld already refused starts on the accepted files instead
of crash-looping. A refusal counts for the exact files and Slurm version it was made for:
any change to either is tried again.

The state volume is slurmctld's, writable by the slurm user, and what the record holds
becomes the file slurmctld reads as root: a record counts only if root wrote it (slurm can
delete it, never make one), and only Slurm's config file names are taken from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slonk.base.files import exclusive, write_atomically
from slonk.base.paths import CONFIG_FILES

Files = dict[str, str]


def fingerprint(files: Mapping[str, str], slurm_version: str) -> str:
    digest = hashlib.sha256(slurm_version.encode() + b"\0")
    for name in sorted(files):
        digest.update(f"{name}\0{files[name]}\0".encode())
    return digest.hexdigest()


def read_files(directory: Path) -> Files:
    return {n: (directory / n).read_text() for n in CONFIG_FILES if (directory / n).is_file()}


def write_files(directory: Path, files: Mapping[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_atomically(directory / name, text)


@dataclass(frozen=True)
class Record:
    """One JSON file, replaced atomically: {"accepted": {name: text}, "refused": {...}}."""

    path: Path

    def _load(self) -> dict[str, Any]:
        """The record, or {} (nothing to fall back on, nothing refused) when there is none,
        it is unreadable, or someone other than root could have written it."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return {}
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
                return {}
            try:
                data = json.loads(file.read())
            except ValueError:
                return {}
        return data if isinstance(data, dict) else {}

    def _save(self, data: dict[str, Any]) -> None:
        write_atomically(self.path, json.dumps(data), mode=0o600)

    def accepted(self) -> Files | None:
        files = self._load().get("accepted")
        if not isinstance(files, dict) or not isinstance(files.get("slurm.conf"), str):
            return None
        return {n: files[n] for n in CONFIG_FILES if isinstance(files.get(n), str)}

    def refusal(self, key: str) -> str | None:
        """What slurmctld said when it refused the configuration `key`, if it did."""
        refused = self._load().get("refused")
        if isinstance(refused, dict) and refused.get("fingerprint") == key:
            return str(refused.get("reason", ""))
        return None

    def accept(self, files: Mapping[str, str]) -> None:
        with self._updating() as data:
            data["accepted"] = dict(files)

    def refuse(self, key: str, reason: str) -> None:
        with self._updating() as data:
            data["refused"] = {"fingerprint": key, "reason": reason}

    @contextlib.contextmanager
    def _updating(self) -> Iterator[dict[str, Any]]:
        """The record to change, saved after: one writer at a time, across the pods that
        share the volume (values controller.backup), so that no update is lost."""
        with exclusive(self.path.with_name(f".{self.path.name}.lock")):
            data = self._load()
            yield data
            self._save(data)


def boot_files(rendered: Files, slurm_version: str, record: Record) -> tuple[Files, str | None]:
    """The files slurmctld starts on: cluster.yaml's, unless slurmctld refused exactly these
    before and has accepted others since (then those, and a line saying why)."""
    reason = record.refusal(fingerprint(rendered, slurm_version))
    accepted = record.accepted()
    if reason is None:
        return rendered, None
    if accepted is None:
        return (
            rendered,
            f"slurmctld refused cluster.yaml's configuration before ({reason}) "
            "and none was accepted to fall back on; trying it again",
        )
    return (
        accepted,
        f"slurmctld refused cluster.yaml's configuration before ({reason}); "
        "starting on the last configuration it accepted",
    )
