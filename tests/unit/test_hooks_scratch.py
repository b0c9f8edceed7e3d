"""What a user leaves in scratch goes with their last job on the node, removed as that user:
tried from the user's side (links to root's files, entries of others, a process still there)."""

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

    said = scratch.clean(USER, USER, time.time() + 1, (str(tmp),))

    assert sorted(p.name for p in tmp.iterdir()) == ["others", "roots"]
    assert root_file.read_text() == "root's"
    assert said == f"scratch: removed 3 entries uid {USER} left"


def test_an_entry_changed_after_the_epilog_began_stays(tmp: Path):
    old, new = tmp / "old", tmp / "new"
    for path in (old, new):
        path.write_text("x")
        own(path, USER)
    began = time.time()
    os.utime(old, (began - 60, began - 60))
    os.utime(new, (began + 5, began + 5))  # a new job of theirs, started meanwhile
    scratch.clean(USER, USER, began, (str(tmp),))
    assert [p.name for p in tmp.iterdir()] == ["new"]


def test_nothing_goes_while_the_user_runs_a_process_on_the_node(tmp: Path):
    (tmp / "in-use").write_text("x")
    own(tmp / "in-use", USER)
    with subprocess.Popen(["sleep", "60"], user=USER, group=USER) as process:
        try:
            said = scratch.clean(USER, USER, time.time() + 1, (str(tmp),))
        finally:
            process.kill()
    assert (tmp / "in-use").exists()
    assert said == f"scratch kept: uid {USER} still runs processes on the node"


def test_roots_entries_are_never_touched(tmp: Path):
    (tmp / "roots").write_text("x")
    assert scratch.clean(0, 0, time.time() + 1, (str(tmp),)) == ""
    assert (tmp / "roots").exists()


def test_the_epilog_takes_the_user_from_slurms_environment(tmp: Path):
    (tmp / "left").write_text("x")
    own(tmp / "left", USER)
    dirs = (str(tmp),)
    assert scratch.after_job({"SLURM_JOB_UID": "nobody"}, dirs) == ""
    assert (tmp / "left").exists()
    said = scratch.after_job({"SLURM_JOB_UID": str(USER), "SLURM_JOB_GID": str(USER)}, dirs)
    assert said == f"scratch: removed 1 entries uid {USER} left"


def test_every_owner_without_a_process_is_cleaned_for_the_check(tmp: Path):
    for name, uid in (("a", USER), ("b", OTHER), ("r", 0)):
        (tmp / name).write_text("x")
        own(tmp / name, uid)
    said = scratch.clean_left_behind(str(tmp), time.time() + 1)
    assert [p.name for p in tmp.iterdir()] == ["r"]
    assert len(said) == 2
