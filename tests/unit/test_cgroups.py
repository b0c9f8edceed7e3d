"""A worker confining jobs makes its cgroup tree writable, or stops saying what to set."""

from __future__ import annotations

from pathlib import Path

import pytest

from slonk.pod import cgroups

# As a runtime mounts it for an unprivileged container, a v1 hybrid host, a privileged one.
READ_ONLY = "1180 1171 0:29 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw"
V1 = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu"
)
WRITABLE = "1180 1171 0:29 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw"


def _prepare(tmp_path: Path, mountinfo: str, answer: tuple[int, str] = (0, "")):
    (tmp_path / "mountinfo").write_text(mountinfo + "\n")
    ran = []

    def run(argv):
        ran.append(list(argv))
        return answer

    return cgroups.prepare(tmp_path / "mountinfo", run), ran


def test_a_read_only_tree_is_remounted_read_write(tmp_path):
    said, ran = _prepare(tmp_path, READ_ONLY)
    assert ran == [["mount", "-o", "remount,rw", "/sys/fs/cgroup"]]
    assert said == "remounted /sys/fs/cgroup read-write (the pod's own cgroup namespace)"


def test_a_writable_tree_is_left_alone(tmp_path):
    said, ran = _prepare(tmp_path, WRITABLE)
    assert (said, ran) == ("/sys/fs/cgroup is writable (cgroup v2)", [])


def test_a_refused_remount_stops_the_pod_saying_what_to_set(tmp_path):
    with pytest.raises(cgroups.ConfinementError) as raised:
        _prepare(tmp_path, READ_ONLY, (32, "mount: /sys/fs/cgroup: permission denied."))
    said = str(raised.value)
    assert "permission denied" in said
    assert "workers.appArmorProfile" in said and "workers.privileged" in said
    assert "\n" not in said


def test_cgroup_v1_stops_the_pod_naming_the_way_out(tmp_path):
    with pytest.raises(cgroups.ConfinementError, match=r"needs cgroup v2.*tmpfs.*confinement none"):
        _prepare(tmp_path, V1)


def test_nothing_mounted_stops_the_pod(tmp_path):
    with pytest.raises(cgroups.ConfinementError, match="nothing is mounted"):
        _prepare(tmp_path, "25 1 0:5 / /proc rw - proc proc rw")
