"""ConfigMap/Secret volumes in kubelet's layout: readers see old or new files, never a mix."""

from __future__ import annotations

import os

from slonk.local.projection import DATA_LINK, project, read


def test_files_are_links_through_data(tmp_path):
    project(tmp_path, {"cluster.yaml": b"a: 1\n", "other": b"x"})
    assert read(tmp_path) == {"cluster.yaml": b"a: 1\n", "other": b"x"}
    assert os.readlink(tmp_path / "cluster.yaml") == f"{DATA_LINK}/cluster.yaml"
    assert (tmp_path / DATA_LINK).is_symlink()


def test_an_update_swaps_data_and_drops_old_files(tmp_path):
    project(tmp_path, {"cluster.yaml": b"a: 1\n", "gone": b"x"})
    first = os.readlink(tmp_path / DATA_LINK)
    project(tmp_path, {"cluster.yaml": b"a: 2\n"})
    assert read(tmp_path) == {"cluster.yaml": b"a: 2\n"}
    assert os.readlink(tmp_path / DATA_LINK) != first
    assert not (tmp_path / first).exists()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("..")) == [
        "cluster.yaml"
    ]


def test_secret_mode(tmp_path):
    project(tmp_path, {"munge.key": b"k" * 64}, mode=0o400)
    assert (tmp_path / "munge.key").stat().st_mode & 0o777 == 0o400
