"""Job hooks: which revisions may run, what the dispatcher does, and the local git-sync."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from slonk.config.spec import HookSettings
from slonk.hooks import dispatch
from slonk.hooks.revision import consider, problems, read_status, write_settings
from slonk.local.gitsync import sync_once

SETTINGS = HookSettings(phases={"prolog": "prolog.d", "epilog": "epilog.d"}, timeout_seconds=2,
                        max_file_bytes=200)


def _script(folder, name, text, mode=0o755):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    (folder / name).chmod(mode)


def test_a_good_tree_passes(tmp_path):
    _script(tmp_path / "prolog.d", "10-sh", "#!/bin/sh\necho hi\n")
    _script(tmp_path / "prolog.d", "20-py", "#!/usr/bin/env python3\nprint('hi')\n")
    _script(tmp_path / "epilog.d", "10-bash", "#!/bin/bash\n[[ -n x ]] && echo ok\n")
    (tmp_path / "prolog.d" / ".hidden").write_text("ignored")
    (tmp_path / "README").write_text("not a hook")
    assert problems(tmp_path, SETTINGS) == []


@pytest.mark.parametrize(("name", "text", "mode", "problem"), [
    ("a", "#!/bin/sh\necho\n", 0o644, "prolog.d/a: not executable"),
    ("b", "echo no interpreter\n", 0o755, "prolog.d/b: no #! line"),
    ("c", "#!/bin/bash\nif then fi\n", 0o755,
     "prolog.d/c: line 2: syntax error near unexpected token `then'"),
    ("d", "#!/usr/bin/python3\ndef f(:\n", 0o755, "prolog.d/d: line 2: invalid syntax"),
    ("e", "#!/bin/sh\n" + "#" * 300 + "\n", 0o755, "prolog.d/e: larger than 200 bytes"),
])
def test_bad_scripts_are_named(tmp_path, name, text, mode, problem):
    _script(tmp_path / "prolog.d", name, text, mode)
    assert problems(tmp_path, SETTINGS) == [problem]


def test_a_bad_revision_is_refused_and_the_good_one_stays(tmp_path):
    good, bad, state = tmp_path / "good", tmp_path / "bad", tmp_path / "state"
    _script(good / "prolog.d", "10-ok", "#!/bin/sh\necho ok\n")
    _script(bad / "prolog.d", "10-ok", "#!/bin/sh\nif\n")
    assert consider(good, "aaa", SETTINGS, state)
    assert not consider(bad, "bbb", SETTINGS, state)
    status = read_status(state)
    assert status["active"]["revision"] == "aaa"
    assert status["refused"]["revision"] == "bbb"
    assert "prolog.d/10-ok" in status["refused"]["reason"]
    assert (state / "active" / "prolog" / "10-ok").read_text() == "#!/bin/sh\necho ok\n"
    good.rename(tmp_path / "gone")  # git-sync removes old worktrees: the store keeps a copy
    assert (state / "active" / "prolog" / "10-ok").exists()


def test_dispatcher_runs_in_order_logs_and_fails_on_the_first_error(tmp_path, monkeypatch):
    state, logs = tmp_path / "state", tmp_path / "logs"
    tree = tmp_path / "tree"
    _script(tree / "prolog.d", "10-first", "#!/bin/sh\necho first $SLURM_JOB_ID\n")
    _script(tree / "prolog.d", "20-fails", "#!/bin/sh\necho oops >&2\nexit 3\n")
    _script(tree / "prolog.d", "30-never", "#!/bin/sh\necho never\n")
    consider(tree, "rev", SETTINGS, state)
    write_settings(SETTINGS, state)
    drained = []
    monkeypatch.setattr(dispatch, "drain", drained.append)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert dispatch.run("prolog", state, logs) == 1
    log = (logs / "42.log").read_text()
    assert "first 42" in log and "oops" in log and "never" not in log
    assert drained == ["slonk:prolog:20-fails: exit 3"]
    assert dispatch.run("epilog", state, logs) == 0  # no epilog scripts: nothing to do


def test_dispatcher_times_out_a_script(tmp_path, monkeypatch):
    state, tree = tmp_path / "state", tmp_path / "tree"
    _script(tree / "epilog.d", "10-slow", "#!/bin/sh\nsleep 30\n")
    consider(tree, "rev", SETTINGS, state)
    write_settings(SETTINGS, state)
    drained = []
    monkeypatch.setattr(dispatch, "drain", drained.append)
    assert dispatch.run("epilog", state, tmp_path / "logs") == 1
    assert drained == ["slonk:epilog:10-slow: timed out after 2 s"]
    assert json.loads((state / "settings.json").read_text()) == {"timeoutSeconds": 2}


def _commit(repo, name, text):
    (repo / name).write_text(text)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qm", name], check=True)
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_local_git_sync_keeps_git_syncs_contract(tmp_path):
    repo, root = tmp_path / "repo", tmp_path / "root"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    first = _commit(repo, "a", "1")
    assert sync_once(f"file://{repo}", "HEAD", root, "hooks", 1) == first
    assert os.readlink(root / "hooks") == f".worktrees/{first}"
    assert sync_once(f"file://{repo}", "HEAD", root, "hooks", 1) is None
    second = _commit(repo, "b", "2")
    assert sync_once(f"file://{repo}", "HEAD", root, "hooks", 1) == second
    assert (root / "hooks" / "b").read_text() == "2"
    assert not (root / ".worktrees" / first).exists()
