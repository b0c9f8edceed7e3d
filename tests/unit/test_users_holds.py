"""From the attacker's side: an entry waiting in the directory for the moment demo's own entry
is skipped, missing or moved, to take demo's name, uid, home and login with a key of its own;
a group taking a user's personal gid; a search that returns no groups. The name and id a good
sync gave an entry stay that entry's (slonk.users.admit: Hold)."""

from __future__ import annotations

import json

import pytest

from slonk.users.admit import HOLD_SECONDS
from slonk.users.sync import SyncRefused, last_good, sync

from .test_users_sync import DEMO, group_entry, managed_lines, new_pod, reader, spec, user_entry

NOW = 1_700_000_000.0  # holds are measured against the `now` each sync is given
DAY = 86400
EVE_KEY = "ssh-ed25519 EVE eve"
# Enough other users that losing demo for a sync stays under the removal limit (10%).
OTHERS = [user_entry(f"u{i}", 6000 + i, gid=6000 + i) for i in range(19)]
OTHER_GROUPS = [group_entry(f"g{i}", 7000 + i) for i in range(19)]
RESEARCH = group_entry("research", 5100, ["demo"])
SQUATTER = user_entry("demo", 5000, keys=[EVE_KEY], dn="uid=demo,ou=aaa,dc=x")
MOVED = user_entry("demo", 5000, keys=["ssh-ed25519 DEMO demo"], dn="uid=demo,ou=staff,dc=x")
DEMO_LINE = "demo:x:5000:5000::/home/demo:/bin/bash"


@pytest.fixture
def node(tmp_path):
    return new_pod(tmp_path / "pod", tmp_path / "home")


def _sync(node, users, groups=(RESEARCH,), now=NOW, **kwargs):
    directory = reader([*users, *OTHERS], [*groups, *OTHER_GROUPS])
    return sync(spec(), node, read=directory, now=now, **kwargs)


def _keys(node):
    """Every authorized key any user has on the pod, by user."""
    folder = node.etc / "ssh/authorized_keys"
    return {p.name: p.read_text() for p in folder.iterdir()}


def _demo_is_demo(node):
    assert DEMO_LINE in managed_lines(node)["passwd"]
    assert _keys(node)["demo"] == "ssh-ed25519 DEMO demo\n"


def _nobody_has_eves_key(node):
    assert all(EVE_KEY not in keys for keys in _keys(node).values())


# demo's own entry skipped for a sync: the hold stays with its DN.

SKIPPED_DEMO = {
    "invalid loginShell": user_entry("demo", 5000, shell="/bin/zsh"),
    "invalid home": user_entry("demo", 5000, homeDirectory="/root"),
    "two uidNumbers": user_entry("demo", 5000, uidNumber=["5000", "5001"]),
    "no uidNumber": {"dn": ["uid=demo,ou=people,dc=x"], "uid": ["demo"], "gidNumber": ["5000"]},
}


@pytest.mark.parametrize("broken", SKIPPED_DEMO.values(), ids=SKIPPED_DEMO)
@pytest.mark.parametrize("waiting", [True, False], ids=["squatter waiting", "squatter new"])
def test_a_squatter_never_gets_demos_account_while_demos_entry_is_skipped(node, broken, waiting):
    _sync(node, [DEMO])
    if waiting:  # refused while demo is there, it waits for its moment
        _sync(node, [DEMO, SQUATTER])
    _demo_is_demo(node)
    result = _sync(node, [broken, SQUATTER], now=NOW + DAY)
    assert "demo" not in [u.name for u in result.users]
    assert "demo" not in _keys(node)
    assert (
        "skipped user uid=demo,ou=aaa,dc=x: user name demo is held by "
        "uid=demo,ou=people,dc=x (uid 5000)"
    ) in result.warnings
    # Fixed a month later: demo is demo again, never locked out by the squatter.
    result = _sync(node, [DEMO, SQUATTER], now=NOW + 40 * DAY)
    _demo_is_demo(node)
    _nobody_has_eves_key(node)
    assert result.owners.users["demo"].dn == "uid=demo,ou=people,dc=x"


def test_a_squatter_on_demos_uid_alone_is_refused_too(node):
    _sync(node, [DEMO])
    aaron = user_entry("aaron", 5000, keys=[EVE_KEY])
    result = _sync(node, [SKIPPED_DEMO["invalid loginShell"], aaron])
    assert (
        "skipped user uid=aaron,ou=people,dc=x: uid 5000 is demo's "
        "(held by uid=demo,ou=people,dc=x)"
    ) in result.warnings
    assert "aaron" not in _keys(node)


def test_a_pod_started_from_the_snapshot_keeps_the_same_holds(node, tmp_path):
    _sync(node, [DEMO])
    _sync(node, [SKIPPED_DEMO["invalid loginShell"]])
    later = new_pod(tmp_path / "later", node.home)
    broken = SKIPPED_DEMO["invalid loginShell"]
    result = _sync(later, [broken, SQUATTER])
    assert "demo" not in [u.name for u in result.users]
    result = sync(spec(), later, read=last_good(later), now=NOW)
    assert "demo" not in [u.name for u in result.users]


# demo's entry moved, deleted or filtered out: its DN is gone.


def test_a_move_alone_keeps_demo(node):
    _sync(node, [DEMO])
    result = _sync(node, [MOVED])
    _demo_is_demo(node)
    assert result.owners.users["demo"].dn == "uid=demo,ou=staff,dc=x"
    assert (
        "user demo (uid 5000) moved from uid=demo,ou=people,dc=x to uid=demo,ou=staff,dc=x"
        in result.warnings
    )


def test_when_several_claim_a_moved_name_none_is_admitted(node):
    _sync(node, [DEMO])
    _sync(node, [DEMO, SQUATTER])
    result = _sync(node, [MOVED, SQUATTER])
    assert "demo" not in [u.name for u in result.users]
    assert "demo" not in _keys(node)
    assert result.skipped["ambiguous claim"] == 2
    assert (
        "skipped user uid=demo,ou=aaa,dc=x: 2 entries claim user name demo with uid 5000, "
        "none at uid=demo,ou=people,dc=x which held it: none admitted"
    ) in result.warnings
    # Someone removes the squatter: the entry that moved is demo.
    _sync(node, [MOVED])
    _demo_is_demo(node)
    _nobody_has_eves_key(node)


def test_a_missing_holders_name_and_uid_wait_a_bounded_time(node):
    _sync(node, [DEMO])
    newcomers = [
        user_entry("demo", 5001, keys=[EVE_KEY], dn="uid=demo,ou=aaa,dc=x"),
        user_entry("aaron", 5000, keys=[EVE_KEY]),
    ]
    result = _sync(node, newcomers, now=NOW + DAY)
    assert result.skipped == {"duplicate user name": 1, "duplicate uid": 1}
    assert "demo" not in _keys(node) and "aaron" not in _keys(node)
    assert any(
        w.startswith(
            "user demo (uid 5000) kept for uid=demo,ou=people,dc=x, missing from the directory"
        )
        for w in result.warnings
    )
    result = _sync(node, newcomers, now=NOW + DAY + HOLD_SECONDS - 1)
    assert result.skipped == {"duplicate user name": 1, "duplicate uid": 1}
    # The hold ran out: the name and the uid are the directory's to give again.
    result = _sync(node, newcomers, now=NOW + DAY + HOLD_SECONDS)
    assert (
        "user demo (uid 5000) released: uid=demo,ou=people,dc=x missing since 2023-11-15 22:13 UTC"
    ) in result.warnings
    assert {"demo", "aaron"} <= {u.name for u in result.users}


def test_a_holder_that_comes_back_keeps_its_hold(node):
    _sync(node, [DEMO])
    _sync(node, [], now=NOW + DAY)
    result = _sync(node, [DEMO, SQUATTER], now=NOW + 20 * DAY)
    _demo_is_demo(node)
    hold = result.owners.users["demo"]
    assert (hold.admitted, hold.gone_since) == (True, None)


def test_a_holder_may_rename_itself_and_its_old_name_is_free(node):
    _sync(node, [DEMO])
    renamed = user_entry("dema", 5000, dn="uid=demo,ou=people,dc=x")
    result = _sync(node, [renamed])
    assert "dema:x:5000:5000::/home/dema:/bin/bash" in managed_lines(node)["passwd"]
    assert "demo" not in result.owners.users
    result = _sync(node, [renamed, user_entry("demo", 5002, gid=5002)])
    assert "demo:x:5002:5002::/home/demo:/bin/bash" in managed_lines(node)["passwd"]


# Groups hold their names and gids the same way.

EVIL_RESEARCH = group_entry("research", 5100, ["demo", "mallory"], dn="cn=research,ou=aaa,dc=x")


def test_a_group_squatter_gets_no_members_while_the_group_is_skipped(node):
    _sync(node, [DEMO])
    broken = {**RESEARCH, "gidNumber": ["5100", "0"]}
    result = _sync(node, [DEMO, user_entry("mallory", 5300, gid=5300)], [broken, EVIL_RESEARCH])
    assert not any(line.startswith("research:") for line in managed_lines(node)["group"])
    assert (
        "skipped group cn=research,ou=aaa,dc=x: group name research is held by "
        "cn=research,ou=groups,dc=x (gid 5100)"
    ) in result.warnings


def test_a_group_that_moved_keeps_its_gid_unless_contested(node):
    _sync(node, [DEMO])
    moved = group_entry("research", 5100, ["demo"], dn="cn=research,ou=teams,dc=x")
    _sync(node, [DEMO], [moved])
    assert "research:x:5100:demo" in managed_lines(node)["group"]
    _sync(
        node,
        [DEMO],
        [group_entry("research", 5100, ["demo"], dn="cn=research,ou=x,dc=x"), EVIL_RESEARCH],
        now=NOW + DAY,
    )
    assert not any(line.startswith("research:") for line in managed_lines(node)["group"])


@pytest.mark.parametrize(
    "group",
    [
        group_entry("evilgrp", 5000, ["mallory"]),
        group_entry("demo", 5000, ["mallory"]),
        group_entry("demo", 5200, ["mallory"]),
    ],
    ids=["another name", "the same name", "the name alone"],
)
def test_no_directory_group_takes_a_users_personal_group(node, group):
    mallory = user_entry("mallory", 5300, gid=5300)
    _sync(node, [DEMO, mallory])
    assert "demo:x:5000:" in managed_lines(node)["group"]
    result = _sync(node, [DEMO, mallory], [RESEARCH, group])
    assert "demo:x:5000:" in managed_lines(node)["group"]
    assert not any("mallory" in line.split(":")[3] for line in managed_lines(node)["group"])
    assert result.skipped.total() == 1
    assert any("user demo's personal group" in w for w in result.warnings)


# A search that returns no groups, or far fewer, is refused like one that returns no users.


def test_an_empty_group_search_drops_no_group(node):
    sync(spec(), node, read=reader([DEMO], [RESEARCH]))
    with pytest.raises(SyncRefused, match=r"would remove 1 of 1 groups \(more than 10%\)"):
        sync(spec(), node, read=reader([DEMO], []))
    assert "research:x:5100:demo" in managed_lines(node)["group"]
    sync(spec(), node, read=reader([DEMO], []), force=True)
    assert not any(line.startswith("research:") for line in managed_lines(node)["group"])


def test_the_removal_limit_counts_directory_groups_not_personal_ones(node):
    teams = [group_entry(f"team{i}", 5500 + i, ["demo"]) for i in range(20)]
    sync(spec(), node, read=reader([DEMO], teams))
    sync(spec(), node, read=reader([DEMO], teams[:18]))
    with pytest.raises(SyncRefused, match=r"would remove 3 of 18 groups"):
        sync(spec(), node, read=reader([DEMO], teams[:15]))


# The record of holds is root's; still, a damaged one must not crash or unlock a sync.


@pytest.mark.parametrize("value", [1e300, float("nan"), -1, "soon", True])
def test_a_damaged_hold_record_is_not_used(node, value):
    _sync(node, [DEMO])
    _sync(node, [SKIPPED_DEMO["invalid loginShell"]], now=NOW + DAY)
    record = json.loads(node.state.read_text())
    record["owners"]["users"]["demo"]["goneSince"] = value
    node.state.write_text(json.dumps(record))
    result = _sync(node, [SKIPPED_DEMO["invalid loginShell"], SQUATTER], now=NOW + 2 * DAY)
    assert "demo" not in [u.name for u in result.users]  # the snapshot on /home stands in
    assert result.owners.users["demo"].dn == "uid=demo,ou=people,dc=x"
