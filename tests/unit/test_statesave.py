"""Which state slurmctld may start on: the decision table, and state files as untrusted bytes."""

from __future__ import annotations

import struct

import pytest

from slonk.slurm.statesave import Release, StateError, check, release_of_header, release_of_version

# The first bytes of job_state as Slurm 22.05.8 wrote it (slonk 0.2.0's image, measured):
# the tag, protocol 0x2600, then the save time.
STATE_22_05 = (
    bytes.fromhex("00000011") + b"PROTOCOL_VERSION\0" + bytes.fromhex("2600000000006b02f85d")
)


def header(protocol: int) -> bytes:
    return struct.pack(">I17sH", 17, b"PROTOCOL_VERSION\0", protocol) + b"\0" * 8


def state(tmp_path, data: bytes, name: str = "job_state"):
    (tmp_path / name).write_bytes(data)
    return tmp_path


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("slurm-wlm 24.11.5", "24.11"),
        ("slurm 22.05.8", "22.05"),
        ("slurm-wlm 23.02.7\n", "23.02"),
        ("slurm 24.05.1", "24.05"),
        ("slurm 25.11.0", "25.11"),
        ("slurm 20.11.9-1", "20.11"),
    ],
)
def test_versions_name_their_release(text, release):
    assert str(release_of_version(text)) == release


@pytest.mark.parametrize(
    "text",
    [
        "",
        "slurm",
        "slurm 22.06.1",
        "slurm 23.05.0",
        "24.11",
        "slurm 24.11.5; rm -rf /",
        "slurm-wlm 24.11.5\nslurm 22.05.8",
        "x" * 10_000,
        "slurm \uff12\uff14.11.5",
    ],
)
def test_anything_else_is_no_release(text):
    with pytest.raises(ValueError):
        release_of_version(text)


def test_release_numbers_follow_slurms_protocol():
    # 9728 and 10752 as 24.11's slurmctld printed them for 22.05's state and itself.
    assert str(release_of_header(STATE_22_05)) == "22.05"
    assert release_of_header(header(10752)) == release_of_version("slurm-wlm 24.11.5")
    assert str(Release(42).oldest_readable()) == "23.02"  # "need >= 9984"
    assert str(Release(38).oldest_readable()) == "20.11"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        STATE_22_05[:20],
        b"\x00\x00\x00\x11PROTOCOL_VERSIOX\x00\x26\x00",
        header(0x2601),
        header(0x1000),
        header(0xFFFF),
        b"\xa2r[",  # three bytes of nothing in particular (fixed: both xdist workers collect it)
    ],
)
def test_headers_that_name_no_release(data):
    with pytest.raises(ValueError):
        release_of_header(data)


# (state's release, image's release, starts?)
DECISIONS = [
    ("24.11", "24.11", True),
    ("24.05", "24.11", True),
    ("23.02", "24.11", True),  # measured: 24.11 recovers from 23.02 on
    ("22.05", "24.11", False),  # slonk 0.2.0 -> 0.3.0: measured, 24.11 refuses and harms it
    ("20.11", "24.11", False),
    ("24.11", "22.05", False),  # a downgrade
    ("24.11", "24.05", False),
    ("22.05", "22.05", True),
    ("21.08", "22.05", True),
    ("20.11", "22.05", True),
    ("20.02", "22.05", False),
    ("24.11", "25.11", True),
    ("24.05", "25.11", True),
    ("23.11", "25.11", False),
]


@pytest.mark.parametrize(("made_by", "image", "starts"), DECISIONS)
def test_decision_table(tmp_path, made_by, image, starts):
    protocol = release_of_version(f"slurm {made_by}.1").protocol
    directory = state(tmp_path, header(protocol << 8))
    if starts:
        assert f"Slurm {made_by}'s state" in check(directory, f"slurm-wlm {image}.1")
        return
    with pytest.raises(StateError) as refused:
        check(directory, f"slurm-wlm {image}.1")
    said = str(refused.value)
    assert f"holds Slurm {made_by}'s state (job_state); this image's slurmctld is {image}" in said
    assert "downgrade" in said if made_by > image else "more releases" in said
    assert "helm rollback" in said and "drain every node" in said


def test_the_0_2_0_state_is_refused_by_0_3_0(tmp_path):
    directory = state(tmp_path, STATE_22_05)
    with pytest.raises(
        StateError,
        match=r"Slurm 22\.05's state .* slurmctld is 24\.11, which "
        r"recovers state from 23\.02 to 24\.11 only",
    ):
        check(directory, "slurm-wlm 24.11.5")


def test_no_state_starts_fresh_whatever_the_version(tmp_path):
    (tmp_path / "slonk-config.json").write_text("{}")
    assert "starts a new one" in check(tmp_path, "garbage")


def test_node_state_speaks_when_job_state_is_missing(tmp_path):
    directory = state(tmp_path, STATE_22_05, "node_state")
    with pytest.raises(StateError, match=r"\(node_state\)"):
        check(directory, "slurm-wlm 24.11.5")


@pytest.mark.parametrize("data", [b"", b"\0" * 64, b"PROTOCOL_VERSION\n\x1b[2J" * 4])
def test_an_unreadable_state_is_not_started_on(tmp_path, data):
    directory = state(tmp_path, data)
    with pytest.raises(StateError, match=r"job_state: cannot tell which Slurm release wrote it"):
        check(directory, "slurm-wlm 24.11.5")
    assert (directory / "job_state").read_bytes() == data  # nothing changed


def test_links_and_directories_are_not_followed(tmp_path):
    (tmp_path / "elsewhere").write_bytes(header(42 << 8))
    (tmp_path / "job_state").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StateError, match="cannot open it"):
        check(tmp_path, "slurm-wlm 24.11.5")
    (tmp_path / "job_state").unlink()
    (tmp_path / "job_state").mkdir()
    with pytest.raises(StateError, match="not a regular file"):
        check(tmp_path, "slurm-wlm 24.11.5")


def test_an_unknown_slurmctld_version_with_a_state_is_not_started(tmp_path):
    directory = state(tmp_path, header(42 << 8))
    with pytest.raises(StateError, match=r"slurmctld -V: not a Slurm version: 'slurm \\x1b'"):
        check(directory, "slurm \x1b")
