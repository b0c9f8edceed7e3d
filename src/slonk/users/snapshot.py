"""The last good directory read, kept where a new pod finds it: on the shared /home.

A pod that starts while LDAP does not answer has a fresh filesystem, so nothing of its own
remembers the directory; /home is the one persistent volume every Slurm pod mounts. The
snapshot holds the entries as read (they pass the same rules again when loaded) and who
held each name. Users can write /home: the directory must be root's and closed (0700), the
file root's 0600, or the snapshot is neither read nor written.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from slonk.base.files import write_atomically
from slonk.users.admit import Owners
from slonk.users.directory import Directory, DirectoryError, Entry

VERSION = 1


class SnapshotError(DirectoryError):
    """No usable snapshot; the message says why."""


def _private(info: os.stat_result, kind: int, path: Path) -> None:
    if stat.S_IFMT(info.st_mode) != kind:
        raise SnapshotError(f"{path}: not a {'directory' if kind == stat.S_IFDIR else 'file'}")
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise SnapshotError(
            f"{path}: owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):o}; "
            f"only uid {os.geteuid()} with no group or other access is trusted"
        )


def _entries(value: Any, what: str) -> list[Entry]:
    ok = isinstance(value, list) and all(
        isinstance(e, dict)
        and isinstance(e.get("dn"), list)
        and len(e["dn"]) == 1
        and all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v)
            for k, v in e.items()
        )
        for e in value
    )
    if not ok:
        raise ValueError(f"{what}: not a list of entries")
    return value


def load(path: Path) -> tuple[Directory, Owners]:
    """The snapshot's directory (not live) and owners; SnapshotError if there is none to
    trust."""
    try:
        _private(path.parent.lstat(), stat.S_IFDIR, path.parent)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError as err:
        raise SnapshotError(f"{path}: no snapshot yet") from err
    except OSError as err:
        raise SnapshotError(f"{path}: {err.strerror}") from err
    with os.fdopen(fd, "rb") as stream:
        _private(os.fstat(stream.fileno()), stat.S_IFREG, path)
        text = stream.read()
    try:
        data = json.loads(text)
        if data.get("version") != VERSION:
            raise ValueError(f"version {data.get('version')!r}, not {VERSION}")
        directory = Directory(
            users=_entries(data["users"], "users"),
            groups=_entries(data["groups"], "groups"),
            server=f"the last good sync ({path}, from {data['server']})",
            live=False,
        )
        return directory, Owners.from_json(data["owners"])
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise SnapshotError(f"{path}: not a snapshot slonk wrote: {err}") from err


def _text(directory: Directory, owners: Owners) -> str:
    def by_dn(entries: list[Entry]) -> list[Entry]:
        return sorted(entries, key=lambda e: e["dn"][0])

    data = {
        "version": VERSION,
        "server": directory.server,
        "users": by_dn(directory.users),
        "groups": by_dn(directory.groups),
        "owners": owners.to_json(),
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"


def save(path: Path, directory: Directory, owners: Owners) -> bool:
    """Replace the snapshot unless it already holds this read (a small digest file says
    so without reading it back: every pod syncs). True when it wrote; SnapshotError when
    the directory is not one to trust, OSError when /home cannot be written."""
    text = _text(directory, owners)
    digest = hashlib.sha256(text.encode()).hexdigest() + "\n"
    digest_path = path.with_name(f"{path.name}.sha256")
    try:
        os.mkdir(path.parent, 0o700)
        os.chmod(path.parent, 0o700)  # whatever the umask
    except FileExistsError:
        pass
    _private(path.parent.lstat(), stat.S_IFDIR, path.parent)
    try:
        if digest_path.read_text() == digest and path.is_file():
            return False
    except FileNotFoundError:
        pass
    write_atomically(path, text, mode=0o600)
    write_atomically(digest_path, digest, mode=0o600)
    return True
