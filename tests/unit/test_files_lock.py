"""slonk.base.files.exclusive: the lock the controller pods share on the state volume."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slonk.base.files import exclusive


def test_a_second_holder_waits_or_is_told(tmp_path):
    lock = tmp_path / "state" / "x.lock"
    hold = (
        "import sys, time; from pathlib import Path; from slonk.base.files import exclusive\n"
        "with exclusive(Path(sys.argv[1])) as held:\n"
        "    print(held, flush=True); time.sleep(30)\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", hold, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "True"
        with exclusive(lock, wait=False) as held:
            assert held is False
    finally:
        other.kill()
        other.wait()
    with exclusive(lock, wait=False) as held:
        assert held is True
    assert oct(lock.stat().st_mode & 0o777) == "0o600"


def test_a_link_in_the_locks_place_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    (tmp_path / "x.lock").symlink_to(target)
    with pytest.raises(OSError), exclusive(tmp_path / "x.lock"):
        pass
    assert not target.exists()
