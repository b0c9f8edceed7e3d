"""Users into passwd/group/shadow: the image's lines as captured, then the managed ones."""

from __future__ import annotations

import pytest

from slonk.config.spec import Group, User
from slonk.users.files import (
    capture_base,
    write_accounts,
    write_authorized_keys,
)

IMAGE = {
    "passwd": "root:x:0:0:root:/root:/bin/bash\nslurm:x:64030:64030::/nonexistent:/bin/false\n",
    "group": "root:x:0:\nshadow:x:42:\n",
    "shadow": "root:*:19000:0:99999:7:::\n",
}


@pytest.fixture
def etc(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    for name, text in IMAGE.items():
        (etc / name).write_text(text)
    return etc


def _text(etc, name):
    return (etc / name).read_text()


def test_the_image_lines_then_one_line_per_account(etc, tmp_path):
    base = capture_base(etc, tmp_path / "base")
    alice = User(name="alice", uid=2001, gid=2001, groups=("research",))
    bob = User(name="bob", uid=2002, gid=3000, groups=("research",))
    write_accounts(base, [alice, bob], [Group("research", 3000), Group("alice", 2001)], etc)
    assert _text(etc, "passwd") == IMAGE["passwd"] + (
        "alice:x:2001:2001::/home/alice:/bin/bash\nbob:x:2002:3000::/home/bob:/bin/bash\n"
    )
    assert _text(etc, "group") == IMAGE["group"] + "research:x:3000:alice,bob\nalice:x:2001:\n"
    assert _text(etc, "shadow") == IMAGE["shadow"] + "alice:*:::::::\nbob:*:::::::\n"
    assert (etc / "shadow").stat().st_mode & 0o777 == 0o640


def test_the_image_is_captured_once_and_restored_after_damage(etc, tmp_path):
    store = tmp_path / "base"
    base = capture_base(etc, store)
    assert (store.stat().st_mode & 0o777, (store / "shadow").stat().st_mode & 0o777) == (
        0o700,
        0o600,
    )
    write_accounts(base, [User("alice", 2001, 2001)], [], etc)
    # By hand, or by an older sync: a uid-0 line added, root's line gone.
    (etc / "passwd").write_text("rootkit::0:0::/root:/bin/bash\nalice:x:2001:2001::/:/bin/sh\n")
    base = capture_base(etc, store)  # read back, not captured again
    write_accounts(base, [User("alice", 2001, 2001)], [], etc)
    assert _text(etc, "passwd") == IMAGE["passwd"] + "alice:x:2001:2001::/home/alice:/bin/bash\n"


def test_writing_twice_changes_nothing(etc, tmp_path):
    base = capture_base(etc, tmp_path / "base")
    users, groups = [User(name="alice", uid=2001, gid=2001)], [Group("research", 3000)]
    write_accounts(base, users, groups, etc)
    stamps = {f: (etc / f).stat().st_mtime_ns for f in IMAGE}
    write_accounts(base, users, groups, etc)
    assert {f: (etc / f).stat().st_mtime_ns for f in IMAGE} == stamps


@pytest.mark.parametrize(
    "field", [{"home": "/home/x\nrootkit::0:0::/root"}, {"shell": "/bin/sh:0"}, {"name": "a\nb"}]
)
def test_a_field_that_would_break_the_line_is_never_written(etc, tmp_path, field):
    """Admission refuses these; the writer refuses them too, should a bug let one by."""
    base = capture_base(etc, tmp_path / "base")
    user = User(**{"name": "alice", "uid": 2001, "gid": 2001, **field})
    with pytest.raises(ValueError, match="refusing to write"):
        write_accounts(base, [user], [], etc)
    assert _text(etc, "passwd") == IMAGE["passwd"]


def test_authorized_keys_one_file_per_user_others_removed(tmp_path):
    alice = User(name="alice", uid=2001, gid=2001, ssh_keys=("ssh-ed25519 AAA a",))
    bob = User(name="bob", uid=2002, gid=2002, ssh_keys=("ssh-ed25519 BBB b",))
    write_authorized_keys([alice, bob], tmp_path)
    keys = tmp_path / "ssh/authorized_keys"
    assert (keys / "alice").read_text() == "ssh-ed25519 AAA a\n"
    write_authorized_keys([alice], tmp_path)
    assert sorted(p.name for p in keys.iterdir()) == ["alice"]
    with pytest.raises(ValueError, match="not one line"):
        write_authorized_keys([User("eve", 2003, 2003, ssh_keys=("k\nssh-ed25519 EVE",))], tmp_path)
