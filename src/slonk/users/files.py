"""Write users and groups into passwd, group and shadow, and their keys for sshd.

Entries slonk manages replace same-named (or same-id) entries; every other line, the
image's system accounts among them, is kept as it is. Each file is replaced in one rename,
and only when its text changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from slonk.config.spec import Group, User
from slonk.files import make_dir, write_atomically

AUTHORIZED_KEYS_DIR = Path("ssh/authorized_keys")
# "*": no password matches. Not "!": sshd without PAM treats that as a locked account
# and refuses even key logins.
NO_PASSWORD = "*"


def _merge(
    lines: list[str], entries: dict[str, str], ids: set[str], id_field: int, drop: set[str]
) -> str:
    """Keep lines that name neither a managed account nor a managed id, nor an account slonk
    wrote before and no longer has (`drop`); add the managed ones."""
    kept = []
    for line in lines:
        fields = line.split(":")
        if not line or fields[0] in entries or fields[0] in drop:
            continue
        if len(fields) > id_field and fields[id_field] in ids:
            continue
        kept.append(line)
    return "\n".join([*kept, *entries.values()]) + "\n"


def _replace(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write `text` unless the file already holds it; True when it wrote."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    write_atomically(path, text, mode=mode)
    return True


def _read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def write_accounts(
    users: Iterable[User],
    groups: Iterable[Group],
    etc: Path = Path("/etc"),
    drop: Iterable[str] = (),
) -> None:
    """Write users (each with a personal group of its gid unless a group has it) and groups
    into etc's files, and remove the accounts named in `drop`."""
    users, groups, drop = list(users), list(groups), set(drop)
    members: dict[str, list[str]] = {g.name: [] for g in groups}
    for user in users:
        for name in user.groups:
            members[name].append(user.name)
    group_entries = {g.name: f"{g.name}:x:{g.gid}:{','.join(members[g.name])}" for g in groups}
    group_gids = {g.gid for g in groups}
    for user in users:
        if user.gid not in group_gids:
            group_entries.setdefault(user.name, f"{user.name}:x:{user.gid}:")
    passwd_entries = {u.name: f"{u.name}:x:{u.uid}:{u.gid}::{u.home_dir}:{u.shell}" for u in users}
    shadow_entries = {u.name: f"{u.name}:{NO_PASSWORD}:::::::" for u in users}

    gids = {entry.split(":")[2] for entry in group_entries.values()}
    uids = {str(u.uid) for u in users}
    _replace(etc / "group", _merge(_read_lines(etc / "group"), group_entries, gids, 2, drop))
    _replace(etc / "passwd", _merge(_read_lines(etc / "passwd"), passwd_entries, uids, 2, drop))
    shadow = _merge(_read_lines(etc / "shadow"), shadow_entries, set(), 2, drop)
    _replace(etc / "shadow", shadow, mode=0o640)


def write_authorized_keys(
    users: Iterable[User], etc: Path = Path("/etc"), drop: Iterable[str] = ()
) -> None:
    """One root-owned file per user, read by sshd's AuthorizedKeysCommand."""
    keys_dir = etc / AUTHORIZED_KEYS_DIR
    make_dir(keys_dir, 0o755)
    for user in users:
        _replace(keys_dir / user.name, "".join(f"{k}\n" for k in user.ssh_keys))
    for name in drop:
        (keys_dir / name).unlink(missing_ok=True)


def make_homes(users: Iterable[User], home: Path = Path("/home")) -> list[str]:
    """Create missing /home/<name> directories on the shared /home (homes elsewhere are the
    directory's business); existing ones are left alone."""
    made = []
    for user in users:
        if user.home_dir != f"/home/{user.name}":
            continue
        path = home / user.name
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made earlier, or by another pod sharing /home
        os.chown(path, user.uid, user.gid)
        made.append(user.name)
    return made
