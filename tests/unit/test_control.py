"""Which controller pod holds control (slonk.slurm.control): the one whose index Slurm's
heartbeat carries while it is younger than SlurmctldTimeout; with one controller, always it,
without reading anything."""

from __future__ import annotations

import struct
import time

from slonk.config.spec import parse_spec
from slonk.slurm.control import heartbeat, heartbeat_of, held_elsewhere, holder, in_control

PRIMARY, BACKUP = "slonk-controller-0", "slonk-controller-1"
NOW = 1_800_000_000.0


def test_one_controller_is_always_in_control_and_nothing_is_read(demo_spec):
    def beat() -> None:
        raise AssertionError("read")

    spec = parse_spec(demo_spec)
    assert in_control(spec, PRIMARY, beat) and in_control(spec, "a-host-of-any-name", beat)
    assert held_elsewhere(spec, PRIMARY, beat) is None


def test_with_a_backup_the_index_that_beats_holds_control(demo_spec):
    spec = parse_spec({**demo_spec, "backupController": {"takeoverSeconds": 8}})
    assert spec.controller_names == (PRIMARY, BACKUP)
    primary, backup = (lambda: (NOW - 1, 0)), (lambda: (NOW - 1, 1))
    assert holder(spec, primary, lambda: NOW) == PRIMARY
    assert holder(spec, backup, lambda: NOW) == BACKUP
    # A ping would say both are up; only the beat says which one holds control.
    assert in_control(spec, PRIMARY, lambda: (time.time(), 0))
    assert not in_control(spec, BACKUP, lambda: (time.time(), 0))
    assert held_elsewhere(spec, BACKUP, lambda: (time.time(), 0)) == PRIMARY


def test_a_beat_older_than_slurmctld_timeout_names_nobody(demo_spec):
    """The one in control is gone and the other has not taken over: nobody's duties run."""
    spec = parse_spec({**demo_spec, "backupController": {"takeoverSeconds": 8}})
    assert holder(spec, lambda: (NOW - 8, 0), lambda: NOW) == PRIMARY
    assert holder(spec, lambda: (NOW - 9, 0), lambda: NOW) is None
    assert holder(spec, lambda: None, lambda: NOW) is None
    assert holder(spec, lambda: (NOW, 2), lambda: NOW) is None  # no such controller
    # slurmConf's SlurmctldTimeout is what slurmctld runs with: it wins.
    longer = parse_spec({**demo_spec, "backupController": {"takeoverSeconds": 8},
                         "slurmConf": {"SlurmctldTimeout": 60}})  # fmt: skip
    assert holder(longer, lambda: (NOW - 30, 1), lambda: NOW) == BACKUP


def test_slurms_heartbeat_file_is_read_as_slurm_writes_it(tmp_path):
    path = tmp_path / "heartbeat"
    path.write_bytes(struct.pack(">QQ", 1_790_000_000, 1))  # heartbeat.c: htonll(time), htonll(inx)
    assert heartbeat(path) == (1_790_000_000.0, 1)
    path.write_bytes(b"\0" * 8)  # cut short (Slurm before 18.08 wrote no index)
    assert heartbeat(path) is None
    assert heartbeat(tmp_path / "none") is None


def test_the_heartbeat_is_read_where_slurm_conf_keeps_state(demo_spec, tmp_path):
    spec = parse_spec({**demo_spec, "backupController": {"takeoverSeconds": 8},
                       "slurmConf": {"StateSaveLocation": str(tmp_path)}})  # fmt: skip
    beat = int(time.time())
    (tmp_path / "heartbeat").write_bytes(struct.pack(">QQ", beat, 1))
    assert heartbeat_of({"StateSaveLocation": str(tmp_path)}) == (float(beat), 1)
    assert holder(spec) == BACKUP
