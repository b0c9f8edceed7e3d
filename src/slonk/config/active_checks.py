"""Every active check slonk has, with its defaults: tests that make a node's GPUs work, run as
Slurm jobs on idle nodes (slonk.align.active) and, with the gate, by a new pod before its slurmd
starts. `health.active.checks.<name>` overrides them. No imports beyond the model: every pod
loads it with its spec.

Each check runs its `probe` command (the check's own argument appended) as root on the node:
one JSON object a GPU on stdout, `{"index", "name", "value", "unit"}` (slonk.health.cuda on a
real node; slonk.local.fake_gpu in local mode). A GPU fails below `minimum` for its model, or
below `spreadPercent` under the best GPU of its node: the second catches one slow GPU among
eight on a model no threshold names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from slonk.config import check_names, patterns
from slonk.config.model import ActiveCheckSettings, Rule

# The probe every GPU check runs: nothing but the driver (libcuda, which the NVIDIA container
# toolkit mounts into the pod), so it needs nothing added to the image.
DRIVER_PROBE = "/opt/slonk/bin/python3 -I -m slonk.health.cuda"

# Thresholds from one measurement on a healthy H100 80GB HBM3 (driver 580; issue 32):
# 3,025 GB/s device-to-device (read plus write) and 57.8 TFLOP/s of FP32 FMAs, each about 90%
# of what a healthy board gives; a board under these has lost a tenth of its speed. Other
# models are judged against their node's best GPU until a site names theirs.
H100 = "NVIDIA H100 80GB HBM3"

ACTIVE_CHECKS: Mapping[str, ActiveCheckSettings] = {
    "gpu-memory": ActiveCheckSettings(
        60,
        {"probe": DRIVER_PROBE, "minimum": {H100: 2700.0}, "spreadPercent": 15},
    ),
    "gpu-compute": ActiveCheckSettings(
        60,
        {"probe": DRIVER_PROBE, "minimum": {H100: 52.0}, "spreadPercent": 15},
    ),
}
# Their names in a node's plan, results, metrics and drain reasons (slonk.config.check_names).
NAMES = frozenset(f"{check_names.ACTIVE_PREFIX}{name}" for name in ACTIVE_CHECKS)
# What each check asks its probe to measure (its argument), and the unit it answers in.
MEASURES: Mapping[str, tuple[str, str]] = {
    "gpu-memory": ("memory", "GB/s"),
    "gpu-compute": ("compute", "TFLOP/s"),
}

# Their jobs' partition: hidden, root's alone, under every user partition's PriorityTier, and
# preempted (cancelled) by any job of a higher tier the moment it needs the node.
PARTITION = "slonk-active"
PRIORITY_TIER = 0
PREEMPT_TYPE = "preempt/partition_prio"

# A check may take minutes (DCGM's longer diagnostics do); it is a Slurm job's time limit.
ACTIVE_TIMEOUT = Rule("timeoutSeconds", int, minimum=5, maximum=3600)
MAX_MODELS = 32
MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9 ._()-]{0,95}$"
OPTION_SHAPES: Mapping[str, tuple[str, str]] = {
    "probe": (patterns.COMMAND_LINE, "a program and its options"),
}
SPREAD = Rule("spreadPercent", int, minimum=0, maximum=90)

# A site's own active checks (`health.active.commands.<name>`): a program run as root on the
# node beside slonk's, passing when it exits 0 (`dcgmi diag -r 2`, a burn-in, a fabric test of
# the site's). A node without the program does not run it: the check has no result there
# (slonk.health.active.run_command), so one catalogue serves pools of several kinds. Named as
# a Slurm reason word, never as a check slonk ships.
MAX_COMMANDS = 8
COMMAND_NAME = r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$"
# Where a site's check runs: on each node alone, or once over the idle nodes that share a
# place in the topology (a block, a leaf switch; else a pool), as one Slurm job whose program
# spans them itself (`srun`, `mpirun`: an NCCL all-reduce). A failing run is narrowed down to
# the node it needs by runs over fewer nodes (slonk.align.fabric).
NODE, BLOCK = check_names.NODE, check_names.BLOCK
SPAN = Rule(
    check_names.SPAN,
    str,
    choices=(NODE, BLOCK),
    doc="`node`: on each node alone. `block`: once over the idle nodes sharing a block or "
    "leaf switch (else a pool), as one job the program spans itself (srun, mpirun); a "
    "failure is narrowed down to its node by runs over fewer nodes.",
)


def spans_block(check: ActiveCheckSettings) -> bool:
    return check.options.get(SPAN.key) == BLOCK


def time_limit_minutes(checks: Mapping[str, ActiveCheckSettings]) -> int:
    """A node's check job's time limit, and the partition's: its checks run one after another,
    each within its timeout, and a minute more for the job's own start and end."""
    return math.ceil(sum(c.timeout_seconds for c in checks.values()) / 60) + 1
