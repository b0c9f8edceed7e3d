"""Node acceptance: does the chart's worker run jobs on this machine, as Kubernetes would run it?

Runs a controller pod and one worker pod of the chart (tests/node/bundle.py: the images' own
daemons, the configuration the chart renders, the containers' securityContext as the
rendered StatefulSets ask) in namespaces of their own, as a container runtime starts a pod:
PID, mount, UTS, IPC and cgroup namespaces, the pod's cgroup under this machine's tree,
cgroupfs mounted read-only, /proc and /sys as runc leaves them, the capabilities and seccomp
filter the container asks for (slonk.local.podinit, with no user namespace: a Kubernetes
pod has none). A GPU the machine has is handed over as the NVIDIA device plugin and
container toolkit do: its device nodes, and the host's nvidia-smi and NVML bound in.

Prints one PASS, FAIL or SKIP line per check (SKIP says why the machine cannot run it) and
exits 1 if any failed. Needs root and no network; the pods' logs go to --logs.

    PYTHONPATH=src python3 tests/node/acceptance.py [--bundle build/node] [--logs DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import platform
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slonk.base import paths
from slonk.config.active_checks import ACTIVE_CHECKS, MEASURES
from slonk.health import active, nvml
from slonk.local.pod import launch_command
from slonk.local.podinit import capabilities
from slonk.metrics.gpus import FIELDS as GPU_TELEMETRY
from slonk.pod.cgroups import mount_at

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
CLONE_NEWNS, CLONE_NEWNET = 0x20000, 0x40000000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
SIOCSIFFLAGS, SIOCSIFADDR, IFF_UP, IFF_RUNNING = 0x8914, 0x8916, 0x1, 0x40
POD_ADDRESS = "192.0.2.1"  # TEST-NET-1, on the test's own loopback: reaches nothing
CGROUP = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpu", "cpuset", "memory", "pids")
USER, OTHER = ("alice", 5000), ("bob", 5001)
# linux/capability.h, by number.
CAPABILITIES = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP "
    "LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER "
    "SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE "
    "SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
    "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF "
    "CHECKPOINT_RESTORE"
).split()
POD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NODE = "slonk-cpu-0"
# What the NVIDIA device plugin and container toolkit give a container asking for one GPU.
GPU_DEVICES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
NVML = "libnvidia-ml.so.1"
FUSE = str(paths.FUSE_DEVICE)
# Builds an Apptainer image from a definition file, as a user in a job (a SIF and a sandbox).
APPTAINER_IMAGE = HERE.parent / "support" / "apptainer-image.sh"
BUILT = "built from a definition file"
LIBRARY_DIR = "/usr/lib/x86_64-linux-gnu"
WAIT_SECONDS = 90

# The pods' own start, in place of `slonk init` (whose other steps need the cluster's
# Kubernetes objects): munged as munge, then the role's daemons in the foreground.
PRELUDE = """set -e
exec 2>&1
for user in {users}; do echo "$user" >> /etc/passwd; done
for group in {groups}; do echo "$group" >> /etc/group; done
for user in {names}; do echo "$user:*:20000:0:99999:7:::" >> /etc/shadow; done
mkdir -p /run/munge /run/slurm /run/sshd
chown munge:munge /run/munge
cp /node/munge.key /etc/munge/munge.key
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
setpriv --reuid munge --regid munge --init-groups munged --foreground --log-file=/dev/stderr &
until [ -S /run/munge/munge.socket.2 ]; do sleep 0.05; done
"""
CONTROLLER = """mkdir -p /var/spool/slurmctld && chown slurm:slurm /var/spool/slurmctld
exec slurmctld -D -f /etc/slurm/slurmctld/slurm.conf
"""
WORKER = """{prepare}
# The NVIDIA container toolkit's ldconfig hook, once it bound the driver's NVML in.
if [ -e {nvml} ]; then ldconfig; fi
/usr/bin/python3 -c "{syslog}" &
ssh-keygen -A -q
printf 'UsePAM yes\\n' > /etc/ssh/sshd_config.d/00-slonk-pod.conf
/usr/sbin/sshd -E /run/sshd.log
exec slurmd -D -N "$POD_NAME" --conf-server "$SLURM_CONF_SERVER"
"""
# The job's cgroup's memory.max, as a job sees it (its path in /proc/self/cgroup, cut at the step).
JOB_MEMORY_MAX = "p=$(cut -d: -f3 /proc/self/cgroup); cat /sys/fs/cgroup${p%%/step_*}/memory.max"
# PAM's messages (pam_slurm_adopt: whom it let in, why not) into the pod's log, as the images'
# init layer has them.
SYSLOG = (
    "import socket; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind('/dev/log')\n"
    "while True: print('syslog:', s.recv(4096).decode(errors='replace'), flush=True)"
)
# The init layer's own step (slonk.init): make the pod's cgroup tree usable, or stop saying why.
PREPARE_CGROUPS = (
    "/opt/slonk/bin/python3 -c 'from slonk.pod import cgroups; print(\"init:\", cgroups.prepare())'"
)
# slurm.conf's JobContainerType as slonk renders it (slonk.config.render, whose Jinja2 this
# script, run by the machine's own Python, does without).
JOB_CONTAINER = "job_container/tmpfs"
JOBS_IN_A_ROW = 16
# init's step for a device plugin's /dev/fuse (printed as "fuse:", not init's first line).
PREPARE_FUSE = (
    "/opt/slonk/bin/python3 -c 'from slonk.pod import fuse; print(\"fuse:\", fuse.open_to_users())'"
)
PREPARE_JOB_NAMESPACES = (
    "/opt/slonk/bin/python3 -c "
    "'from slonk.pod import mount_namespaces as m; print(\"init:\", m.order_ids())'"
)


@dataclass
class Result:
    name: str
    outcome: str  # PASS, FAIL or SKIP
    detail: str


@dataclass
class Machine:
    """What this machine offers a pod."""

    kernel: str = platform.release()
    cgroup2: bool = False
    gpus: list[str] = field(default_factory=list)  # nvidia-smi -L's lines
    nvidia_smi: str | None = None
    nvml: str | None = None
    fuse: bool = False  # /dev/fuse, which a FUSE device plugin would hand a worker

    @classmethod
    def read(cls) -> Machine:
        found = mount_at(str(CGROUP), Path("/proc/self/mountinfo").read_text())
        machine = cls(cgroup2=found is not None and found.fstype == "cgroup2")
        machine.fuse = os.path.exists(FUSE)
        machine.nvidia_smi = shutil.which("nvidia-smi")
        machine.nvml = _library(NVML)
        if machine.nvidia_smi and machine.nvml and os.path.exists(GPU_DEVICES[0]):
            listed = subprocess.run(
                [machine.nvidia_smi, "-L"], capture_output=True, text=True, check=False
            )
            machine.gpus = [line for line in listed.stdout.splitlines() if line.strip()]
        return machine

    def case(self) -> str:
        if not self.cgroup2:
            return "none"
        return "cgroup-gpu" if self.gpus else "cgroup"


def _library(name: str) -> str | None:
    """The machine's copy of a driver library: ld.so's cache, else where drivers keep it."""
    listed = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False)
    for line in listed.stdout.splitlines():
        if line.strip().startswith(name) and "x86-64" in line:
            return os.path.realpath(line.split("=>")[-1].strip())
    for folder in (LIBRARY_DIR, "/usr/lib64", "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"):
        if os.path.exists(path := f"{folder}/{name}"):
            return os.path.realpath(path)
    return None


def capability_names(mask: int) -> list[str]:
    return [name for number, name in enumerate(CAPABILITIES) if mask >> number & 1]


def status_mask(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1], 16)
    return 0


_libc = ctypes.CDLL(None, use_errno=True)


def own_network() -> None:
    """This process (and the pods it starts) in a network namespace of its own, loopback up,
    and a mount namespace whose mounts do not reach the machine's."""
    if _libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP | IFF_RUNNING))
        # The pods' address: glibc's getaddrinfo (AI_ADDRCONFIG, as Slurm asks) resolves no
        # IPv4 name where 127.0.0.1 is the only IPv4 address.
        address = socket.inet_aton(POD_ADDRESS)
        request = struct.pack("16sH2s4s8x", b"lo:pods", socket.AF_INET, b"", address)
        fcntl.ioctl(sock, SIOCSIFADDR, request)


class Pods:
    """The test's two pods, their cgroups and files, under one work directory."""

    def __init__(self, work: Path, bundle: Path, case: str, machine: Machine) -> None:
        self.work, self.bundle, self.case, self.machine = work, bundle, case, machine
        self.config = bundle / "cases" / case
        self.specs = json.loads((self.config / "pods.json").read_text())
        self.cgroup = CGROUP / f"slonk-node-{os.getpid()}" if machine.cgroup2 else None
        self.order_namespaces = True  # slonk init's step, unless the run compares without it
        self.pids: dict[str, int] = {}
        self.pidfds: list[int] = []  # each pod's PID 1, held: a PID reused later is never hit
        self.launchers: list[subprocess.Popen[bytes]] = []

    def setup(self) -> None:
        (self.work / "node").mkdir()
        (self.work / "node" / "munge.key").write_bytes(os.urandom(1024))
        home = self.work / "home"
        for name, uid in (USER, OTHER):
            (home / name / ".ssh").mkdir(parents=True)
            for path in (home / name, home / name / ".ssh"):
                os.chown(path, uid, uid)
        (self.work / "home").chmod(0o755)
        if self.cgroup:
            # The controllers slurmd confines jobs with, for the pods' cgroups: enabled in the
            # machine's root cgroup where they are not yet (systemd enables them all).
            offered = (CGROUP / "cgroup.controllers").read_text().split()
            enabled = (CGROUP / "cgroup.subtree_control").read_text().split()
            wanted = [c for c in CONTROLLERS if c in offered]
            if missing := [c for c in wanted if c not in enabled]:
                (CGROUP / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))
            self.cgroup.mkdir()
            (self.cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))

    def hosts(self) -> str:
        names = [
            self.specs["controller"]["name"],
            NODE,
            self.specs["controller"]["env"]["SLURM_CONF_SERVER"].split(":")[0],
        ]
        return f"127.0.0.1 localhost\n{POD_ADDRESS} {' '.join(names)}\n"

    def jobs_in_namespaces(self) -> bool:
        """Whether the rendered slurm.conf gives each job its own /tmp and /dev/shm."""
        conf = (self.config / "slurm.conf").read_text()
        return f"JobContainerType={JOB_CONTAINER}" in conf.splitlines()

    def stub_programs(self) -> str:
        """Shell lines making each job hook and health program the rendered slurm.conf names
        in the init layer's directory (slonk.base.paths.HOOK_BIN: hooks from git, health checks)
        a stub that succeeds: the test runs the daemons, not the init layer."""
        conf = (self.config / "slurm.conf").read_text()
        found = re.findall(
            r"^(?:Prolog|Epilog|\w+Prolog|\w+Epilog|HealthCheckProgram)=(\S+)$", conf, re.MULTILINE
        )
        return "".join(
            f"mkdir -p {os.path.dirname(p)} && printf '#!/bin/sh\\nexit 0\\n' > {p} "
            f"&& chmod 0755 {p}\n"
            for p in found
        )

    def spec(self, role: str) -> dict[str, object]:
        container = self.specs[role]
        pod = self.work / role
        for layer in ("upper", "work", "root"):
            (pod / layer).mkdir(parents=True, exist_ok=True)
        users = [f"{n}:x:{u}:{u}::/home/{n}:/bin/bash" for n, u in (USER, OTHER)]
        groups = [f"{n}:x:{u}:" for n, u in (USER, OTHER)]
        start = PRELUDE.format(
            users=" ".join(f"'{u}'" for u in users),
            groups=" ".join(f"'{g}'" for g in groups),
            names=" ".join(n for n, _ in (USER, OTHER)),
        )
        if role == "controller":
            start += CONTROLLER
        else:
            # The steps of `slonk init` the rendered configuration asks for.
            prepare = [PREPARE_CGROUPS] if self.case != "none" else []
            if self.machine.fuse:
                prepare.append(PREPARE_FUSE)
            if self.order_namespaces and self.jobs_in_namespaces():
                prepare.append(PREPARE_JOB_NAMESPACES)
            start += WORKER.format(
                prepare="\n".join(prepare),
                syslog=SYSLOG,
                nvml=f"{LIBRARY_DIR}/{NVML}",
            )
        if role == "worker":
            start = self.stub_programs() + start
        (self.work / "node" / f"start-{role}").write_text(start)
        binds = [
            {"source": str(self.work / "node"), "target": "/node", "readOnly": True},
            {"source": str(self.work / "home"), "target": "/home", "readOnly": False},
        ]
        devices: list[str] = []
        if role == "controller":
            binds.append(
                {"source": str(self.config), "target": "/etc/slurm/slurmctld", "readOnly": True}
            )
        elif container["gpus"]:
            devices = [d for d in GPU_DEVICES if os.path.exists(d)]
            assert self.machine.nvidia_smi and self.machine.nvml
            binds += [
                {
                    "source": self.machine.nvidia_smi,
                    "target": "/usr/bin/nvidia-smi",
                    "readOnly": True,
                },
                {"source": self.machine.nvml, "target": f"{LIBRARY_DIR}/{NVML}", "readOnly": True},
            ]
        if role == "worker" and self.machine.fuse:
            devices.append(FUSE)  # as a FUSE device plugin (values workers.fuseResource)
        return {
            "hostname": container["name"],
            "capabilities": container["capabilities"],
            "dropCapabilities": container["dropCapabilities"],
            "privileged": container["privileged"],
            "seccomp": container["seccomp"],
            "noNewPrivileges": container["noNewPrivileges"],
            "userNamespace": False,
            "cgroupfs": self.machine.cgroup2,
            "devices": devices,
            "command": ["/bin/sh", f"/node/start-{role}"],
            "env": {
                "PATH": POD_PATH,
                "HOME": "/root",
                "LANG": "C.UTF-8",
                "POD_NAME": container["name"],
                **container["env"],
            },
            "root": {
                "lower": [str(self.bundle / "rootfs")],
                "upper": str(pod / "upper"),
                "work": str(pod / "work"),
                "target": str(pod / "root"),
            },
            "tmpfs": {"/run": "0755"},
            "binds": binds,
            "files": {"/etc/hosts": self.hosts(), "/etc/hostname": f"{container['name']}\n"},
        }

    def start(self, role: str) -> None:
        spec_file = self.work / role / "pod.json"
        spec_file.parent.mkdir(exist_ok=True)
        spec = self.spec(role)
        if self.cgroup:
            (self.cgroup / role).mkdir()
            spec["cgroup"] = str(self.cgroup / role)
        spec_file.write_text(json.dumps(spec))
        log = (self.work / role / "log").open("wb")
        launcher = subprocess.Popen(
            launch_command(spec_file),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(SRC)},
        )
        self.launchers.append(launcher)
        children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not self.pids.get(role):
            found = children.read_text().split() if children.exists() else []
            if found:
                self.pids[role] = int(found[0])
                self.pidfds.append(os.pidfd_open(self.pids[role]))
            time.sleep(0.01)
        if role not in self.pids:
            raise RuntimeError(f"{role} pod did not start: {self.log(role)}")

    def exited(self, role: str) -> bool:
        return self.launchers[list(self.pids).index(role)].poll() is not None

    def log(self, role: str, lines: int | None = 30) -> str:
        """The pod's log: its last `lines` lines, or all of it."""
        text = (self.work / role / "log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:] if lines else text)

    def run(
        self,
        role: str,
        argv: Sequence[str],
        user: tuple[str, int] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """`argv` in the pod (root, or `user`), with the Slurm clients' configuration."""
        command = list(argv)
        env = ["env", "-i", f"PATH={POD_PATH}", "SLURM_CONF=/etc/slurm/slurmctld/slurm.conf"]
        if user:
            name, uid = user
            env[1:1] = [f"--chdir=/home/{name}"]  # where a user's sbatch writes its output
            env += [f"HOME=/home/{name}", f"USER={name}", f"LOGNAME={name}"]
            command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--init-groups", *command]
        else:
            env.append("HOME=/root")
        enter = ["nsenter", "-t", str(self.pids[role]), "-m", "-u", "-i", "-p", "-C", "-r", "-w"]
        try:
            return subprocess.run(
                [*enter, "--", *env, *command],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as expired:
            out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else ""
            return subprocess.CompletedProcess(argv, 124, out, f"timed out after {timeout}s")

    def cgroups(self) -> str:
        """The pods' cgroup tree: each cgroup's processes and enabled controllers."""
        lines = []
        for folder in (
            sorted(p for p in self.cgroup.rglob("*") if p.is_dir()) if self.cgroup else []
        ):
            try:
                procs = " ".join((folder / "cgroup.procs").read_text().split())
                enabled = (folder / "cgroup.subtree_control").read_text().strip()
            except FileNotFoundError:  # a job's cgroup, removed meanwhile
                continue
            lines.append(f"{folder.relative_to(self.cgroup)}: procs [{procs}] +[{enabled}]")
        return "".join(f"{line}\n" for line in lines)

    def stop(self) -> None:
        """Kill each pod (its PID 1: every process of its PID namespace goes), then remove
        their cgroups."""
        for fd in self.pidfds:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        for launcher in self.launchers:
            launcher.wait()
        if self.cgroup and self.cgroup.exists():
            _remove_cgroup(self.cgroup)


def _remove_cgroup(path: Path) -> None:
    """Remove a cgroup tree bottom-up, once its processes are gone."""
    deadline = time.monotonic() + 10
    for folder in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        while folder.exists():
            try:
                folder.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    path.rmdir()


def wait_for(what: Callable[[], str | None], seconds: float = WAIT_SECONDS) -> str | None:
    """Poll `what` (which names what it saw, or None while not yet) until it answers."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (seen := what()) is not None:
            return seen
        time.sleep(0.2)
    return None


class Checks:
    def __init__(self, pods: Pods, machine: Machine) -> None:
        self.pods, self.machine = pods, machine
        self.results: list[Result] = []

    def say(self, name: str, outcome: str, detail: str) -> None:
        self.results.append(Result(name, outcome, detail))
        print(f"{outcome} {name}: {detail}", flush=True)

    def user(
        self, argv: Sequence[str], who: tuple[str, int] = USER, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return self.pods.run("controller", argv, user=who, timeout=timeout)

    def node_state(self) -> str:
        shown = self.pods.run("controller", ["scontrol", "show", "node", NODE, "-o"], timeout=10)
        found = re.search(r"\bState=(\S+)", shown.stdout)
        return found.group(1) if found else shown.stderr.strip()

    def job_state(self, job: str) -> str:
        shown = self.pods.run("controller", ["scontrol", "show", "job", job, "-o"], timeout=10)
        found = re.search(r"\bJobState=(\S+)", shown.stdout)
        return found.group(1) if found else shown.stderr.strip()

    def all(self) -> None:
        confined = self.pods.case != "none"
        no_cgroup = f"cgroup v2 is not this machine's hierarchy (kernel {self.machine.kernel})"
        self.pod_started()
        if not self.slurmd_registered():
            return
        self.job_as_user()
        if confined:
            self.memory_limit()
        else:
            self.say("memory limit (--mem)", "SKIP", no_cgroup)
        if self.machine.gpus:
            self.gpu_telemetry()
            self.nvlink_counters()
            self.active_checks()
        else:
            self.say("GPU series (slonk.metrics.gpus)", "SKIP", "no GPU here")
            self.say("NVLink counters (slonk.health.nvml)", "SKIP", "no GPU here")
            self.say("active checks' probe (slonk.health.cuda)", "SKIP", "no GPU here")
        if self.machine.gpus and confined:
            self.gpus()
        else:
            why = no_cgroup if self.machine.gpus else "no GPU here (nvidia-smi, NVML, /dev/nvidia0)"
            self.say("devices constrained", "SKIP", why)
            self.say("GPU job (--gres=gpu:1)", "SKIP", why)
        self.ssh_adopted(confined, no_cgroup)
        self.job_tmp()
        self.containers(confined)

    def pod_started(self) -> None:
        name = "worker pod's cgroup tree made usable (slonk.pod.cgroups)"
        if self.pods.case == "none":
            self.say(name, "SKIP", "confinement none (cgroup v1 here): nothing to prepare")
            return
        said = wait_for(
            lambda: next(
                (
                    line
                    for line in self.pods.log("worker", 200).splitlines()
                    if line.startswith("init:") or "ConfinementError" in line
                ),
                None,
            )
        )
        if said and said.startswith("init:"):
            self.say(name, "PASS", said.removeprefix("init: "))
        else:
            self.say(name, "FAIL", said or f"no word from init:\n{self.pods.log('worker')}")

    def slurmd_registered(self) -> bool:
        name = "slurmd starts and registers"
        state = wait_for(
            lambda: (
                "exited"
                if self.pods.exited("worker") or self.pods.exited("controller")
                else s
                if (s := self.node_state()).startswith("IDLE")
                else None
            )
        )
        if state == "exited":
            state = None
        if state:
            shown = self.pods.run("worker", ["grep", "-E", "^(Name|CapEff):", "/proc/1/status"])
            name_line, mask_line = ([*shown.stdout.splitlines(), "", ""])[:2]
            held = capability_names(int(mask_line.split()[-1], 16)) if mask_line else []
            print(f"worker pod's PID 1 ({name_line.split()[-1]}) holds: {' '.join(held)}")
            self.say(name, "PASS", f"{NODE} {state}")
            return True
        self.say(
            name,
            "FAIL",
            f"{NODE} {self.node_state()}\n--- worker pod:\n{self.pods.log('worker')}"
            f"\n--- controller pod:\n{self.pods.log('controller')}",
        )
        return False

    def job_as_user(self) -> None:
        name = "job runs as its user"
        done = self.user(["srun", "-t", "1", "sh", "-c", "id -un; cat /proc/self/cgroup"])
        lines = done.stdout.split()
        if done.returncode == 0 and lines and lines[0] == USER[0]:
            self.say(name, "PASS", f"srun id -un: {lines[0]}; cgroup {' '.join(lines[1:])}")
        else:
            self.say(
                name,
                "FAIL",
                f"exit {done.returncode}: {done.stdout}{done.stderr}"
                f"\n--- worker pod:\n{self.pods.log('worker')}",
            )

    def memory_limit(self) -> None:
        name = "memory limit (--mem) ends the job OUT_OF_MEMORY"
        hog = "python3 -c \"b = b'x' * (500 << 20); print('survived')\""
        done = self.user(
            [
                "sbatch",
                "--wait",
                "--parsable",
                "--mem=100M",
                "-t",
                "1",
                "-o",
                "/home/alice/oom.out",
                "--wrap",
                f"{JOB_MEMORY_MAX}; {hog}",
            ],
            timeout=120,
        )
        job = done.stdout.strip().split(";")[0]
        state = self.job_state(job) if job.isdigit() else done.stderr.strip()
        out = Path(self.pods.work / "home/alice/oom.out")
        said = " ".join(out.read_text().split()) if out.exists() else ""
        outcome = "PASS" if state == "OUT_OF_MEMORY" else "FAIL"
        self.say(name, outcome, f"job {job} {state}; memory.max and output: {said}")

    def active_checks(self) -> None:
        """The active checks' probe on the pod's GPUs, as the checks run it (the driver alone),
        judged with slonk's shipped thresholds: the figures are what thresholds come from."""
        for check, settings in ACTIVE_CHECKS.items():
            measure, unit = MEASURES[check]
            options = {**settings.options, "measure": measure, "unit": unit}
            argv = ["/opt/slonk/bin/python3", "-I", "-m", "slonk.health.cuda", measure]
            out = self.pods.run("worker", argv, timeout=120)
            said = " ".join((out.stdout + out.stderr).split())
            figures: list[active.Figure] = []
            try:
                figures = active.parse(out.stdout, unit)
                problems = active.judge(figures, options, unit) if figures else ["no figure"]
            except Exception as err:  # the probe's output is what is under test
                problems = [str(err)]
            ok = out.returncode == 0 and len(figures) == len(self.machine.gpus) and not problems
            self.say(
                f"active check {check} (slonk.health.cuda {measure})",
                "PASS" if ok else "FAIL",
                f"{said[:400]}{'; ' + '; '.join(problems) if problems else ''}",
            )

    def gpu_telemetry(self) -> None:
        """The exporter's nvidia-smi query, in the worker pod: every field a name this driver
        knows, and a row for each GPU."""
        query = f"--query-gpu={','.join(GPU_TELEMETRY)}"
        out = self.pods.run("worker", ["nvidia-smi", query, "--format=csv,noheader,nounits"])
        rows = [line for line in out.stdout.splitlines() if line.strip()]
        ok = out.returncode == 0 and len(rows) == len(self.machine.gpus)
        self.say(
            "GPU series (slonk.metrics.gpus)",
            "PASS" if ok else "FAIL",
            f"{len(rows)} rows: {rows[0] if rows else out.stderr.strip()}",
        )

    def nvlink_counters(self) -> None:
        """slonk's NVML reader in the worker pod, through the driver's library: a row for each
        GPU, the GPUs nvidia-smi shows at the same bus ids (so the structures' layout is the
        library's), and on a GPU with NVLink links a count of CRC errors, replays and
        recoveries (a Hopper's per link, summed; an earlier GPU's totals), not [N/A]."""
        fields = ",".join(nvml.FIELDS)
        reader = ["/opt/slonk/bin/python3", "-I", "-m", "slonk.health.nvml"]
        out = self.pods.run("worker", [*reader, f"--query-gpu={fields}", nvml.FORMAT])
        smi = self.pods.run("worker", ["nvidia-smi", "--query-gpu=index,pci.bus_id", nvml.FORMAT])
        rows = [dict(zip(nvml.FIELDS, (c.strip() for c in line.split(",")), strict=False))
                for line in out.stdout.splitlines()]  # fmt: skip
        shown = [[c.strip() for c in line.split(",")] for line in smi.stdout.splitlines()]
        counted = ("nvlink.errors.crc.total", "nvlink.errors.replay.total",
                   "nvlink.errors.recovery.total")  # fmt: skip
        uncounted = [
            row["index"]
            for row in rows
            if row.get("nvlink.links", "0") not in ("0", nvml.NOT_AVAILABLE)
            and not all(row.get(f, "").isdigit() for f in counted)
        ]
        ok = (
            out.returncode == 0
            and len(rows) == len(self.machine.gpus)
            and [[row.get("index"), row.get("pci.bus_id")] for row in rows] == shown
            and not uncounted
        )
        said = " | ".join(", ".join(row.values()) for row in rows) or out.stderr.strip()
        if uncounted:
            said = f"GPUs {','.join(uncounted)} have links but no count: {said}"
        self.say("NVLink counters (slonk.health.nvml)", "PASS" if ok else "FAIL", said[:600])

    def gpus(self) -> None:
        probe = "import os; os.close(os.open('/dev/nvidia0', os.O_RDWR)); print('opened')"
        without = self.user(["srun", "-t", "1", "python3", "-c", probe])
        said = [line for line in (without.stdout + without.stderr).splitlines() if line.strip()]
        errors = [line for line in said if "Error" in line or "opened" in line]
        refused = without.returncode != 0 and any("Operation not permitted" in e for e in errors)
        self.say(
            "devices constrained",
            "PASS" if refused else "FAIL",
            f"a job without --gres opening /dev/nvidia0: {(errors or said or [''])[-1]}",
        )
        script = (
            f'echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; python3 -c "{probe}"; nvidia-smi -L'
        )
        given = self.user(["srun", "-t", "1", "--gres=gpu:1", "sh", "-c", script], timeout=90)
        out = given.stdout
        ok = "CUDA_VISIBLE_DEVICES=0" in out and "opened" in out and "GPU 0:" in out
        self.say(
            "GPU job (--gres=gpu:1)",
            "PASS" if ok else "FAIL",
            " | ".join(line for line in (out + given.stderr).splitlines() if line.strip()),
        )

    def ssh_adopted(self, confined: bool, no_cgroup: str) -> None:
        home = f"/home/{USER[0]}/.ssh"
        self.user(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{home}/id_ed25519"])
        shutil.copy(
            self.pods.work / "home" / USER[0] / ".ssh/id_ed25519.pub",
            self.pods.work / "home" / USER[0] / ".ssh/authorized_keys",
        )
        os.chown(self.pods.work / "home" / USER[0] / ".ssh/authorized_keys", USER[1], USER[1])
        ssh = [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            NODE,
        ]
        since = len(self.pods.log("worker", None).splitlines())
        refused = self.user([*ssh, "true"])
        # PAM's line reaches the pod's log through its syslog reader, maybe after ssh exits.
        said = wait_for(
            lambda: next(
                (
                    line
                    for line in self.pods.log("worker", None).splitlines()[since:]
                    if "Access denied by pam_slurm_adopt" in line
                ),
                None,
            ),
            seconds=10,
        )
        self.say(
            "ssh without a job on the node is refused (pam_slurm_adopt)",
            "PASS" if refused.returncode != 0 and said else "FAIL",
            f"exit {refused.returncode}; {said or 'pam_slurm_adopt refused nothing'}",
        )
        submitted = self.user(["sbatch", "--parsable", "-t", "2", "--wrap", "sleep 120"])
        job = submitted.stdout.strip().split(";")[0]
        running = wait_for(lambda: "RUNNING" if self.job_state(job) == "RUNNING" else None)
        session = self.user([*ssh, "echo job=$SLURM_JOB_ID; cat /proc/self/cgroup"])
        out = session.stdout
        adopted = running and f"job={job}" in out
        sshd = "" if adopted else self.pods.run("worker", ["tail", "/run/sshd.log"]).stdout
        self.say(
            "ssh session adopted into the user's job",
            "PASS" if adopted else "FAIL",
            f"job {job} {self.job_state(job)}; session: {' '.join(out.split())} "
            f"{session.stderr.strip()[-300:]}{sshd}",
        )
        name = "ssh session in the job's cgroup"
        if confined:
            inside = f"job_{job}/step_extern" in out
            self.say(name, "PASS" if inside else "FAIL", " ".join(out.split()))
        else:
            self.say(name, "SKIP", no_cgroup)
        self.pods.run("controller", ["scancel", job], timeout=10)

    def job_tmp(self) -> None:
        name = "jobs do not share /tmp or /dev/shm"
        if not self.pods.jobs_in_namespaces():
            self.say(name, "SKIP", "the rendered slurm.conf gives jobs no /tmp of their own")
            return
        write = "echo secret > /tmp/left && echo secret > /dev/shm/left && echo wrote"
        left = self.user(["srun", "-t", "1", "sh", "-c", write])
        listed = self.user(
            ["srun", "-t", "1", "sh", "-c", "ls -A /tmp /dev/shm; echo listed"], who=OTHER
        )
        node = self.pods.run("worker", ["ls", "-A", "/tmp", "/dev/shm"], timeout=10)
        ran = "wrote" in left.stdout.split() and "listed" in listed.stdout.split()
        seen = [w for w, out in ((OTHER[0], listed), ("the node", node)) if "left" in out.stdout]
        self.say(
            name,
            "PASS" if ran and not seen else "FAIL",
            f"{USER[0]}'s job wrote /tmp/left and /dev/shm/left: {left.stdout.split()} "
            f"{left.stderr.strip()[-200:]}; {OTHER[0]}'s next job lists: "
            f"{listed.stdout.split()} {listed.stderr.strip()[-200:]}; seen by: "
            f"{', '.join(seen) or 'no one'}",
        )
        # Each job's namespace is kept by a bind mount the kernel refused for about half of
        # them in pods on Linux 6.18 (slonk.pod.mount_namespaces): every launch must succeed.
        launched = [self.user(["srun", "-t", "1", "true"]) for _ in range(JOBS_IN_A_ROW)]
        failed = [_errors(r.stderr)[-200:] for r in launched if r.returncode]
        self.say(
            f"{JOBS_IN_A_ROW} jobs in a row launch, each in its own namespace",
            "FAIL" if failed else "PASS",
            f"{len(failed)} failed" + (f", the first: {failed[0]}" if failed else ""),
        )

    def containers(self, confined: bool) -> None:
        """Apptainer in jobs, unprivileged (a user namespace) under the worker's securityContext:
        an image built in a job from a definition file runs as a sandbox directory, as a SIF
        where the pod has /dev/fuse, and a GPU job's container opens its GPU and sees it alone."""
        home = self.pods.work / "home" / USER[0]
        shutil.copy(APPTAINER_IMAGE, home / APPTAINER_IMAGE.name)
        built = self.user(
            ["srun", "-t", "5", "sh", APPTAINER_IMAGE.name, "containers"], timeout=300
        )
        said = " ".join((built.stdout + built.stderr).split())[-400:]
        self.say(
            "image built in a job from a definition file (apptainer build)",
            "PASS" if built.returncode == 0 else "FAIL",
            f"exit {built.returncode}{': ' + said if said else ''}",
        )
        if built.returncode:
            return
        for kind, image in (
            ("sandbox directory", "containers/image-dir"),
            ("SIF", "containers/image.sif"),
        ):
            name = f"container in a job (apptainer run, {kind})"
            if kind == "SIF" and not self.machine.fuse:
                self.say(name, "SKIP", f"no {FUSE} here (squashfuse mounts a SIF)")
                continue
            ran = self.user(["srun", "-t", "1", "apptainer", "--silent", "run", image])
            self.say(
                name,
                "PASS" if ran.stdout.strip() == BUILT else "FAIL",
                f"exit {ran.returncode}: {' '.join((ran.stdout + ran.stderr).split())[-300:]}",
            )
        name = "GPU job's container opens its GPU alone (apptainer exec --nv)"
        if not (self.machine.gpus and confined):
            self.say(name, "SKIP", "no GPU here" if confined else "no device cgroup here")
            return
        opens = (
            "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; exec 3</dev/nvidia0 && echo opened"
        )
        run = ["apptainer", "--silent", "exec", "--nv", "containers/image-dir", "sh", "-c", opens]
        given = self.user(["srun", "-t", "1", "--gres=gpu:1", *run])
        without = self.user(["srun", "-t", "1", *run])
        ok = (
            "CUDA_VISIBLE_DEVICES=0" in given.stdout
            and "opened" in given.stdout
            and "opened" not in without.stdout
        )
        self.say(
            name,
            "PASS" if ok else "FAIL",
            f"--gres=gpu:1: {' '.join((given.stdout + given.stderr).split())[-200:]}; "
            f"without: {' '.join((without.stdout + without.stderr).split())[-200:]}",
        )


def _errors(said: str) -> str:
    """What a client said went wrong (its error lines, else all it said), on one line."""
    lines = [line for line in said.splitlines() if "error" in line.lower()]
    return " / ".join(lines or said.splitlines())


def unpack(bundle: Path, work: Path) -> Path:
    if bundle.is_dir():
        return bundle
    target = work / "bundle"
    with tarfile.open(bundle) as archive:
        # Owners by number (the bundle's users are not this machine's); Python before 3.11.4
        # has no extraction filters, and trusts the archive as "fully_trusted" does.
        options = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
        archive.extractall(target, numeric_owner=True, **options)
    (top,) = target.iterdir()
    return top


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=HERE.parents[1] / "build" / "node")
    parser.add_argument("--logs", type=Path, help="copy the pods' logs here")
    parser.add_argument(
        "--privileged",
        action="store_true",
        help="run the worker privileged, not as the chart asks (to compare, when a check fails)",
    )
    parser.add_argument(
        "--unordered-namespaces",
        action="store_true",
        help="skip slonk.pod.mount_namespaces at the worker's start (to see what it fixes)",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("acceptance.py: needs root (namespaces, cgroups, mounts)", file=sys.stderr)
        return 1
    # A CI timeout's SIGTERM still stops the pods and removes what the test made.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    machine = Machine.read()
    case = machine.case()
    print(
        f"node: kernel {machine.kernel}, cgroup {'v2' if machine.cgroup2 else 'v1'}, "
        f"GPUs: {len(machine.gpus)} {machine.gpus[:1]}, case {case}",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="slonk-node-"))
    os.chmod(work, 0o755)
    pods, checks = None, None
    started = time.monotonic()
    try:
        bundle = unpack(args.bundle, work)
        own_network()
        pods = Pods(work, bundle, case, machine)
        if args.privileged:
            pods.specs["worker"]["privileged"] = True
        pods.order_namespaces = not args.unordered_namespaces
        pods.setup()
        asked = capabilities(pods.specs["worker"]) or CAPABILITIES
        missing = sorted(set(asked) - set(capability_names(status_mask("self", "CapBnd"))))
        print(
            f"worker container asks for: {' '.join(asked)}; this machine's bounding set "
            f"lacks {' '.join(missing) or 'none of them'}",
            flush=True,
        )
        pods.start("controller")
        pods.start("worker")
        checks = Checks(pods, machine)
        checks.all()
    finally:
        try:
            if pods and args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                for role in ("controller", "worker"):
                    if (work / role / "log").exists():
                        shutil.copy(work / role / "log", args.logs / f"{role}.log")
                (args.logs / "cgroups.txt").write_text(pods.cgroups())
        finally:
            if pods:
                pods.stop()
            shutil.rmtree(work, ignore_errors=True)
    results = checks.results if checks else []
    failed = [r for r in results if r.outcome == "FAIL"]
    print(
        f"node acceptance: {len(results) - len(failed)} of {len(results)} "
        f"passed or skipped, {len(failed)} failed, in {time.monotonic() - started:.0f} s"
    )
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
