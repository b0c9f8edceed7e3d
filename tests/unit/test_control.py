"""Which controller pod holds control (slonk.slurm.control): the first, in SlurmctldHost's
order, whose slurmctld answers; with one controller, always it, without asking Slurm."""

from __future__ import annotations

from slonk.config.spec import parse_spec
from slonk.slurm.control import answering, held_elsewhere, in_control

PRIMARY, BACKUP = "slonk-controller-0", "slonk-controller-1"


def test_one_controller_is_always_in_control_and_slurm_is_not_asked(demo_spec):
    def ask() -> list[str] | None:
        raise AssertionError("asked")

    spec = parse_spec(demo_spec)
    assert in_control(spec, PRIMARY, ask) and in_control(spec, "a-host-of-any-name", ask)
    assert held_elsewhere(spec, PRIMARY, ask) is None


def test_with_a_backup_the_first_that_answers_holds_control(demo_spec):
    spec = parse_spec({**demo_spec, "backupController": {"takeoverSeconds": 5}})
    assert spec.controller_names == (PRIMARY, BACKUP)
    both, backup_alone = (lambda: [PRIMARY, BACKUP]), (lambda: [BACKUP])
    assert in_control(spec, PRIMARY, both) and not in_control(spec, BACKUP, both)
    assert in_control(spec, BACKUP, backup_alone) and not in_control(spec, PRIMARY, backup_alone)
    assert (
        held_elsewhere(spec, BACKUP, both) == PRIMARY
        and held_elsewhere(spec, PRIMARY, both) is None
    )
    for unknown in (lambda: None, lambda: []):  # scontrol could not say, or nobody answers
        assert not in_control(spec, PRIMARY, unknown) and not in_control(spec, BACKUP, unknown)
        assert held_elsewhere(spec, PRIMARY, unknown) is None  # a syncer keeps going


# `scontrol ping --json` of Slurm 24.11.5 with the primary's pod stopped (local mode), cut to
# what is read.
PING = """{"pings": [
  {"hostname": "slonk-controller-0", "pinged": "DOWN", "responding": false, "latency": 0,
   "mode": "primary", "primary": true},
  {"hostname": "slonk-controller-1", "pinged": "UP", "responding": true, "latency": 937,
   "mode": "backup", "primary": false}
], "meta": {}, "errors": [], "warnings": []}"""


def test_scontrol_ping_is_read_on_the_pods_own_files(tmp_path, monkeypatch):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        f'#!/bin/sh\necho "$SLURM_CONF $*" > {tmp_path}/asked\ncat <<EOF\n{PING}\nEOF\n'
    )
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert answering("/etc/slurm/slurmctld/slurm.conf") == [BACKUP]
    assert (tmp_path / "asked").read_text() == "/etc/slurm/slurmctld/slurm.conf ping --json\n"
    scontrol.write_text("#!/bin/sh\necho 'scontrol: error: no configuration' >&2; exit 1\n")
    assert answering() is None
