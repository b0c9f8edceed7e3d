"""The baseline: one slurmctld and one slurmd configured by hand, nothing of slonk's.

They run as a sysadmin would start them (Debian's default paths, a minimal slurm.conf), in
private network, UTS, mount and PID namespaces so that nothing touches the host: loopback
only, tmpfs over the directories they write. Stopping the namespace's first process ends all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

SLURM_CONF = """\
ClusterName=bare
SlurmctldHost=bare
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SlurmdParameters=config_overrides
MailProg=/bin/true
ReturnToService=2
NodeName=bare CPUs={cpus} RealMemory=1024 NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=main Nodes=bare Default=YES MaxTime=INFINITE State=UP
"""

START = """\
set -e
ip link set lo up
# Slurm resolves its listening address with AI_ADDRCONFIG, which finds nothing when
# loopback is the only interface: give the namespace one more, on a private address.
ip link add eth0 type veth peer name eth1
ip addr add 10.74.0.1/24 dev eth0
ip link set eth1 up
ip link set eth0 up
hostname bare
printf '127.0.0.1 localhost bare\n' > "$DIR/hosts"
mount --bind "$DIR/hosts" /etc/hosts
for d in /run/munge /var/lib/munge /var/log/munge /etc/munge /var/spool/slurmctld \
         /var/spool/slurmd /etc/slurm; do mkdir -p "$d"; mount -t tmpfs tmpfs "$d"; done
cp "$DIR/slurm.conf" /etc/slurm/slurm.conf
head -c 1024 /dev/urandom > /etc/munge/munge.key
chown -R munge:munge /run/munge /var/lib/munge /var/log/munge /etc/munge
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
chown slurm:slurm /var/spool/slurmctld
s6-setuidgid munge munged --foreground --log-file=/dev/null &
until [ -S /run/munge/munge.socket.2 ]; do sleep 0.01; done
slurmctld -D >"$DIR/slurmctld.log" 2>&1 &
slurmd -D -N bare >"$DIR/slurmd.log" 2>&1 &
wait
"""


class BarePair:
    def __init__(self, cpus: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="slonk-bench-bare-"))
        (self.dir / "slurm.conf").write_text(SLURM_CONF.format(cpus=cpus))
        self.launcher: subprocess.Popen[bytes] | None = None
        self.pid = 0

    def start(self, timeout: float = 60.0) -> float:
        """Start the pair; returns seconds until the node is idle."""
        started = time.perf_counter()
        self.launcher = subprocess.Popen(
            ["unshare", "--net", "--uts", "--mount", "--pid", "--fork", "--mount-proc",
             "--propagation", "private", "sh", "-c", START],
            env={**os.environ, "DIR": str(self.dir)},
        )
        children = Path(f"/proc/{self.launcher.pid}/task/{self.launcher.pid}/children")
        while not children.exists() or not children.read_text().split():
            time.sleep(0.001)
        self.pid = int(children.read_text().split()[0])
        while "idle" not in self.run("sinfo --noheader --format=%T").stdout:
            if self.launcher.poll() is not None:
                raise RuntimeError(f"bare pair exited with {self.launcher.returncode}")
            if time.perf_counter() - started > timeout:
                raise RuntimeError(f"bare pair not idle after {timeout:.0f} s: see {self.dir}")
            time.sleep(0.01)
        return time.perf_counter() - started

    def argv(self, command: str) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "--net", "--uts", "--mount", "--pid",
                "sh", "-c", command]

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(command), capture_output=True, text=True, check=False)

    def stop(self) -> None:
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self.launcher:
            self.launcher.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
