"""Every health check slonk has, with its defaults: data the cluster spec reads
(`health.checks.<name>` overrides them) and the checks run. No imports beyond the model:
every pod loads it with its spec."""

from __future__ import annotations

from collections.abc import Mapping

from slonk.config import patterns
from slonk.config.model import CheckSettings, Rule

NVML_READER = "/opt/slonk/bin/python3 -I -m slonk.health.nvml"

# XIDs that mean the GPU or its memory needs attention (NVIDIA's XID catalogue): a node
# showing one is drained. Application faults (13, 31, 43, 45) are left to the job.
CRITICAL_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)

# A check that needs the controller or its peers runs only once the node is up (not at boot).
# What jobs need of the machine is watched by the pod's agent (the watch phase, every few
# seconds) rather than checked in a Prolog or Epilog: Slurm forking any program around every
# job costs more throughput than these checks are worth there (README, "What runs per job").
HEALTH_CHECKS: Mapping[str, CheckSettings] = {
    "gpu": CheckSettings(
        ("boot", "watch", "interval"),
        15,
        {
            "nvidiaSmi": "nvidia-smi",
            # What reads the counters nvidia-smi's queries lack (NVLink's errors), answering
            # as nvidia-smi does: slonk's reader of the driver's library (slonk.health.nvml).
            "nvml": NVML_READER,
            "dmesg": "dmesg --kernel",
            "xids": list(CRITICAL_XIDS),
            "maxUsedMemoryMiB": 1024,
            # GPUs every node must show; 0: the pool's GRES count (no GPUs: check skipped).
            "expectedCount": 0,
        },
    ),
    "interfaces": CheckSettings(("boot", "interval"), 5, {"names": ["eth0"], "rdmaDevices": []}),
    # In no phase unless a site gives it some: slurmctld slow to answer would drain every node
    # at once (and the recycle loop delete their pods), while a node that truly cannot reach
    # it could not deliver its drain either. slurmctld marks a node it cannot reach DOWN.
    "controller": CheckSettings((), 5),
    "dns": CheckSettings(("interval",), 5),
    "storage": CheckSettings(("boot", "watch", "interval"), 10, {"paths": ["/home"]}),
    "scratch": CheckSettings(
        ("boot", "watch", "interval"), 5, {"path": "/tmp", "minFreePercent": 5}
    ),
    "munge": CheckSettings(("interval",), 10),
}

# Checks a user or a shared service can fail, not the machine: what every node shares (a file
# system, cluster DNS, slurmctld), which a user can fill or an outage fail on every node at
# once, and scratch, which jobs write to (jobs share the node's /tmp). A new pod does not fix
# the first, and a machine quarantined for a user's files is a healthy one lost: their
# drains are never recycled or quarantined (slonk.align.recycle), only lifted once the
# check passes again.
SHARED_CHECKS = frozenset({"storage", "dns", "controller", "scratch"})

# The shape of each string option (or of each item of a list option): checks hand them to
# programs they run as root.
CHECK_OPTION_SHAPES: Mapping[str, tuple[str, str]] = {
    "nvidiaSmi": (patterns.COMMAND_LINE, "a program and its options"),
    "nvml": (patterns.COMMAND_LINE, "a program and its options"),
    "dmesg": (patterns.COMMAND_LINE, "a program and its options"),
    "names": (patterns.INTERFACE, "a network interface name"),
    "rdmaDevices": (patterns.RDMA_DEVICE, "an RDMA device name"),
    "paths": (patterns.ABSOLUTE_PATH, "an absolute path"),
    "path": (patterns.ABSOLUTE_PATH, "an absolute path"),
}

# Every check's timeoutSeconds. Slurm kills HealthCheckProgram at 60 s, before a drain for a
# hung check could be made; a round lasts up to twice its longest check's timeout and a second
# (slonk.health.runner gives a late check that is ready to run one more timeout), and the
# program's own start, a /proc scan per late check and its scontrol calls need the rest under
# load: at most 20 s.
CHECK_TIMEOUT = Rule(
    "timeoutSeconds",
    float,
    above=0,
    maximum=20,
    why="Slurm kills the health check program at 60 s",
)

# Integer options with an upper bound (a percentage); every integer option is >= 0.
CHECK_OPTION_MAXIMUM: Mapping[str, int] = {"minFreePercent": 100}


def option_rule(key: str, default: object) -> Rule:
    """The rule of a check's option: its default's type, and for an integer its bounds."""
    if isinstance(default, bool) or not isinstance(default, int):
        return Rule(key, type(default))
    return Rule(key, int, minimum=0, maximum=CHECK_OPTION_MAXIMUM.get(key))
