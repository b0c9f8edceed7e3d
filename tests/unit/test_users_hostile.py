"""From the attacker's side: directory entries and static users built to write lines of their
own into passwd/group/shadow or sshd's keys, to take a system account's name or id, or to
push an existing user out. Whatever they hold, the files are the image's lines as they were
plus exactly one line per admitted account."""

from __future__ import annotations

import base64

import pytest

from slonk.config.spec import SpecError
from slonk.users.sync import last_good, sync

from .test_users_sync import (
    DEMO,
    group_entry,
    managed_lines,
    new_pod,
    reader,
    spec,
    user_entry,
)


@pytest.fixture
def node(tmp_path):
    return new_pod(tmp_path / "pod", tmp_path / "home")


# The accounts every case also carries, and the lines they are written as.
RESEARCH = group_entry("research", 5100, ["demo"])
EXPECTED = {
    "passwd": ["demo:x:5000:5000::/home/demo:/bin/bash"],
    "group": ["research:x:5100:demo", "demo:x:5000:"],
    "shadow": ["demo:*:::::::"],
}
INJECTED = "/home/x\nrootkit::0:0::/root"  # the issue's homeDirectory, once base64-decoded


def _eve(**attributes):
    return user_entry("eve", 5001, **attributes)


HOSTILE_USERS = {
    # Line and field breakers, in every field that reaches a file.
    "home with a newline (base64 in LDIF)": _eve(homeDirectory=INJECTED),
    "home with CR": _eve(homeDirectory="/home/eve\r"),
    "home with NUL": _eve(homeDirectory="/home/eve\x00"),
    "home with ':'": _eve(homeDirectory="/home/eve:0:0"),
    "relative home": _eve(homeDirectory="home/eve"),
    "home with '..'": _eve(homeDirectory="/home/../root"),
    "home not normalised": _eve(homeDirectory="/home//eve"),
    "home with a trailing slash": _eve(homeDirectory="/home/eve/"),
    "home with '.'": _eve(homeDirectory="/home/./eve"),
    "home outside /home": _eve(homeDirectory="/root"),
    "demo's home": _eve(homeDirectory="/home/demo"),
    "a home inside demo's": _eve(homeDirectory="/home/demo/eve"),
    "home beside /home": _eve(homeDirectory="/homeless/eve"),
    "home is /home": _eve(homeDirectory="/home"),
    "home with a space": _eve(homeDirectory="/home/e ve"),
    "shell not in /etc/shells": _eve(shell="/bin/zsh"),
    "shell with a newline": _eve(shell="/bin/bash\nrootkit::0:0::/root:/bin/bash"),
    "shell with ':'": _eve(shell="/bin/bash:x"),
    "relative shell": _eve(shell="bash"),
    "name with a trailing newline": user_entry("eve\n", 5001),
    "name with a newline": user_entry("eve\nrootkit::0:0::/root:/bin/bash", 5001),
    "name with CR": user_entry("eve\r", 5001),
    "name with NUL": user_entry("eve\x00", 5001),
    "name with ':'": user_entry("eve:0", 5001),
    "name with a space": user_entry("eve x", 5001),
    "name starting with '-'": user_entry("-eve", 5001),
    "name too long": user_entry("e" * 33, 5001),
    "two names, neither the RDN's": _eve(uid=["eve", "root"], dn="cn=x,ou=people,dc=x"),
    # Ids of root, shadow, git-sync and nobody; out of range; not numbers.
    "uid 0": user_entry("eve", 0),
    "uid 42": user_entry("eve", 42),
    "uid 65533 (git-sync)": user_entry("eve", 65533),
    "uid 65534 (nobody)": user_entry("eve", 65534),
    "uid above maxId": user_entry("eve", 60001),
    "uid 2^32-1": user_entry("eve", 4294967295),
    "uid -1": user_entry("eve", "-1"),
    "uid with a newline": user_entry("eve", "5001\n0"),
    "uid in other digits": user_entry("eve", "\u0665\u0660\u0660\u0661"),
    "two uids": _eve(uidNumber=["5001", "0"]),
    "gid 0 (root)": user_entry("eve", 5001, gid=0),
    "gid 42 (shadow)": user_entry("eve", 5001, gid=42),
    "gid 65534 (nogroup)": user_entry("eve", 5001, gid=65534),
    "gid above maxId": user_entry("eve", 5001, gid=60001),
    # Names of the image's users and groups, and of the dev user already there.
    "name of a system user": user_entry("root", 5001),
    "name of slurm": user_entry("slurm", 5001),
    "name of nobody": user_entry("nobody", 5001),
    "name of a system group": user_entry("shadow", 5001),
    "personal group named like a system group": user_entry("staff", 5001, gid=5002),
    "demo's uid, DN first": user_entry("aaa", 5000),
    "demo's uid, DN last": user_entry("zzz", 5000),
    "demo's name": user_entry("demo", 5001, dn="uid=demo,ou=aaa,dc=x"),
    "demo's name and uid, another DN": user_entry(
        "demo", 5000, dn="uid=demo,ou=aaa,dc=x", keys=["ssh-ed25519 EVE eve"]
    ),
}

HOSTILE_GROUPS = {
    "group gid 0": group_entry("wheel", 0, ["demo"]),
    "group gid 42": group_entry("wheel", 42, ["demo"]),
    "group gid 65534": group_entry("wheel", 65534, ["demo"]),
    "group gid above maxId": group_entry("wheel", 60001, ["demo"]),
    "group named shadow": group_entry("shadow", 5200, ["demo"]),
    "group named root": group_entry("root", 5200, ["demo"]),
    "group named like a system user": group_entry("daemon", 5200, ["demo"]),
    "group name with a newline": group_entry("wheel\nroot:x:0:demo", 5200, ["demo"]),
    "group name with a trailing newline": group_entry("wheel\n", 5200, ["demo"]),
    "research's gid": group_entry("aaa", 5100, ["demo"]),
    "research's name": group_entry("research", 5200, ["demo"], dn="cn=research,ou=aaa,dc=x"),
    "research's name and gid, another DN": group_entry(
        "research", 5100, ["demo", "eve"], dn="cn=research,ou=aaa,dc=x"
    ),
    "demo's personal gid": group_entry("evilgrp", 5000, ["mallory"]),
    "demo's personal group": group_entry("demo", 5000, ["mallory"]),
    "a group without a DN (a personal group's)": {**group_entry("evilgrp", 5200), "dn": [""]},
}


def _first_sync(node):
    sync(spec(), node, read=reader([DEMO], [RESEARCH]))
    assert managed_lines(node) == EXPECTED


@pytest.mark.parametrize("entry", HOSTILE_USERS.values(), ids=HOSTILE_USERS)
def test_a_hostile_user_entry_writes_nothing(node, entry):
    _first_sync(node)
    result = sync(spec(), node, read=reader([entry, DEMO], [RESEARCH]))
    assert managed_lines(node) == EXPECTED
    assert [u.name for u in result.users] == ["demo"]
    assert sum(result.skipped.values()) == 1
    assert all("\n" not in w and "\r" not in w and "\x00" not in w for w in result.warnings)
    keys = node.etc / "ssh/authorized_keys"
    assert sorted(p.name for p in keys.iterdir()) == ["demo"]
    assert (keys / "demo").read_text() == "ssh-ed25519 DEMO demo\n"


@pytest.mark.parametrize("entry", HOSTILE_GROUPS.values(), ids=HOSTILE_GROUPS)
def test_a_hostile_group_entry_writes_nothing(node, entry):
    _first_sync(node)
    result = sync(spec(), node, read=reader([DEMO], [entry, RESEARCH]))
    assert managed_lines(node) == EXPECTED
    assert sum(result.skipped.values()) == 1


def test_a_member_that_would_write_a_line_is_no_member(node):
    wheel = group_entry("wheel", 5200, ["demo\nroot:x:0:demo", "demo:"])
    sync(spec(), node, read=reader([DEMO], [RESEARCH, wheel]))
    assert managed_lines(node) == {
        **EXPECTED,
        "group": ["research:x:5100:demo", "wheel:x:5200:", "demo:x:5000:"],
    }


def test_the_issues_ldif_home_never_reaches_passwd(node):
    """homeDirectory:: <base64>, as an attacker would add it with ldapadd."""
    encoded = base64.b64encode(INJECTED.encode()).decode()
    assert base64.b64decode(encoded).decode() == INJECTED
    entry = user_entry("eve", 5001, homeDirectory=base64.b64decode(encoded).decode())
    result = sync(spec(), node, read=reader([DEMO, entry], [RESEARCH]))
    assert managed_lines(node) == EXPECTED
    assert result.warnings == [
        "skipped user uid=eve,ou=people,dc=x: home '/home/x\\nrootkit::0:0::/root' is not "
        "an absolute, normalised path of letters, digits and ._+@-"
    ]


def test_a_key_with_a_newline_adds_no_second_key(node):
    entry = user_entry(
        "demo",
        5000,
        keys=[
            "ssh-ed25519 GOOD demo",
            "ssh-ed25519 AAAA x\nssh-ed25519 EVE eve",
            "ssh-ed25519 NUL\x00x",
        ],
    )
    result = sync(spec(), node, read=reader([entry], [RESEARCH]))
    assert managed_lines(node) == EXPECTED  # demo stays, without the bad keys
    assert (node.etc / "ssh/authorized_keys/demo").read_text() == "ssh-ed25519 GOOD demo\n"
    assert result.warnings[0].startswith("user uid=demo,ou=people,dc=x: SSH keys left out: ")


def test_a_later_clean_sync_restores_files_damaged_before(node):
    _first_sync(node)
    for name, line in (
        ("passwd", "rootkit::0:0::/root:/bin/bash"),
        ("group", "shadow:x:42:demo"),
        ("shadow", "rootkit::0:0:99999:7:::"),
    ):
        path = node.etc / name
        path.write_text(path.read_text().replace("root:", "gone:", 1) + line + "\n")
    (node.etc / "ssh/authorized_keys/rootkit").write_text("ssh-ed25519 EVE eve\n")
    sync(spec(), node, read=reader([DEMO], [RESEARCH]))
    assert managed_lines(node) == EXPECTED
    assert sorted(p.name for p in (node.etc / "ssh/authorized_keys").iterdir()) == ["demo"]


def test_a_hostile_snapshot_passes_the_same_rules(node, tmp_path):
    """Whatever the snapshot holds is checked again when a new pod starts from it."""
    node.home.mkdir(exist_ok=True)
    sync(spec(), node, read=reader([DEMO, _eve(homeDirectory=INJECTED)], [RESEARCH]))
    later = new_pod(tmp_path / "later", node.home)
    result = sync(spec(), later, read=last_good(later))
    assert managed_lines(later) == EXPECTED
    assert result.skipped == {"invalid home": 1}


# Static users and groups: the spec refuses what it can see; the pod refuses the rest.

STATIC = {"name": "alice", "uid": 2001, "gid": 2001}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"shell": "/bin/bash\nrootkit::0:0::/root:/bin/bash"},
            "users[0].shell: '/bin/bash\\nrootkit::0:0::/root:/bin/bash' holds a control",
        ),
        ({"shell": "bash"}, "users[0].shell: shell bash is not an absolute"),
        ({"name": "alice\n"}, "users[0].name: 'alice\\n' holds a control character"),
        ({"name": "root:x"}, "users[0].name: 'root:x' is not a valid user name"),
        ({"uid": 0}, "users[0].uid: uid 0 is outside 1000-60000"),
        ({"uid": 65534}, "users[0].uid: uid 65534 is reserved for nobody"),
        ({"uid": 65533}, "users[0].uid: uid 65533 is reserved for git-sync's user"),
        ({"uid": 60001}, "users[0].uid: uid 60001 is outside 1000-60000"),
        ({"gid": 42}, "users[0].gid: gid 42 is outside 1000-60000"),
        (
            {"sshKeys": ["ssh-ed25519 A a\nssh-ed25519 EVE eve"]},
            "users[0].sshKeys[0]: 'ssh-ed25519 A a\\nssh-ed25519 EVE eve' "
            "holds a control character",
        ),
        (
            {"sshKeys": ["ssh-ed25519 A a\x00"]},
            "users[0].sshKeys[0]: 'ssh-ed25519 A a\\x00' holds a control character",
        ),
    ],
)
def test_bad_static_users_are_refused_with_their_key(change, message):
    with pytest.raises(SpecError) as caught:
        spec([{**STATIC, **change}])
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        (
            [{"name": "shadow\n", "gid": 5000}],
            "groups[0].name: 'shadow\\n' holds a control character",
        ),
        ([{"name": "wheel", "gid": 0}], "groups[0].gid: gid 0 is outside 1000-60000"),
        ([{"name": "a", "gid": 5000}, {"name": "b", "gid": 5000}], "groups[1].gid: duplicate gid"),
    ],
)
def test_bad_static_groups_are_refused_with_their_key(groups, message):
    with pytest.raises(SpecError) as caught:
        spec(static_groups=groups)
    assert message in str(caught.value)


def test_static_users_may_not_share_a_uid():
    with pytest.raises(SpecError, match=r"users\[1\]\.uid: duplicate uid 2001"):
        spec([STATIC, {**STATIC, "name": "bob"}])


@pytest.mark.parametrize(
    ("user", "reason"),
    [
        ({"name": "root", "uid": 2001, "gid": 2001}, "name root is the image's"),
        ({"name": "slurm", "uid": 2001, "gid": 2001}, "name slurm is the image's"),
        ({"name": "staff", "uid": 2001, "gid": 2001}, "name staff is the image's"),
        (
            {"name": "alice", "uid": 2001, "gid": 2001, "shell": "/bin/zsh"},
            "shell /bin/zsh is not in /etc/shells",
        ),
    ],
)
def test_static_users_the_pod_refuses(node, user, reason):
    result = sync(spec([user]), node, read=reader([DEMO], [RESEARCH]))
    assert managed_lines(node) == EXPECTED
    assert f"skipped static user {user['name']}: {reason}" in result.warnings


def test_the_range_is_one_setting_for_static_and_directory_accounts(node):
    accounts = {"minId": 100, "maxId": 200000}
    result = sync(
        spec([{"name": "svc", "uid": 150, "gid": 150}], accounts=accounts),
        node,
        read=reader([DEMO, user_entry("big", 150000, gid=150000)], [RESEARCH]),
    )
    assert sorted(u.name for u in result.users) == ["big", "demo", "svc"]
    with pytest.raises(SpecError, match=r"users\[0\]\.uid: uid 150 is outside 1000-60000"):
        spec([{"name": "svc", "uid": 150, "gid": 150}])
    with pytest.raises(SpecError, match=r"accounts\.maxId: 4294967296 is beyond 2147483647"):
        spec(accounts={"maxId": 2**32})
    with pytest.raises(SpecError, match=r"accounts\.minId: must be >= 1, got 0"):
        spec(accounts={"minId": 0})
    with pytest.raises(SpecError, match=r"accounts\.homeRoots\[0\]: home root / is not"):
        spec(accounts={"homeRoots": ["/"]})


def test_a_home_holding_another_users_home_is_refused(node):
    alice = user_entry("alice", 5001, homeDirectory="/home/research/alice")
    lead = user_entry("lead", 5002, homeDirectory="/home/research")  # would own alice's parent
    result = sync(spec(), node, read=reader([DEMO, alice, lead], [RESEARCH]))
    assert sorted(u.name for u in result.users) == ["alice", "demo"]
    assert (
        "skipped user uid=lead,ou=people,dc=x: home /home/research holds alice's home"
        in result.warnings
    )


def test_homes_under_another_root(node):
    entry = user_entry("eve", 5001, homeDirectory="/data/home/eve")
    result = sync(
        spec(accounts={"homeRoots": ["/home", "/data/home"]}),
        node,
        read=reader([DEMO, entry], [RESEARCH]),
    )
    assert "eve:x:5001:5000::/data/home/eve:/bin/bash" in managed_lines(node)["passwd"]
    assert result.skipped == {}
