"""The cluster's state as metric families, from one `scontrol show node --json` and one
`squeue --json`: nodes by state and cause, CPUs, memory and GPUs per pool, jobs per partition,
and which running job holds which GPU.

Labels are bounded: a node's state from a fixed set, its cause from cause_label, its pool from
cluster.yaml, a partition only if cluster.yaml has it, a job state and a pending reason only
as Slurm's own words, a node only if cluster.yaml has it, a job by its number, a user by a
name of the shape slonk's users have. Nothing Slurm prints reaches a label value otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from slonk.config.accounts import NAME_PATTERN
from slonk.metrics.cause import NONE, cause_label
from slonk.metrics.family import GAUGE, Family, number
from slonk.slurm.slurm_state import (
    NodeState,
    SlurmError,
    job_nodes,
    job_records,
    job_state,
    node_records,
    node_state,
)

OTHER = "other"
NODE_STATES = (
    "idle", "mixed", "allocated", "draining", "drained", "down",
    "powered_down", "powering_up", "powering_down", "unknown",
)  # fmt: skip
# Slurm's base job states (JOB_STATE_BASE); flags (COMPLETING, REQUEUED, ...) are not states.
JOB_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
    "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
})  # fmt: skip
# A pending reason is one of Slurm's enum words (Priority, Resources, ReqNodeNotAvail, ...).
REASON_WORD = re.compile(r"[A-Za-z_]{1,64}")
MIB = 1024 * 1024
RESOURCE_STATES = ("allocated", "idle", "unavailable")
# The fields read of each record (slonk.slurm.slurm_state keeps only these as it parses).
NODE_FIELDS = (
    "state", "reason", "slurmd_start_time", "reason_set_by_user",
    "cpus", "alloc_cpus", "real_memory", "alloc_memory", "tres", "tres_used",
)  # fmt: skip
JOB_FIELDS = ("job_state", "partition", "state_reason", "user_name", "gres_detail", "job_resources")
# A job's GPUs on one node, as Slurm details its GRES there: `gpu:2(IDX:0-1)`, or typed,
# `gpu:h100:1(IDX:3)`, beside other GRES (`gpu:3(IDX:0-1,3),mps:0`). IDX counts the node's
# gres.conf files, which slonk writes as /dev/nvidia0, 1, ... in order (slonk.config.render).
GPU_DETAIL = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?:[0-9]+\(IDX:([0-9,-]{1,256})\)")
MAX_GPU_INDEX = 255


def node_label(node: NodeState) -> str:
    """One of NODE_STATES. Power saving's states first: such a node is off or on its way,
    whatever drain it carries (its cause says that)."""
    if node.powered_down:
        return "powered_down"
    if node.powering_up:
        return "powering_up"
    if node.powering_down:
        return "powering_down"
    if node.state == "down":
        return "down"
    if node.drained:
        busy = node.state in ("allocated", "mixed") or "COMPLETING" in node.flags
        return "draining" if busy else "drained"
    return node.state if node.state in ("idle", "mixed", "allocated") else "unknown"


def node_cause(node: NodeState, label: str) -> str:
    """The cause of a drained or down node; `none` for others, whose reason may be stale."""
    if node.drained or label == "down":
        return cause_label(node.reason)
    return NONE


def gpu_count(tres: object) -> float:
    """`gres/gpu=N` in a TRES string (`cpu=2,mem=1G,gres/gpu=8,gres/gpu:h100=8`); 0 if none."""
    if not isinstance(tres, str):
        return 0.0
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu" and value.isdigit() and len(value) < 10:
            return float(value)
    return 0.0


def node_families(text: str, pool_of: Callable[[str], str]) -> list[Family]:
    """slonk_nodes{pool,state,cause} and slonk_{cpus,memory_bytes,gpus}{pool,state}."""
    nodes = Family("slonk_nodes", GAUGE, "Slurm nodes by pool, state and drain cause.",
                   ("pool", "state", "cause"))  # fmt: skip
    cpus = Family("slonk_cpus", GAUGE, "CPUs by pool: allocated, idle on nodes that take "
                  "jobs, unavailable on the others.", ("pool", "state"))  # fmt: skip
    memory = Family("slonk_memory_bytes", GAUGE, "Memory by pool: allocated, idle on nodes "
                    "that take jobs, unavailable on the others.", ("pool", "state"))  # fmt: skip
    gpus = Family("slonk_gpus", GAUGE, "GPUs by pool: allocated, idle on nodes that take "
                  "jobs, unavailable on the others.", ("pool", "state"))  # fmt: skip
    for record in node_records(text, NODE_FIELDS):
        node = node_state(record)
        pool = pool_of(node.name)
        label = node_label(node)
        nodes.add(1, pool, label, node_cause(node, label))
        free = "idle" if node.schedulable else "unavailable"
        for family, total, used in (
            (cpus, number(record.get("cpus")), number(record.get("alloc_cpus"))),
            (memory, number(record.get("real_memory")) * MIB,
             number(record.get("alloc_memory")) * MIB),
            (gpus, gpu_count(record.get("tres")), gpu_count(record.get("tres_used"))),
        ):  # fmt: skip
            used = min(used, total)
            family.add(used, pool, "allocated")
            family.add(total - used, pool, free)
    for family in (cpus, memory, gpus):  # every pool seen shows all three states
        for pool in {labels[0] for labels in family.samples}:
            for state in RESOURCE_STATES:
                family.add(0, pool, state)
    return [nodes, cpus, memory, gpus]


def partitions_of(record: Mapping[str, Any], known: Collection[str]) -> list[str]:
    """The job's partitions that cluster.yaml has (a job pending in several lists them all,
    comma-separated, and counts in each, as `squeue --partition` shows it); `other` else."""
    value = record.get("partition")
    names = value.split(",") if isinstance(value, str) and len(value) < 4096 else []
    found = [name for name in names if name in known]
    return found or [OTHER]


def gpu_indices(detail: object) -> list[int]:
    """The GPU indices in one node's GRES detail (`0-1,3` in `gpu:3(IDX:0-1,3)`); none if it
    has none or is not of that shape."""
    found = GPU_DETAIL.search(detail) if isinstance(detail, str) else None
    indices: list[int] = []
    for part in found.group(1).split(",") if found else ():
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return []
        low, high = int(first), int(last if dash else first)
        if not low <= high <= MAX_GPU_INDEX:
            return []
        indices.extend(range(low, high + 1))
    return sorted(set(indices))


def job_gpus(
    record: Mapping[str, Any], job: str, pool_of: Callable[[str], str]
) -> list[tuple[str, str, str, str]]:
    """A running job's (job, user, node, GPU) for each GPU it holds on a node of a pool
    cluster.yaml has: `gres_detail` lists the job's nodes in its allocation's order."""
    user = record.get("user_name")
    if not isinstance(user, str) or not re.fullmatch(NAME_PATTERN, user):
        user = OTHER
    details = record.get("gres_detail")
    try:
        nodes = job_nodes(record, f"job {job}")
    except SlurmError:
        return []
    if not isinstance(details, list) or len(details) != len(nodes):
        return []
    return [
        (job, user, node, str(index))
        for node, detail in zip(nodes, details, strict=True)
        if pool_of(node)
        for index in gpu_indices(detail)
    ]


def job_families(
    text: str, partitions: Collection[str], pool_of: Callable[[str], str], per_job: bool = True
) -> list[Family]:
    """slonk_jobs{partition,state}, slonk_jobs_pending{partition,reason} and, unless
    `per_job` is off (slurm.conf's PrivateData hides jobs: the metrics port is no way around
    it), slonk_job_gpu_info{job_id,user,node,gpu}."""
    jobs = Family("slonk_jobs", GAUGE, "Jobs in Slurm's queue by partition and state.",
                  ("partition", "state"))  # fmt: skip
    pending = Family("slonk_jobs_pending", GAUGE, "Pending jobs by partition and Slurm's "
                     "reason.", ("partition", "reason"))  # fmt: skip
    # `job_id`, not `job`: Prometheus gives every series its scrape job's name as `job`.
    gpus = Family("slonk_job_gpu_info", GAUGE, "1 for each GPU a running job holds, by the "
                  "job's number and user, and the node and GPU index (its /dev/nvidiaN) the "
                  "GPU series carry: join them on (node, gpu) for a job's GPU figures.",
                  ("job_id", "user", "node", "gpu"))  # fmt: skip
    for partition in partitions:  # a partition with no job reads 0, not absent
        jobs.add(0, partition, "pending")
        jobs.add(0, partition, "running")
    for record in job_records(text, JOB_FIELDS):
        job, state = job_state(record)
        word = state.lower() if state in JOB_STATES else OTHER
        reason = record.get("state_reason")
        if not isinstance(reason, str) or not REASON_WORD.fullmatch(reason):
            reason = OTHER
        for partition in partitions_of(record, partitions):
            jobs.add(1, partition, word)
            if state == "PENDING":
                pending.add(1, partition, reason)
        if per_job and state == "RUNNING":
            for labels in job_gpus(record, job, pool_of):
                gpus.set(1, *labels)
    return [jobs, pending, gpus]
