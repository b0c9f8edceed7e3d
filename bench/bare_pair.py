"""The baseline: one slurmctld and one slurmd with the configuration slonk renders for the same
values, minus slonk's programs, run from the same Debian 13 userland as Slonk's pods:
slurmctld (and the clients) from the controller image's files, slurmd from the worker image's.

Same configuration: slurm.conf and the files beside it (cgroup.conf, job_container.conf,
topology.conf) are rendered by slonk from a one-node spec, as `slonk local` renders them for
those values. Left out are only the programs slonk adds around Slurm (Prolog, Epilog, the
health checks, power saving's) and where the daemons are (SlurmctldHost, the node's address):
the ratio beside a local cluster is what slonk costs, not a lighter configuration. Jobs run
as the same user (uid, gid, home) as in the local cluster.

Each daemon gets its own root: an overlay of its image's layers (read from podman's store,
never changed) under a private writable layer on a tmpfs. slurmctld (and the workload's
commands) enter the controller's with chroot; slurmd runs as a worker pod's does, its root
reached by pivot_root in a mount namespace of its own whose CPUs' namespace ids are put in
order first (slonk.pod.mount_namespaces): job_container/tmpfs fails every launch under chroot,
and on Linux 6.18 without the ordering. Both run in private network, UTS, mount and PID
namespaces, so that nothing touches the host: the mounts live and die with the mount
namespace, and stopping the namespace's first process ends all.

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
from slonk.config.render import render
from slonk.local import release
from slonk.local.podman import image_layers

VERSION = yaml.safe_load((paths.chart_dir() / "Chart.yaml").read_text())["appVersion"]
# The root each daemon runs in: its image, as a pod of that role would.
IMAGES = {"controller": f"localhost/slonk/controller:{VERSION}",
          "worker": f"localhost/slonk/worker:{VERSION}"}  # fmt: skip
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# What both sides run: one 8-CPU node (config_overrides lets this machine declare it),
# accounting off (the pair has no slurmdbd; bench/accounting.py measures it).
ONE_NODE = """\
nodepools: {cpu: {replicas: 1, cpus: 8, memoryMiB: 1024}}
accounting: {enabled: false}
"""
# slurm.conf keys that name slonk's programs, or only tune when those run.
SLONK_PROGRAMS = (
    "Prolog", "Epilog", "PrologSlurmctld", "EpilogSlurmctld", "TaskProlog", "TaskEpilog",
    "HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState",
    "SuspendProgram", "ResumeProgram", "ResumeFailProgram", "SuspendTime", "SuspendTimeout",
    "SuspendRate", "ResumeTimeout", "ResumeRate", "SuspendExcNodes",
)  # fmt: skip
SLONK_DIRS = ("/run/slonk", "/usr/share/slonk", "/opt/slonk", "/etc/slonk")
USER = {"name": "demo", "uid": 5000, "gid": 5000}  # slonk local's demo user


def slonk_config(values: str = ONE_NODE) -> tuple[dict[str, str], str]:
    """The config files slonk renders for `values` (layered over local mode's defaults, as
    `slonk local up` layers them) with slonk's programs left out, and the one node's name."""
    _, spec = release.render_values(release.layered(yaml.safe_load(values)))
    (node,) = spec.node_names()
    files = render(spec)
    lines = []
    for line in files["slurm.conf"].splitlines():
        key = line.split("=", 1)[0]
        if key in SLONK_PROGRAMS:
            continue
        if key == "SlurmctldHost":
            line = "SlurmctldHost=bare"
        elif key == "NodeName":
            line += " NodeAddr=127.0.0.1"
        if not line.startswith("#") and any(d in line for d in SLONK_DIRS):
            raise RuntimeError(f"the bare pair would run slonk's program: {line}")
        lines.append(line)
    files["slurm.conf"] = "\n".join(lines) + "\n"
    return files, node


# Host tools (iproute2, util-linux) make the namespaces and roots; every Slurm and munge
# binary is the image's, run through chroot (slurmd: pivot_root, below).
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
  cp "$DIR"/conf/* "$DIR/$1/etc/slurm/"
  echo "$USER_NAME:x:$USER_UID:$USER_GID::/home/$USER_NAME:/bin/sh" >> "$DIR/$1/etc/passwd"
  echo "$USER_NAME:x:$USER_GID:" >> "$DIR/$1/etc/group"
  mkdir -p "$DIR/$1/home/$USER_NAME"
  chown "$USER_UID:$USER_GID" "$DIR/$1/home/$USER_NAME"
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
# slurmd as a pod runs it: its root pivoted to (job_container/tmpfs fails every launch under
# chroot: "Can not read return code from slurmstepd"), in a mount namespace of its own whose
# CPUs' namespace ids are put in order first (slonk.pod.mount_namespaces).
unshare --mount --propagation private sh -c '
  set -e
  cd "$0"; mkdir -p .host; pivot_root . .host; cd /; umount -l /.host; rmdir /.host
  exec env -i PATH="$1" NODE="$2" sh -c "
  /opt/slonk/bin/python3 -I -c \\"import slonk.pod.mount_namespaces as m; print(m.order_ids())\\"
  exec slurmd -D -N \\"\\$NODE\\""' "$DIR/worker" "$CHROOT_PATH" "$NODE" >"$DIR/slurmd.log" 2>&1 &
wait
"""


class BarePair:
    def __init__(self, values: str = ONE_NODE) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="slonk-bench-bare-"))
        files, self.node = slonk_config(values)
        (self.dir / "conf").mkdir()
        for name, text in files.items():
            (self.dir / "conf" / name).write_text(text)
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
                 "NODE": self.node, "USER_NAME": USER["name"],
                 "USER_UID": str(USER["uid"]), "USER_GID": str(USER["gid"]),
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

    def argv(self, command: str, root: str = "controller", user: bool = False) -> list[str]:
        """`command` by `sh`, in the namespaces and in the root of `root`'s daemon: as root,
        or as USER from their home."""
        who = ["--userspec", f"{USER['uid']}:{USER['gid']}"] if user else []
        home = f"/home/{USER['name']}" if user else "/root"
        return ["nsenter", "-t", str(self.pid), "--net", "--uts", "--mount", "--pid",
                "chroot", *who, str(self.dir / root), "env", "-i", f"PATH={CHROOT_PATH}",
                f"HOME={home}", "sh", "-c", f'cd "$HOME" && {command}']  # fmt: skip

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

    bare = BarePair()
    try:
        result = {"up_to_idle_seconds": round(bare.start(), 3)}
        result["slurmd_version"] = bare.run("slurmd -V", root="worker").stdout.strip()
        result["slurmctld_version"] = bare.run("slurmctld -V").stdout.strip()
        result.update(workload(bare.argv("sh -s", user=True)))
    finally:
        bare.stop()
    print(json.dumps({"benchmark": "bare_pair", "slots": 8, "bare_pair": result}, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
