"""The sync's safety rules, on directory entries given directly (real slapd: integration)."""

from __future__ import annotations

import pytest

from slonk.config.spec import parse_spec
from slonk.users.directory import Directory, DirectoryError
from slonk.users.sync import Paths, SyncRefused, sync

LDAP = {"uris": ["ldap://directory"], "userBase": "ou=people,dc=x", "groupBase": "ou=groups,dc=x"}


def _user(name, uid, gid=5000, shell="/bin/bash", keys=()):
    return {"dn": [f"uid={name},ou=people,dc=x"], "uid": [name], "uidNumber": [str(uid)],
            "gidNumber": [str(gid)], "loginShell": [shell], "sshPublicKey": list(keys)}


def _group(name, gid, members=()):
    return {"dn": [f"cn={name},ou=groups,dc=x"], "cn": [name], "gidNumber": [str(gid)],
            "memberUid": list(members)}


@pytest.fixture
def node(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\nslurm:x:64030:64030::/:/bin/false\n")
    (etc / "group").write_text("root:x:0:\n")
    (etc / "shadow").write_text("root:*::::::::\n")
    (etc / "shells").write_text("/bin/sh\n/bin/bash\n")
    (tmp_path / "home").mkdir()
    return Paths(etc=etc, home=tmp_path / "home", state=tmp_path / "state.json")


def _spec(static_users=(), **ldap):
    return parse_spec({"clusterName": "x", "release": "r", "users": list(static_users),
                       "ldap": {**LDAP, **ldap}})


def _reader(users, groups=()):
    return lambda settings: Directory(users=list(users), groups=list(groups), server="ldap://d")


def _names(node):
    return [line.split(":")[0] for line in (node.etc / "passwd").read_text().splitlines()]


def test_bad_entries_are_skipped_and_counted_the_rest_sync(node):
    users = [
        _user("alice", 2001, keys=["ssh-ed25519 AAAA alice"]),
        _user("Bad Name", 2002),
        _user("bob", 2001),             # alice's uid
        _user("carol", 2003, shell="/bin/nope"),
        _user("root", 2004),            # an image account
        _user("dave", 50),              # below minUid
        {"dn": ["uid=erin,ou=people,dc=x"], "uid": ["erin"], "gidNumber": ["1"]},  # no uidNumber
    ]
    result = sync(_spec(), node, read=_reader(users, [_group("research", 3000, ["alice"])]))
    assert [u.name for u in result.users] == ["alice"]
    assert dict(result.skipped) == {
        "invalid user name": 1, "duplicate uid": 1, "invalid shell": 1, "system account": 1,
        "uid below 1000": 1, "no uidNumber or gidNumber": 1}
    assert "skipped user uid=bob,ou=people,dc=x (bob, uid 2001): duplicate uid" in result.warnings
    assert _names(node) == ["root", "slurm", "alice"]
    assert "research:x:3000:alice" in (node.etc / "group").read_text()
    assert (node.etc / "ssh/authorized_keys/alice").read_text() == "ssh-ed25519 AAAA alice\n"


def test_a_failed_search_changes_nothing(node):
    sync(_spec(), node, read=_reader([_user("alice", 2001)]))
    before = (node.etc / "passwd").read_text()

    def unreachable(settings):
        raise DirectoryError("no LDAP server answered")

    with pytest.raises(DirectoryError):
        sync(_spec(), node, read=unreachable)
    assert (node.etc / "passwd").read_text() == before


def test_an_empty_search_removes_no_one(node):
    sync(_spec(), node, read=_reader([_user("alice", 2001)]))
    with pytest.raises(SyncRefused, match=r"returned no users .* keeping the 1 synced before"):
        sync(_spec(), node, read=_reader([]))
    assert "alice" in _names(node)


def test_mass_removal_is_refused_unless_forced(node):
    everyone = [_user(f"u{i}", 2000 + i) for i in range(20)]
    sync(_spec(), node, read=_reader(everyone))
    sync(_spec(), node, read=_reader(everyone[:18]))  # 2 of 20 = 10%: allowed
    assert "u19" not in _names(node)
    with pytest.raises(SyncRefused, match=r"would remove 3 of 18 users \(more than 10%\)"):
        sync(_spec(), node, read=_reader(everyone[:15]))
    assert "u17" in _names(node)
    sync(_spec(), node, read=_reader(everyone[:15]), force=True)
    assert "u17" not in _names(node)
    assert not (node.etc / "ssh/authorized_keys/u17").exists()


def test_static_users_merge_and_clashes_are_skipped(node):
    static = [{"name": "alice", "uid": 2001, "gid": 2001},
              {"name": "svc", "uid": 3001, "gid": 3001}]
    users = [_user("alice", 2999), _user("svc", 3001), _user("bob", 2002)]
    result = sync(_spec(static), node, read=_reader(users))
    assert sorted(u.name for u in result.users) == ["alice", "bob", "svc"]
    assert "alice:x:2001:2001::/home/alice:/bin/bash" in (node.etc / "passwd").read_text()
    assert result.skipped["clashes with a static user"] == 1


def test_an_unchanged_resync_rewrites_nothing(node):
    users = [_user(f"u{i}", 2000 + i) for i in range(5)]
    sync(_spec(), node, read=_reader(users))
    stamps = {f: (node.etc / f).stat().st_mtime_ns for f in ("passwd", "group", "shadow")}
    sync(_spec(), node, read=_reader(users))
    assert {f: (node.etc / f).stat().st_mtime_ns for f in stamps} == stamps
