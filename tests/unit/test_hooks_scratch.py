"""What a user leaves in scratch goes with their last job on the node, removed as that user:
tried from the user's side (links to root's files and to their own, names no log should
print, a modification time set in the future, entries of others, a process or a job still
there)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slonk.hooks import scratch

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="files of other users need root")

USER, OTHER = 5481, 5482  # in no passwd: removing needs only the id


def own(path: Path, uid: int) -> Path:
    os.chown(path, uid, uid, follow_symlinks=False)
    return path


def later(since: float) -> float:
    """A time after every change made so far (the kernel stamps inodes with a coarse clock)."""
    return max(since, time.time()) + 0.001


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A sticky, world-writable scratch directory, as /tmp is, where the user can reach it
    (pytest's own directories are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="slonk-scratch-"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def test_the_users_entries_go_and_nothing_else(tmp: Path, tmp_path: Path):
    root_file = tmp_path / "roots"
    root_file.write_text("root's")
    tree = tmp / "tree"
    (tree / "deep").mkdir(parents=True)
    (tree / "deep" / "f").write_bytes(b"x" * 1000)
    for path in (tree, tree / "deep", tree / "deep" / "f"):
        own(path, USER)
    tree.chmod(0o500)  # a read-only directory of their own is still theirs to remove
    (tmp / "file").write_text("mine")
    own(tmp / "file", USER)
    (tmp / "link").symlink_to(root_file)  # a link of theirs to root's file: the link goes
    own(tmp / "link", USER)
    (tmp / "others").write_text("theirs")
    own(tmp / "others", OTHER)
    (tmp / "roots").write_text("root's")

    said = scratch.clean(USER, USER, later(0), (str(tmp),))

    assert sorted(p.name for p in tmp.iterdir()) == ["others", "roots"]
    assert root_file.read_text() == "root's"
    assert said == f"scratch: removed 3 entries uid {USER} left"


def test_a_link_to_the_users_own_files_elsewhere_changes_nothing_there(tmp: Path, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    kept = home / "kept"
    kept.write_text("x")
    for path in (home, kept):
        own(path, USER)
    kept.chmod(0o400)
    tmp_path.chmod(0o755)
    (tmp / "to-home").symlink_to(home)
    own(tmp / "to-home", USER)
    scratch.clean(USER, USER, later(0), (str(tmp),))
    assert list(tmp.iterdir()) == []
    assert kept.exists() and (kept.stat().st_mode & 0o777) == 0o400


def test_names_no_log_could_print_are_removed_and_counted_once(tmp: Path):
    for name in (b"\xff\xfe", b"a\nb\nc", b"== epilog forged"):
        path = Path(os.fsdecode(bytes(tmp) + b"/" + name))
        path.write_text("x")
        own(path, USER)
    said = scratch.clean(USER, USER, later(0), (str(tmp),))
    assert said == f"scratch: removed 3 entries uid {USER} left"
    assert list(tmp.iterdir()) == []


def test_a_modification_time_set_in_the_future_keeps_nothing(tmp: Path):
    (tmp / "forever").write_text("x")
    own(tmp / "forever", USER)
    os.utime(tmp / "forever", (4102444800, 4102444800))  # 2100: the user can set it so
    scratch.clean(USER, USER, later(0), (str(tmp),))
    assert list(tmp.iterdir()) == []


def test_an_entry_changed_after_the_epilog_began_stays(tmp: Path):
    old, new = tmp / "old", tmp / "new"
    for path in (old, new):
        path.write_text("x")
        own(path, USER)
    began = later(0)
    while os.stat(new).st_ctime <= began:  # a job of theirs starting meanwhile touches it
        os.chmod(new, 0o640)
    scratch.clean(USER, USER, began, (str(tmp),))
    assert [p.name for p in tmp.iterdir()] == ["new"]


def test_roots_entries_are_never_touched(tmp: Path):
    (tmp / "roots").write_text("x")
    assert scratch.clean(0, 0, later(0), (str(tmp),)) == ""
    assert (tmp / "roots").exists()


@pytest.fixture
def left(tmp: Path, monkeypatch) -> Path:
    """An entry the user left, and no other job of theirs on the node unless a test says."""
    (tmp / "left").write_text("x")
    own(tmp / "left", USER)
    monkeypatch.setattr(scratch, "other_job", lambda uid, job, node: "")
    return tmp / "left"


def _epilog(tmp: Path, uid: int | str = USER) -> str:
    env = {"SLURM_JOB_UID": str(uid), "SLURM_JOB_GID": str(uid), "SLURM_JOB_ID": "42"}
    return scratch.after_job(env, (str(tmp),))


def test_the_epilog_takes_the_user_from_slurms_environment(tmp: Path, left: Path):
    assert scratch.after_job({"SLURM_JOB_UID": "nobody"}, (str(tmp),)) == ""
    assert left.exists()
    assert _epilog(tmp) == f"scratch: removed 1 entries uid {USER} left"
    assert not left.exists()


def test_nothing_goes_while_the_user_runs_a_process_on_the_node(tmp: Path, left: Path):
    with subprocess.Popen(["sleep", "60"], user=USER, group=USER) as process:
        try:
            said = _epilog(tmp)
        finally:
            process.kill()
    assert left.exists()
    assert said == f"scratch kept: uid {USER} still runs processes on the node"


def test_nothing_goes_while_slurm_shows_another_job_of_theirs_here(tmp, left, monkeypatch):
    asked = []

    def other_job(uid: int, job: str, node: str) -> str:
        asked.append((uid, job))
        return "has another job on the node (7)"

    monkeypatch.setattr(scratch, "other_job", other_job)
    assert _epilog(tmp) == f"scratch kept: uid {USER} has another job on the node (7)"
    assert left.exists() and asked == [(USER, "42")]
    # A user who left nothing costs slurmctld no question.
    assert _epilog(tmp, OTHER) == "" and len(asked) == 1


def test_every_owner_without_a_process_is_cleaned_for_the_check(tmp: Path, monkeypatch):
    for name, uid in (("a", USER), ("b", OTHER), ("r", 0)):
        (tmp / name).write_text("x")
        own(tmp / name, uid)
    assert scratch.clean_left_behind(str(tmp), later(0)) == []  # not a scratch directory
    monkeypatch.setattr(scratch, "SCRATCH_DIRS", (str(tmp),))
    said = scratch.clean_left_behind(str(tmp), later(0))
    assert [p.name for p in tmp.iterdir()] == ["r"]
    assert len(said) == 2
