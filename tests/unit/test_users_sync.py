"""The sync's safety rules, on directory entries given directly (real slapd: integration)."""

from __future__ import annotations

import json
import shutil
import stat

import pytest

from slonk.config.spec import parse_spec
from slonk.users.directory import Directory, DirectoryError
from slonk.users.sync import Paths, SyncRefused, last_good, sync

LDAP = {"uris": ["ldap://directory"], "userBase": "ou=people,dc=x", "groupBase": "ou=groups,dc=x"}
IMAGE = {
    "passwd": "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n"
    "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n"
    "slurm:x:64030:64030::/nonexistent:/bin/false\n",
    "group": "root:x:0:\nshadow:x:42:\nstaff:x:50:\nnogroup:x:65534:\nslurm:x:64030:\n",
    "shadow": "root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n",
}
FILES = ("passwd", "group", "shadow")


def user_entry(name, number, gid=5000, shell="/bin/bash", keys=(), dn=None, **attributes):
    entry = {
        "dn": [dn or f"uid={name},ou=people,dc=x"],
        "uid": [name],
        "uidNumber": [str(number)],
        "gidNumber": [str(gid)],
        "loginShell": [shell],
        "sshPublicKey": list(keys),
    }
    entry.update({k: v if isinstance(v, list) else [v] for k, v in attributes.items()})
    return entry


def group_entry(name, gid, members=(), dn=None):
    return {
        "dn": [dn or f"cn={name},ou=groups,dc=x"],
        "cn": [name],
        "gidNumber": [str(gid)],
        "memberUid": list(members),
    }


def new_pod(tmp_path, home):
    """A pod's own files, fresh from the image, sharing `home` with every other pod."""
    etc = tmp_path / "etc"
    etc.mkdir(parents=True)
    for name, text in IMAGE.items():
        (etc / name).write_text(text)
    (etc / "shells").write_text("/bin/sh\n/bin/bash\n")
    home.mkdir(exist_ok=True)
    return Paths(etc=etc, home=home, var=tmp_path / "var")


@pytest.fixture
def node(tmp_path):
    return new_pod(tmp_path / "pod", tmp_path / "home")


def spec(static_users=(), static_groups=(), accounts=None, **ldap):
    data = {
        "clusterName": "x",
        "release": "r",
        "users": list(static_users),
        "groups": list(static_groups),
        "ldap": {**LDAP, **ldap},
    }
    if accounts:
        data["accounts"] = accounts
    return parse_spec(data)


def reader(users, groups=()):
    return lambda settings: Directory(users=list(users), groups=list(groups), server="ldap://d")


def unreachable(settings):
    raise DirectoryError("no LDAP server answered")


def names(node):
    return [line.split(":")[0] for line in (node.etc / "passwd").read_text().splitlines()]


def managed_lines(node):
    """Each file's lines after the image's, which must be there as they were."""
    lines = {}
    for name in FILES:
        text = (node.etc / name).read_text()
        assert text.startswith(IMAGE[name]), name
        lines[name] = text[len(IMAGE[name]) :].splitlines()
    return lines


def test_bad_entries_are_skipped_and_counted_the_rest_sync(node):
    users = [
        user_entry("alice", 2001, keys=["ssh-ed25519 AAAA alice"]),
        user_entry("Bad Name", 2002),
        user_entry("bob", 2001),  # alice's uid
        user_entry("carol", 2003, shell="/bin/nope"),
        user_entry("root", 2004),  # an image account
        user_entry("dave", 50),  # below minId
        {"dn": ["uid=erin,ou=people,dc=x"], "uid": ["erin"], "gidNumber": ["1"]},  # no uidNumber
    ]
    result = sync(spec(), node, read=reader(users, [group_entry("research", 3000, ["alice"])]))
    assert [u.name for u in result.users] == ["alice"]
    assert dict(result.skipped) == {
        "invalid user name": 1,
        "duplicate uid": 1,
        "invalid shell": 1,
        "image account": 1,
        "invalid uid": 1,
        "no uidNumber": 1,
    }
    assert "skipped user uid=bob,ou=people,dc=x: uid 2001 is alice's" in result.warnings
    assert "skipped user uid=dave,ou=people,dc=x: uid 50 is outside 1000-60000" in result.warnings
    assert managed_lines(node) == {
        "passwd": ["alice:x:2001:5000::/home/alice:/bin/bash"],
        "group": ["research:x:3000:alice", "alice:x:5000:"],
        "shadow": ["alice:*:::::::"],
    }
    assert (node.etc / "ssh/authorized_keys/alice").read_text() == "ssh-ed25519 AAAA alice\n"


def test_a_failed_search_changes_nothing(node):
    sync(spec(), node, read=reader([user_entry("alice", 2001)]))
    before = (node.etc / "passwd").read_text()
    with pytest.raises(DirectoryError):
        sync(spec(), node, read=unreachable)
    assert (node.etc / "passwd").read_text() == before


def test_an_empty_search_removes_no_one(node):
    sync(spec(), node, read=reader([user_entry("alice", 2001)]))
    with pytest.raises(SyncRefused, match=r"returned no users .* keeping the 1 synced before"):
        sync(spec(), node, read=reader([]))
    assert "alice" in names(node)


def test_mass_removal_is_refused_unless_forced(node):
    everyone = [user_entry(f"u{i}", 2000 + i) for i in range(20)]
    sync(spec(), node, read=reader(everyone))
    sync(spec(), node, read=reader(everyone[:18]))  # 2 of 20 = 10%: allowed
    assert "u19" not in names(node)
    with pytest.raises(SyncRefused, match=r"would remove 3 of 18 users \(more than 10%\)"):
        sync(spec(), node, read=reader(everyone[:15]))
    assert "u17" in names(node)
    sync(spec(), node, read=reader(everyone[:15]), force=True)
    assert "u17" not in names(node)
    assert not (node.etc / "ssh/authorized_keys/u17").exists()


def test_static_users_merge_and_clashes_are_skipped(node):
    static = [
        {"name": "alice", "uid": 2001, "gid": 2001},
        {"name": "svc", "uid": 3001, "gid": 3001},
    ]
    users = [user_entry("alice", 2999), user_entry("svc", 3001), user_entry("bob", 2002)]
    result = sync(spec(static), node, read=reader(users))
    assert sorted(u.name for u in result.users) == ["alice", "bob", "svc"]
    assert "alice:x:2001:2001::/home/alice:/bin/bash" in (node.etc / "passwd").read_text()
    assert result.skipped == {"duplicate user name": 1}
    assert sorted(result.owners.users) == ["bob"]  # svc is the static account


def test_an_unchanged_resync_rewrites_nothing(node):
    users = [user_entry(f"u{i}", 2000 + i) for i in range(5)]
    sync(spec(), node, read=reader(users))
    stamps = {f: (node.etc / f).stat().st_mtime_ns for f in FILES}
    sync(spec(), node, read=reader(users))
    assert {f: (node.etc / f).stat().st_mtime_ns for f in stamps} == stamps


def test_each_warning_is_reported_once(node):
    users = [user_entry("alice", 2001), user_entry("bob", 2001)]
    first = sync(spec(), node, read=reader(users))
    assert first.new_warnings == ["skipped user uid=bob,ou=people,dc=x: uid 2001 is alice's"]
    # From the second sync on, alice holds it: the message names the holder, once.
    assert sync(spec(), node, read=reader(users)).new_warnings == [
        "skipped user uid=bob,ou=people,dc=x: uid 2001 is alice's "
        "(held by uid=alice,ou=people,dc=x)"
    ]
    assert sync(spec(), node, read=reader(users)).new_warnings == []


def test_personal_groups_are_shared_and_never_take_a_groups_name(node):
    users = [
        user_entry("alice", 2001, gid=7000),
        user_entry("bob", 2002, gid=7000),
        user_entry("research", 2003, gid=7001),
    ]
    result = sync(spec(), node, read=reader(users, [group_entry("research", 3000)]))
    assert managed_lines(node)["group"] == ["research:x:3000:", "alice:x:7000:"]
    assert (
        "user research: no group for its gid 7001: the group research has gid 3000"
        in result.warnings
    )


# The account that held a uid or a name in the last good sync keeps it.

DEMO = user_entry("demo", 5000, keys=["ssh-ed25519 DEMO demo"])


@pytest.mark.parametrize("newcomer_dn", ["uid=aaa,ou=people,dc=x", "uid=zzz,ou=people,dc=x"])
def test_a_newcomer_with_demos_uid_does_not_push_demo_out(node, newcomer_dn, tmp_path):
    sync(spec(), node, read=reader([DEMO]))
    newcomer = user_entry(newcomer_dn[4:7], 5000, keys=["ssh-ed25519 EVE eve"], dn=newcomer_dn)
    result = sync(spec(), node, read=reader([newcomer, DEMO]))
    assert [u.name for u in result.users] == ["demo"]
    assert (
        f"skipped user {newcomer_dn}: uid 5000 is demo's (held by uid=demo,ou=people,dc=x)"
        in result.warnings
    )
    # A pod started later, with nothing of its own: the snapshot on /home says who held it.
    later = new_pod(tmp_path / "later", node.home)
    assert [u.name for u in sync(spec(), later, read=reader([newcomer, DEMO])).users] == ["demo"]


def test_a_second_entry_with_demos_name_does_not_take_it(node):
    sync(spec(), node, read=reader([DEMO]))
    twin = user_entry("demo", 5000, keys=["ssh-ed25519 EVE eve"], dn="uid=demo,ou=aaa,dc=x")
    result = sync(spec(), node, read=reader([twin, DEMO]))
    assert [u.ssh_keys for u in result.users] == [("ssh-ed25519 DEMO demo",)]
    assert (
        "skipped user uid=demo,ou=aaa,dc=x: user name demo is held by "
        "uid=demo,ou=people,dc=x (uid 5000)"
    ) in result.warnings


def test_with_no_sync_before_dn_order_decides_the_same_on_every_pod(node):
    newcomer = user_entry("aaa", 5000)
    assert [u.name for u in sync(spec(), node, read=reader([DEMO, newcomer])).users] == ["aaa"]


# The last good sync, on /home, for pods that start while the directory is down.


def test_the_snapshot_is_roots_alone(node):
    sync(spec(), node, read=reader([DEMO]))
    folder, file = node.snapshot.parent, node.snapshot
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert json.loads(file.read_text())["owners"]["users"] == {
        "demo": {"id": 5000, "dn": "uid=demo,ou=people,dc=x"}
    }


def test_a_new_pod_starts_from_the_last_good_sync(node, tmp_path):
    sync(spec(), node, read=reader([DEMO], [group_entry("research", 5100, ["demo"])]))
    later = new_pod(tmp_path / "later", node.home)
    with pytest.raises(DirectoryError):
        sync(spec(), later, read=unreachable)
    result = sync(spec(), later, read=last_good(later))
    assert [u.name for u in result.users] == ["demo"]
    assert managed_lines(later) == managed_lines(node)
    assert (later.etc / "ssh/authorized_keys/demo").read_text() == "ssh-ed25519 DEMO demo\n"


def test_a_new_pod_applies_the_removal_limit_against_the_snapshot(node, tmp_path):
    everyone = [user_entry(f"u{i}", 2000 + i) for i in range(20)]
    sync(spec(), node, read=reader(everyone))
    later = new_pod(tmp_path / "later", node.home)
    with pytest.raises(SyncRefused, match=r"would remove 5 of 20 users"):
        sync(spec(), later, read=reader(everyone[:15]))


@pytest.mark.parametrize(
    "tamper",
    [
        lambda p: p.parent.chmod(0o755),
        lambda p: p.chmod(0o644),
        lambda p: p.write_text("{not json"),
        lambda p: (p.rename(p.with_name("elsewhere")), p.symlink_to("elsewhere")),
    ],
)
def test_a_snapshot_that_is_not_roots_alone_is_not_used(node, tmp_path, tamper):
    sync(spec(), node, read=reader([DEMO]))
    tamper(node.snapshot)
    later = new_pod(tmp_path / "later", node.home)
    with pytest.raises(DirectoryError, match=r"\.slonk"):
        sync(spec(), later, read=last_good(later))
    result = sync(spec(), later, read=reader([DEMO]))  # the directory answers: all is well
    assert [w for w in result.warnings if w.startswith("last good sync not used: ")]


def test_no_snapshot_yet(node):
    shutil.rmtree(node.home)
    node.home.mkdir()
    with pytest.raises(DirectoryError, match="no snapshot yet"):
        sync(spec(), node, read=last_good(node))


def test_an_unchanged_directory_is_not_written_again(node):
    sync(spec(), node, read=reader([DEMO]))
    stamp = node.snapshot.stat().st_mtime_ns
    sync(spec(), node, read=reader([DEMO]))
    assert node.snapshot.stat().st_mtime_ns == stamp
