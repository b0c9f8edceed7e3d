"""Users into passwd/group/shadow: managed entries replaced, everything else kept."""

from __future__ import annotations

import os

from slonk.config.spec import Group, User
from slonk.users.files import make_homes, write_accounts, write_authorized_keys

SYSTEM_PASSWD = "root:x:0:0:root:/root:/bin/bash\nslurm:x:64030:64030::/nonexistent:/bin/false\n"


def _etc(tmp_path):
    (tmp_path / "passwd").write_text(SYSTEM_PASSWD + "alice:x:1500:1500::/home/alice:/bin/sh\n")
    (tmp_path / "group").write_text("root:x:0:\nresearch:x:3999:old\n")
    (tmp_path / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    return tmp_path


def test_accounts_replace_managed_entries_and_keep_the_rest(tmp_path):
    etc = _etc(tmp_path)
    alice = User(name="alice", uid=2001, gid=2001, groups=("research",))
    bob = User(name="bob", uid=2002, gid=3000, groups=("research",))
    write_accounts([alice, bob], [Group("research", 3000)], etc)
    assert (etc / "passwd").read_text() == SYSTEM_PASSWD + (
        "alice:x:2001:2001::/home/alice:/bin/bash\nbob:x:2002:3000::/home/bob:/bin/bash\n")
    assert (etc / "group").read_text() == (
        "root:x:0:\nresearch:x:3000:alice,bob\nalice:x:2001:\n")
    shadow = (etc / "shadow").read_text().splitlines()
    assert shadow == ["root:*:19000:0:99999:7:::", "alice:*:::::::", "bob:*:::::::"]
    assert (etc / "shadow").stat().st_mode & 0o777 == 0o640


def test_writing_twice_changes_nothing(tmp_path):
    etc = _etc(tmp_path)
    users, groups = [User(name="alice", uid=2001, gid=2001)], [Group("research", 3000)]
    write_accounts(users, groups, etc)
    first = [(etc / f).read_text() for f in ("passwd", "group", "shadow")]
    write_accounts(users, groups, etc)
    assert [(etc / f).read_text() for f in ("passwd", "group", "shadow")] == first


def test_authorized_keys_and_homes(tmp_path):
    user = User(name="alice", uid=os.getuid(), gid=os.getgid(), ssh_keys=("ssh-ed25519 AAA a",))
    write_authorized_keys([user], tmp_path)
    assert (tmp_path / "ssh/authorized_keys/alice").read_text() == "ssh-ed25519 AAA a\n"
    home = tmp_path / "home"
    home.mkdir()
    assert make_homes([user], home) == ["alice"]
    assert (home / "alice").stat().st_mode & 0o777 == 0o700
    assert make_homes([user], home) == []


