"""A chart upgrade across Slurm releases: the state Slurm 22.05 (slonk 0.2.0) left on the
controller's volume, met by slonk's controller init in the 24.11 image's userland."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from slonk import paths

from .conftest import image

HOST_SLURMCTLD = shutil.which("slurmctld")

CONF = """\
ClusterName=upg
SlurmctldHost=h(10.79.0.1)
SlurmUser=root
StateSaveLocation={state}
SlurmctldPidFile={state}/../slurmctld.pid
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
MailProg=/bin/true
NodeName=n1 NodeAddr=10.79.0.1 CPUs=1 State=UNKNOWN
PartitionName=main Nodes=n1 Default=YES State=UP
"""

# In a netns with an address (Slurm's getaddrinfo needs more than loopback) and the name
# slurm.conf gives: until it says it serves, then a stop, which saves its state.
MAKE_STATE = """
set -e
ip link set lo up
ip link add v0 type veth peer name v1
ip addr add 10.79.0.1/24 dev v0; ip link set v0 up; ip link set v1 up
hostname h
slurmctld -D -f "$1" > "$2" 2>&1 & pid=$!
until grep -q "Running as primary controller" "$2"; do kill -0 $pid; sleep 0.05; done
kill -TERM $pid; wait $pid || true
"""

# The image's layers under a private upper layer, the state at the chart's mount path, the
# checkout's code first on the path: then the very step `slonk init` runs for the controller.
CHECK_IN_IMAGE = """
set -e
mkdir -p "$1/upper" "$1/work" "$1/root"
mount -t overlay overlay -o "lowerdir=$2,upperdir=$1/upper,workdir=$1/work" "$1/root"
mkdir -p "$1/root/var/spool/slurmctld" "$1/root/opt/slonk-src"
mount --bind "$3" "$1/root/var/spool/slurmctld"
mount --bind "$4" "$1/root/opt/slonk-src"
exec chroot "$1/root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin PYTHONPATH=/opt/slonk-src \
  python3 -c 'from slonk import init; print(init.check_state())'
"""


def host_release() -> str:
    if HOST_SLURMCTLD is None:
        return ""
    return subprocess.run([HOST_SLURMCTLD, "-V"], capture_output=True, text=True).stdout


def digest(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*")) if p.is_file()
    }


@pytest.mark.skipif(" 22.05." not in host_release(), reason="the host has no Slurm 22.05")
def test_0_3_0_controller_refuses_0_2_0_state_and_leaves_it(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    conf = tmp_path / "slurm.conf"
    conf.write_text(CONF.format(state=state))
    log = tmp_path / "slurmctld-22.05.log"
    subprocess.run(
        ["unshare", "--net", "--uts", "--pid", "--fork", "sh", "-c", MAKE_STATE, "-",
         str(conf), str(log)], check=True, timeout=120,
    )
    assert (state / "job_state").is_file(), log.read_text()
    before = digest(state)

    layers = subprocess.run(
        ["podman", "image", "inspect", image("controller"), "--format",
         "{{.GraphDriver.Data.UpperDir}}:{{.GraphDriver.Data.LowerDir}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    src = Path(paths.__file__).resolve().parents[1]
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", CHECK_IN_IMAGE, "-",
         str(tmp_path / "image"), layers, str(state), str(src)],
        capture_output=True, text=True, timeout=120,
    )

    assert result.returncode == 1, result.stdout + result.stderr
    said = result.stderr.strip().splitlines()[-1]
    assert "statesave.StateError: /var/spool/slurmctld holds Slurm 22.05's state (job_state);" \
        " this image's slurmctld is 24.11, which recovers state from 23.02 to 24.11 only" in said
    assert digest(state) == before  # not a byte of it changed
