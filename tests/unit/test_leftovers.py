"""What a user leaves on a node goes with their last job there, ended and removed as that
user: tried from the user's side (a daemon that escaped its job, a process forking as fast as
it can, links to root's files and to their own, names no log should print, a modification
time set in the future, entries of others, another job still there)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slonk.health import leftovers

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

    said = leftovers.clean(USER, USER, later(0), (str(tmp),))

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
    leftovers.clean(USER, USER, later(0), (str(tmp),))
    assert list(tmp.iterdir()) == []
    assert kept.exists() and (kept.stat().st_mode & 0o777) == 0o400


def test_names_no_log_could_print_are_removed_and_counted_once(tmp: Path):
    for name in (b"\xff\xfe", b"a\nb\nc", b"== epilog forged"):
        path = Path(os.fsdecode(bytes(tmp) + b"/" + name))
        path.write_text("x")
        own(path, USER)
    said = leftovers.clean(USER, USER, later(0), (str(tmp),))
    assert said == f"scratch: removed 3 entries uid {USER} left"
    assert list(tmp.iterdir()) == []


def test_a_modification_time_set_in_the_future_keeps_nothing(tmp: Path):
    (tmp / "forever").write_text("x")
    own(tmp / "forever", USER)
    os.utime(tmp / "forever", (4102444800, 4102444800))  # 2100: the user can set it so
    leftovers.clean(USER, USER, later(0), (str(tmp),))
    assert list(tmp.iterdir()) == []


def test_an_entry_changed_after_the_epilog_began_stays(tmp: Path):
    old, new = tmp / "old", tmp / "new"
    for path in (old, new):
        path.write_text("x")
        own(path, USER)
    began = later(0)
    while os.stat(new).st_ctime <= began:  # a job of theirs starting meanwhile touches it
        os.chmod(new, 0o640)
    leftovers.clean(USER, USER, began, (str(tmp),))
    assert [p.name for p in tmp.iterdir()] == ["new"]


def test_roots_entries_are_never_touched(tmp: Path):
    (tmp / "roots").write_text("x")
    assert leftovers.clean(0, 0, later(0), (str(tmp),)) == ""
    assert (tmp / "roots").exists()


@pytest.fixture
def left(tmp: Path, monkeypatch) -> Path:
    """An entry the user left, and no other job of theirs on the node unless a test says."""
    (tmp / "left").write_text("x")
    own(tmp / "left", USER)
    monkeypatch.setattr(leftovers, "other_job", lambda uid, job, node: "")
    return tmp / "left"


def _epilog(tmp: Path, uid: int | str = USER) -> str:
    env = {"SLURM_JOB_UID": str(uid), "SLURM_JOB_GID": str(uid), "SLURM_JOB_ID": "42"}
    return leftovers.after_job(env, (str(tmp),))


def test_the_epilog_takes_the_user_from_slurms_environment(tmp: Path, left: Path):
    assert leftovers.after_job({"SLURM_JOB_UID": "nobody"}, (str(tmp),)) == ""
    assert left.exists()
    assert _epilog(tmp) == f"scratch: removed 1 entries uid {USER} left"
    assert not left.exists()


def test_nothing_goes_while_slurm_shows_another_job_of_theirs_here(tmp, left, monkeypatch):
    asked = []

    def other_job(uid: int, job: str, node: str) -> str:
        asked.append((uid, job))
        return "has another job on the node (7)"

    monkeypatch.setattr(leftovers, "other_job", other_job)
    with subprocess.Popen(["sleep", "60"], user=USER, group=USER) as process:
        try:
            said = _epilog(tmp)
            assert process.poll() is None  # a step of their other job, say
        finally:
            process.kill()
    assert said == f"left as they are: uid {USER} has another job on the node (7)"
    assert left.exists() and asked == [(USER, "42")]
    # A user who left nothing costs slurmctld no question.
    assert _epilog(tmp, OTHER) == "" and len(asked) == 1


# Run as PID 1 of a PID namespace of its own, as a pod's init: kill(-1) as USER reaches only
# what runs in it, so no other run on this machine (nor a cluster's pods) can lose a process.
# PID 1 reaps what it inherits, as s6-svscan does (SIGCHLD ignored).
_NODE = """
import os, signal, subprocess, sys, time
from slonk.health import user_processes
from slonk.health import leftovers

signal.signal(signal.SIGCHLD, signal.SIG_IGN)
leftovers.other_job = lambda uid, job, node: ""
USER, OTHER, SYSTEM = (int(a) for a in sys.argv[1:4])
scratch = sys.argv[4]
as_user = dict(user=USER, group=USER)
# Left by the job: a daemon out of its process tree, a loop forking as fast as it can.
subprocess.run(["setsid", "-f", "sleep", "600"], check=True, **as_user)
subprocess.run(["setsid", "-f", "sh", "-c", "while :; do /bin/true; done"], check=True, **as_user)
# And one stopping every process of its user as fast as it can: a helper running as the user
# to end them would be stopped too, and the Epilog hang on it.
stopper = "import os, signal\\nwhile True:\\n    os.kill(-1, signal.SIGSTOP)"
subprocess.run(["setsid", "-f", "/usr/bin/python3", "-c", stopper], check=True, **as_user)
spared = [
    subprocess.Popen(["sleep", "600"]),
    subprocess.Popen(["sleep", "600"], user=OTHER, group=OTHER),
    subprocess.Popen(["sleep", "600"], user=SYSTEM, group=SYSTEM),
]
while len(user_processes.processes(USER)) < 3:
    time.sleep(0.01)
job = {"SLURM_JOB_ID": "42", "SLURM_JOB_GID": str(USER)}
print(leftovers.after_job({**job, "SLURM_JOB_UID": str(USER)}, (scratch,)))
print(leftovers.after_job({**job, "SLURM_JOB_UID": str(SYSTEM)}, (scratch,)))
print(len(user_processes.processes(USER)), [p.poll() for p in spared])
"""


def test_what_a_job_leaves_running_ends_with_it_and_then_its_files_go(tmp: Path, tmp_path: Path):
    (tmp / "left").write_text("x")
    own(tmp / "left", USER)
    system = 999  # a daemon's account (SYSTEM_UID_MAX): a job as it ends none of its processes
    node = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _NODE,
         str(USER), str(OTHER), str(system), str(tmp)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert node.returncode == 0, node.stderr
    ended, untouched, counts = node.stdout.splitlines()
    assert ended.startswith("processes: ended ") and ended.endswith(
        f" uid {USER} left on the node; scratch: removed 1 entries uid {USER} left"
    ), ended
    assert untouched == f"scratch kept: uid {system} still runs processes on the node"
    assert counts == "0 [None, None, None]"  # theirs all gone; root's, another's, the daemon's run
    assert list(tmp.iterdir()) == []


def test_every_owner_without_a_process_is_cleaned_for_the_check(tmp: Path, monkeypatch):
    for name, uid in (("a", USER), ("b", OTHER), ("r", 0)):
        (tmp / name).write_text("x")
        own(tmp / name, uid)
    assert leftovers.clean_left_behind(str(tmp), later(0)) == []  # not a scratch directory
    monkeypatch.setattr(leftovers, "SCRATCH_DIRS", (str(tmp),))
    said = leftovers.clean_left_behind(str(tmp), later(0))
    assert [p.name for p in tmp.iterdir()] == ["r"]
    assert len(said) == 2
