"""The node acceptance test's bundle: what it copies out of an image (tests/node/bundle.py)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.node.bundle import Cut


def _image(root: Path) -> Path:
    """A merged-/usr image whose program is reached through three links, as Debian's are."""
    for folder in ("usr/bin", "usr/sbin", "etc/alternatives"):
        (root / folder).mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    (root / "usr/sbin/slurmd-wlm").write_bytes(b"\x7fELF")
    (root / "etc/alternatives/slurmd").symlink_to("/usr/sbin/slurmd-wlm")
    (root / "usr/sbin/slurmd").symlink_to("/etc/alternatives/slurmd")
    (root / "usr/bin/dash").write_bytes(b"\x7fELF")
    (root / "usr/bin/sh").symlink_to("dash")
    return root


def test_a_program_comes_with_every_link_on_its_way(tmp_path: Path) -> None:
    image, out = _image(tmp_path / "image"), tmp_path / "out"
    cut = Cut(out)
    cut.add(image, "/usr/sbin/slurmd")
    cut.add(image, "/bin/sh")
    assert os.readlink(out / "usr/sbin/slurmd") == "/etc/alternatives/slurmd"
    assert os.readlink(out / "etc/alternatives/slurmd") == "/usr/sbin/slurmd-wlm"
    assert (out / "usr/sbin/slurmd-wlm").read_bytes() == b"\x7fELF"
    assert os.readlink(out / "bin") == "usr/bin"
    assert os.readlink(out / "usr/bin/sh") == "dash"
    assert (out / "usr/bin/dash").is_file()
    # Resolved inside the bundle, not on the machine that cut it.
    assert (out / "bin/sh").resolve().is_relative_to(out.resolve())


def test_a_tree_keeps_its_links_and_names_its_programs(tmp_path: Path) -> None:
    image, out = _image(tmp_path / "image"), tmp_path / "out"
    programs = Cut(out).add_tree(image, "/usr/bin")
    assert programs == ["/usr/bin/dash"]
    assert os.readlink(out / "usr/bin/sh") == "dash"


def test_what_the_image_lacks_is_left_out(tmp_path: Path) -> None:
    image, out = _image(tmp_path / "image"), tmp_path / "out"
    Cut(out).add(image, "/usr/bin/nothing")
    assert not (out / "usr/bin/nothing").exists()
