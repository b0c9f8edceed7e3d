"""A worker's /dev/fuse (slonk.pod.fuse): a device plugin's node keeps the machine's mode, root's
alone here; users' containers need it open to them. Nothing else at that path is touched."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from slonk.base import paths
from slonk.pod import fuse


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "fuse"
    monkeypatch.setattr(paths, "FUSE_DEVICE", path)
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_none_and_what_is_not_fuses_device_are_left_alone(node: Path, tmp_path: Path):
    assert fuse.open_to_users() == "none in this pod"
    node.write_text("")
    node.chmod(0o600)
    assert "is not FUSE's device (10:229): left as it is" in fuse.open_to_users()
    assert _mode(node) == 0o600
    node.unlink()
    node.symlink_to(tmp_path / "elsewhere")
    assert "left as it is" in fuse.open_to_users()


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root (CI runs as root)")
def test_fuses_device_is_opened_to_users_and_nulls_is_not(node: Path):
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    fuse.open_to_users()
    assert _mode(node) == 0o600
    node.unlink()
    os.mknod(node, stat.S_IFCHR | 0o600, fuse.DEVICE)
    assert fuse.open_to_users() == "opened to users (mode 0666)"
    assert _mode(node) == 0o666
    assert fuse.open_to_users() == "open to users (mode 0666)"


def test_a_node_the_runtime_keeps_is_reported(node: Path, monkeypatch: pytest.MonkeyPatch):
    device = SimpleNamespace(st_mode=stat.S_IFCHR | 0o600, st_rdev=fuse.DEVICE)
    monkeypatch.setattr(fuse.os, "lstat", lambda path: device)

    def refuse(path: object, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(fuse.os, "chmod", refuse)
    assert fuse.open_to_users() == (
        "left at mode 0600, users' containers cannot mount a SIF: Operation not permitted"
    )
