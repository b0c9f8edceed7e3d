"""Write users and groups into passwd, group and shadow, and their keys for sshd.

The image's own lines are captured once per pod, before slonk writes anything, and every
write is those lines as they were plus one line per managed account: no image line is ever
dropped or rewritten, and a line someone added or damaged by hand is gone at the next sync.
Each file is replaced in one rename, and only when its text changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from slonk.base.files import make_dir, write_atomically
from slonk.config import accounts
from slonk.config.spec import Group, User

ACCOUNT_FILES = ("passwd", "group", "shadow")
AUTHORIZED_KEYS_DIR = Path("ssh/authorized_keys")
# "*": no password matches. Not "!": sshd without PAM treats that as a locked account
# and refuses even key logins.
NO_PASSWORD = "*"
# What one field of these files can hold. Admission (slonk.users.admit) refuses far more;
# this only makes a bug that lets a bad value through fail before it is written.
_FIELD = re.compile(r"[\x20-\x39\x3b-\x7e]*")


@dataclass(frozen=True)
class Base:
    """The image's passwd, group and shadow, as they were before slonk wrote a line."""

    texts: Mapping[str, str]

    def _column(self, name: str, index: int) -> set[str]:
        rows = (line.split(":") for line in self.texts[name].splitlines())
        return {row[index] for row in rows if len(row) > index and row[0]}

    @cached_property
    def names(self) -> set[str]:
        """User and group names alike: neither kind may be taken by a managed account."""
        return self._column("passwd", 0) | self._column("group", 0)

    @cached_property
    def uids(self) -> set[int]:
        return {int(v) for v in self._column("passwd", 2) if v.isascii() and v.isdigit()}

    @cached_property
    def gids(self) -> set[int]:
        return {int(v) for v in self._column("group", 2) if v.isascii() and v.isdigit()}


def capture_base(etc: Path, store: Path) -> Base:
    """The image's files: copied into `store` by the pod's first sync (nothing managed is
    in etc yet: every pod starts from its image), read from there afterwards."""
    if all((store / name).is_file() for name in ACCOUNT_FILES):
        return Base({name: (store / name).read_text() for name in ACCOUNT_FILES})
    texts = {}
    for name in ACCOUNT_FILES:
        try:
            text = (etc / name).read_text()
        except FileNotFoundError:
            text = ""
        texts[name] = text if not text or text.endswith("\n") else f"{text}\n"
    make_dir(store, 0o700)
    for name in ACCOUNT_FILES:
        write_atomically(store / name, texts[name], mode=0o600)
    return Base(texts)


def _line(*fields: object) -> str:
    for value in fields:
        if not _FIELD.fullmatch(str(value)):
            raise ValueError(f"refusing to write the field {accounts.show(value)}")
    return ":".join(str(v) for v in fields) + "\n"


def _replace(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write `text` unless the file already holds it; True when it wrote."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    write_atomically(path, text, mode=mode)
    return True


def write_accounts(
    base: Base, users: Iterable[User], groups: Iterable[Group], etc: Path = Path("/etc")
) -> None:
    """The image's lines, then the given groups (members from users' `groups`) and users."""
    users, groups = list(users), list(groups)
    members: dict[str, list[str]] = {g.name: [] for g in groups}
    for user in users:
        for name in user.groups:
            members[name].append(user.name)
    lines = {
        "group": [_line(g.name, "x", g.gid, ",".join(members[g.name])) for g in groups],
        "passwd": [_line(u.name, "x", u.uid, u.gid, "", u.home_dir, u.shell) for u in users],
        "shadow": [_line(u.name, NO_PASSWORD, "", "", "", "", "", "", "") for u in users],
    }
    for name in ACCOUNT_FILES:
        text = base.texts[name] + "".join(lines[name])
        _replace(etc / name, text, mode=0o640 if name == "shadow" else 0o644)


def write_authorized_keys(users: Iterable[User], etc: Path = Path("/etc")) -> None:
    """One root-owned file per user, read by sshd's AuthorizedKeysCommand; the directory is
    slonk's own, so any other file in it (a user no longer synced) is removed."""
    keys_dir = etc / AUTHORIZED_KEYS_DIR
    make_dir(keys_dir, 0o755)
    names = set()
    for user in users:
        for key in user.ssh_keys:
            accounts.check_key(key)  # one line each: a bug must not add a key
        _replace(keys_dir / user.name, "".join(f"{k}\n" for k in user.ssh_keys))
        names.add(user.name)
    for path in keys_dir.iterdir():
        if path.name not in names:
            path.unlink()
