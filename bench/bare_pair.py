"""The baseline: one slurmctld and one slurmd configured by hand, nothing of slonk's, run from
the same Debian 13 userland as Slonk's pods: slurmctld (and the clients) from the controller
image's files, slurmd from the worker image's.

Each daemon gets its own root: an overlay of its image's layers (read from podman's store,
never changed) under a private writable layer on a tmpfs, entered with chroot. Both run as a
sysadmin would start them (Debian's default paths, a minimal slurm.conf) in private network,
UTS, mount and PID namespaces, so that nothing touches the host: the mounts live and die with
the mount namespace, and stopping the namespace's first process ends all.

Run alone, it measures the pair (cold start, job latency, 500-job throughput) and prints
one JSON document; bench/local_cluster.py measures it beside a local cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from slonk.base import paths
from slonk.local.podman import image_layers

VERSION = yaml.safe_load((paths.chart_dir() / "Chart.yaml").read_text())["appVersion"]
# The root each daemon runs in: its image, as a pod of that role would.
IMAGES = {"controller": f"localhost/slonk/controller:{VERSION}",
          "worker": f"localhost/slonk/worker:{VERSION}"}  # fmt: skip
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

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
# No cgroup filesystem in the namespaces: 24.11's slurmd refuses to start without one
# unless its cgroup plugin is off.
CGROUP_CONF = "CgroupPlugin=disabled\n"

# Host tools (iproute2, util-linux) make the namespaces and roots; every Slurm and munge
# binary is the image's, run through chroot.
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
mount -t tmpfs tmpfs "$DIR/layers"
in_root() { root=$1; shift; chroot "$root" env -i PATH="$CHROOT_PATH" "$@"; }
make_root() {  # ROOT LOWERDIRS: the image's layers under a private writable layer
  mkdir -p "$DIR/layers/$1/upper" "$DIR/layers/$1/work"
  mount -t overlay overlay \
    -o "lowerdir=$2,upperdir=$DIR/layers/$1/upper,workdir=$DIR/layers/$1/work" "$DIR/$1"
  mount -t proc proc "$DIR/$1/proc"
  mount --rbind /dev "$DIR/$1/dev"
  mount --rbind /sys "$DIR/$1/sys"
  printf '127.0.0.1 localhost bare\\n' > "$DIR/$1/etc/hosts"
  mkdir -p "$DIR/$1/etc/slurm" "$DIR/$1/run/munge" "$DIR/$1/var/spool/slurmctld" \
    "$DIR/$1/var/spool/slurmd" "$DIR/$1/var/log/munge" "$DIR/$1/var/lib/munge"
  cp "$DIR/slurm.conf" "$DIR/cgroup.conf" "$DIR/$1/etc/slurm/"
  cp "$DIR/munge.key" "$DIR/$1/etc/munge/munge.key"
  # By name, in the root: the image's uids are not the host's.
  in_root "$DIR/$1" chown -R munge:munge /run/munge /var/lib/munge /var/log/munge /etc/munge
  in_root "$DIR/$1" chmod 0700 /etc/munge
  in_root "$DIR/$1" chmod 0400 /etc/munge/munge.key
  in_root "$DIR/$1" chown slurm:slurm /var/spool/slurmctld
  in_root "$DIR/$1" s6-setuidgid munge munged --foreground --log-file=/dev/null &
  until [ -S "$DIR/$1/run/munge/munge.socket.2" ]; do sleep 0.01; done
}
head -c 1024 /dev/urandom > "$DIR/munge.key"
make_root controller "$CONTROLLER_LAYERS" & controller=$!
make_root worker "$WORKER_LAYERS" & worker=$!
wait "$controller"; wait "$worker"  # each root made, or the pair fails
rm "$DIR/munge.key"
in_root "$DIR/controller" slurmctld -D >"$DIR/slurmctld.log" 2>&1 &
in_root "$DIR/worker" slurmd -D -N bare >"$DIR/slurmd.log" 2>&1 &
wait
"""


class BarePair:
    def __init__(self, cpus: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="slonk-bench-bare-"))
        (self.dir / "slurm.conf").write_text(SLURM_CONF.format(cpus=cpus))
        (self.dir / "cgroup.conf").write_text(CGROUP_CONF)
        for name in ("layers", *IMAGES):
            (self.dir / name).mkdir()
        self.layers = {role: ":".join(image_layers(image)) for role, image in IMAGES.items()}
        self.launcher: subprocess.Popen[bytes] | None = None
        self.pid = 0

    def start(self, timeout: float = 60.0) -> float:
        """Start the pair; returns seconds until the node is idle."""
        started = time.perf_counter()
        self.launcher = subprocess.Popen(
            ["unshare", "--net", "--uts", "--mount", "--pid", "--fork", "--mount-proc",
             "--propagation", "private", "sh", "-c", START],
            env={**os.environ, "DIR": str(self.dir), "CHROOT_PATH": CHROOT_PATH,
                 "CONTROLLER_LAYERS": self.layers["controller"],
                 "WORKER_LAYERS": self.layers["worker"]},
        )  # fmt: skip
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

    def argv(self, command: str, root: str = "controller") -> list[str]:
        """`command` by `sh`, in the namespaces and in the root of `root`'s daemon."""
        return ["nsenter", "-t", str(self.pid), "--net", "--uts", "--mount", "--pid",
                "chroot", str(self.dir / root), "env", "-i", f"PATH={CHROOT_PATH}",
                "HOME=/root", "sh", "-c", command]  # fmt: skip

    def run(self, command: str, root: str = "controller") -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(command, root), capture_output=True, text=True,
                              check=False)  # fmt: skip

    def stop(self) -> None:
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self.launcher:
            self.launcher.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> None:
    from local_cluster import workload  # the same workload as beside a local cluster

    bare = BarePair(cpus=8)
    try:
        result = {"up_to_idle_seconds": round(bare.start(), 3)}
        result["slurmd_version"] = bare.run("slurmd -V", root="worker").stdout.strip()
        result["slurmctld_version"] = bare.run("slurmctld -V").stdout.strip()
        result.update(workload(bare.argv("sh -s")))
    finally:
        bare.stop()
    print(json.dumps({"benchmark": "bare_pair", "slots": 8, "bare_pair": result}, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
