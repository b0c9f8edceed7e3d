"""A state directory another host user made, owns, can write or pointed a link at is refused
by every `slonk local` command before it reads or writes anything there: it would hold the
controller's API token and the cluster's keys, and `up` would take a munge key planted in it.
Nothing is chmod or chown'd to make it do."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slonk import cli
from slonk.local import cluster
from slonk.local.state import StateDirError, check_state_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes files of another user (root)")

NOBODY = 65534  # an unprivileged host user: the attacker


def _made_by_nobody(path: Path, mode: int = 0o700) -> Path:
    path.mkdir(mode=mode)
    os.chown(path, NOBODY, NOBODY)
    return path


def _planted_munge_key(state: Path) -> Path:
    """What the attacker leaves for `up`: a projected Secret it keeps, as the chart's
    `lookup` would, instead of making its own key."""
    key = state / "secrets" / "slonk-munge" / "..data" / "munge.key"
    key.parent.mkdir(parents=True)
    key.write_text("the attacker's key\n")
    for path in (key, *key.parents):
        if path == state.parent:
            break
        os.chown(path, NOBODY, NOBODY)
    return key


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.lstat().st_uid, stat.S_IMODE(p.lstat().st_mode))
        for p in [folder, *folder.rglob("*")]
    }


def test_up_refuses_a_state_dir_a_user_made_and_writes_nothing_in_it(tmp_path, capsys):
    state = _made_by_nobody(tmp_path / "state")
    key = _planted_munge_key(state)
    before = _snapshot(state)
    assert cli.main(["local", "up", "--state-dir", str(state)]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"slonk: error: state dir {state} is owned by nobody (uid 65534)")
    assert "install -d -m 0700" in error and error.count("\n") == 1
    assert _snapshot(state) == before  # no cluster.json, no chmod, no chown
    assert key.read_text() == "the attacker's key\n"
    with pytest.raises(StateDirError, match="owned by nobody"):
        cluster.up(state)  # the API refuses it as well
    assert _snapshot(state) == before


def test_up_refuses_to_make_the_state_dir_in_a_users_directory(tmp_path):
    home = _made_by_nobody(tmp_path / "home", 0o755)
    with pytest.raises(StateDirError, match=rf"state dir {home}/slonk: {home} is owned by nobody"):
        cluster.up(home / "slonk")
    assert list(home.iterdir()) == []


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o1777])
def test_a_state_dir_others_can_write_is_refused_not_chmod(tmp_path, mode):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)
    with pytest.raises(StateDirError, match=rf"writable by group or others \(mode {mode:04o}\)"):
        cluster.up(state)
    assert (stat.S_IMODE(state.stat().st_mode), list(state.iterdir())) == (mode, [])


@pytest.mark.parametrize("planted_by", [NOBODY, 0])
def test_a_state_dir_that_is_a_link_is_refused_and_not_followed(tmp_path, planted_by):
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "state"
    link.symlink_to(target)
    os.lchown(link, planted_by, planted_by)
    for command in ("up", "status", "down"):
        assert cli.main(["local", command, "--state-dir", str(link)]) == 1
    with pytest.raises(StateDirError, match=rf"^state dir {link} is a symbolic link \(to {target}"):
        cluster.up(link)
    assert list(target.iterdir()) == []


def test_a_link_a_user_planted_above_the_state_dir_is_refused(tmp_path):
    shared = tmp_path / "shared"  # writable by all, sticky, as /tmp is
    shared.mkdir()
    shared.chmod(0o1777)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = shared / "link"
    link.symlink_to(real)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(StateDirError, match=rf"{link} is owned by nobody"):
        cluster.up(link / "state")
    assert list(real.iterdir()) == []


def test_a_link_root_made_above_it_is_checked_where_it_leads(tmp_path):
    users = _made_by_nobody(tmp_path / "users", 0o755)
    link = tmp_path / "link"
    link.symlink_to(users)
    with pytest.raises(StateDirError, match=rf"state dir {link}/state: {users} is owned by nobody"):
        check_state_dir(link / "state")


def test_a_file_a_user_planted_in_roots_state_dir_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    key = _planted_munge_key(state)
    os.chown(state, 0, 0)
    with pytest.raises(StateDirError, match=rf"{state / 'secrets'} is owned by nobody"):
        cluster.up(state)
    for folder in key.parents:
        if folder == state:
            break
        os.chown(folder, 0, 0)  # root took the folders back, not the key
    with pytest.raises(StateDirError, match=rf"{key} is owned by nobody.*planted"):
        cluster.up(state)
    assert sorted(p.name for p in state.iterdir()) == ["secrets"]


def test_a_directory_that_is_no_state_dir_is_neither_tightened_nor_purged(tmp_path):
    etc = tmp_path / "etc"  # `--state-dir /etc` by mistake
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0::/root:/bin/bash\n")
    before = _snapshot(etc)
    assert cli.main(["local", "down", "--purge", "--state-dir", str(etc)]) == 1
    with pytest.raises(StateDirError, match=r"holds passwd, which no state dir holds"):
        cluster.up(etc)
    assert _snapshot(etc) == before
    with pytest.raises(StateDirError, match="not an absolute, normalised path"):
        check_state_dir(Path("/"))


def test_roots_own_state_dir_passes_under_a_sticky_tmp(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    assert check_state_dir(tmp_path / "state") == tmp_path / "state"  # to make, in root's
    state = shared / "state"
    state.mkdir(mode=0o700)
    for name in ("cluster.json", ".cluster.json.k2x9", "secrets", "volumes", "upgrade.lock"):
        (state / name).touch() if "." in name else (state / name).mkdir()
    volume = state / "volumes" / "home" / "alice"  # users' files live in volumes: theirs
    volume.mkdir(parents=True)
    os.chown(volume, NOBODY, NOBODY)
    assert check_state_dir(state) == state


def test_making_the_state_dir_in_a_sticky_tmp_itself_is_refused(tmp_path):
    """Between root's check and its mkdir, another user could make it there first."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(StateDirError, match=rf"{shared} is writable by group or others"):
        check_state_dir(shared / "state")
