"""Render slurm.conf, topology.conf, gres.conf, cgroup.conf, job_container.conf and
job_submit.lua from a cluster spec."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hostlist
import jinja2

from slonk.base.files import write_atomically
from slonk.base.paths import (
    CONFIG_FILES,
    HOOK_BIN,
    JOB_TMP_BASE,
    JWT_KEY,
    MAIL_PROGRAM,
    POWER_RESUME_PROGRAM,
    SLURMD_SPOOL,
    STATE_SAVE,
)
from slonk.config import active_checks
from slonk.config.placement import Placement
from slonk.config.spec import ClusterSpec, NodePool

EMPTY: Placement = {}
JOB_CONTAINER = "job_container/tmpfs"  # slurm.conf's JobContainerType, slonk's default

# Configless Slurm: slurmctld is the only reader of these files; every slurmd and client
# fetches what slurmctld runs, so a file slurmctld refused never reaches a node.
CONFIGLESS = "enable_configless"
# Power saving, for nodes lent to Kubernetes (slonk.slurm.power; measured on Slurm 24.11.5). Slurm
# powers nodes down only when slonk asks (`state=power_down`), never by itself: it turns power
# saving off altogether with SuspendTime=INFINITE ("attempt to do power work on node but
# PowerSave is disabled"), so SuspendTime is finite and every node is excluded from it
# (SuspendExcNodes, in render). A node is lent once its pod is gone: SuspendProgram has
# nothing to stop, and SuspendTimeout is only the window in which `lend` drains it again
# (Slurm clears a drain as it starts powering down). ResumeProgram records the nodes Slurm
# asks back for a job (capacity.returnOnDemand); if none registers within ResumeTimeout, the
# node goes DOWN and its job is requeued (a --no-requeue job fails): time enough for
# Kubernetes to schedule and start the pod. No rate limits: a pool is lent at once.
POWER_SAVE: dict[str, Any] = {
    "SuspendTime": 365 * 24 * 3600,
    "SuspendProgram": "/bin/true",
    "SuspendTimeout": 5,
    "SuspendRate": 0,
    "ResumeProgram": str(POWER_RESUME_PROGRAM),
    "ResumeTimeout": 1800,
    "ResumeRate": 0,
}
DEFAULT_MAX_JOB_COUNT = 10000
NO_MAIL = "/bin/true"  # MailProg without a relay


def max_job_count(spec: ClusterSpec) -> int:
    """The job table's size slurmctld runs with (slurmConf's MaxJobCount, else Slurm's)."""
    value = slurm_settings(spec).get("MaxJobCount", DEFAULT_MAX_JOB_COUNT)
    return int(value) if str(value).isdigit() else DEFAULT_MAX_JOB_COUNT


# Power-save passes every second (Slurm's default: 10 s): `lend` waits for one.
POWER_SAVE_INTERVAL = "power_save_interval=1"
# The REST API's tokens, beside munge (values restapi).
JWT_AUTH = "auth/jwt"

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("slonk.config", "templates"),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _merge(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, str]:
    """Defaults with overrides applied; an override of None drops the setting. Slurm reads
    keys in any case, so `selecttype` replaces the SelectType default, never adds a twin."""
    spelling = {key.lower(): key for key in defaults}
    merged = dict(defaults)
    for key, value in overrides.items():
        merged[spelling.get(key.lower(), key)] = value
    return {k: _conf_value(v) for k, v in merged.items() if v is not None}


def slurm_settings(spec: ClusterSpec) -> dict[str, str]:
    """slurm.conf's global settings: defaults for Slurm in pods, then the spec's overrides."""
    cgroup = spec.confinement == "cgroup"
    defaults: dict[str, Any] = {
        "SlurmUser": "slurm",
        "AuthType": "auth/munge",
        "SlurmctldPort": spec.slurmctld_port,
        "SlurmdPort": spec.slurmd_port,
        "StateSaveLocation": str(STATE_SAVE),
        "SlurmdSpoolDir": str(SLURMD_SPOOL),
        "SlurmctldPidFile": "/run/slurmctld.pid",
        "SlurmdPidFile": "/run/slurmd.pid",
        # slurmd and clients fetch the configuration slurmctld runs (kept whatever slurmConf says).
        "SlurmctldParameters": f"{CONFIGLESS},{POWER_SAVE_INTERVAL}",
        # Daemons run in the foreground under s6 and log to stderr: one line per event.
        "SlurmctldDebug": "info",
        "SlurmdDebug": "info",
        "ProctrackType": "proctrack/cgroup" if cgroup else "proctrack/linuxproc",
        "TaskPlugin": "task/cgroup,task/affinity" if cgroup else "task/none",
        "SelectType": "select/cons_tres",
        # Memory is scheduled: jobs that do not fit a pod's memory together never share it
        # (the pod would be OOM-killed). Jobs without --mem get their partition's DefMemPerCPU.
        "SelectTypeParameters": "CR_Core_Memory",
        "SchedulerParameters": "batch_sched_delay=0,sched_min_interval=0",
        # Slurm's own default, written out: with accounting each user may hold a share of it
        # (slonk.accounting.associations), so that no one fills the job table for everyone.
        "MaxJobCount": DEFAULT_MAX_JOB_COUNT,
        # A pod comes back with a new IP under the same name: Slurm 24.11 caches no addresses
        # (NoAddrCache is defunct), and a node that re-registers with a valid config returns.
        "ReturnToService": 2,
        # A pod sees the host's CPUs; the pool's declared size is what Slurm should use.
        "SlurmdParameters": "config_overrides",
        # Contain: every job gets an extern step on its nodes, which pam_slurm_adopt adopts
        # the job's user's ssh sessions into (workers.ssh).
        "PrologFlags": "Alloc,Contain",
        # Each job's own /tmp and /dev/shm (job_container.conf), gone when it ends: no job
        # sees another's files or fills the node's scratch for the next. It needs Contain,
        # and SYS_ADMIN in the worker (slurmstepd makes a mount namespace per job); in pods
        # on Linux 6.18 and on, also slonk.pod.mount_namespaces at the worker's start.
        "JobContainerType": JOB_CONTAINER,
        # Open MPI 5 in the images speaks PMIx: `srun ./mpi_program` needs no --mpi.
        "MpiDefault": "pmix",
        # sstat and sacct's usage fields: gathered from the job's cgroup, or from /proc.
        "JobAcctGatherType": "jobacct_gather/cgroup" if cgroup else "jobacct_gather/linux",
        "JobCompType": "jobcomp/none",
        # Users' own cron entries (`scrontab -e`), run as batch jobs: researchers' nightly
        # syncs and sweeps (Slurm's default is off).
        "ScronParameters": "enable",
    }
    if not cgroup:
        # No cgroup holds a job to its memory: the sampler kills a step that uses more.
        defaults["JobAcctGatherParams"] = "OverMemoryKill"
    defaults |= _priority_settings(spec)
    if spec.accounting:
        defaults |= _accounting_settings(spec)
    defaults |= POWER_SAVE
    if nodes := spec.node_names():
        defaults["SuspendExcNodes"] = _ranged(nodes)
    if spec.topology != "none":
        defaults["TopologyPlugin"] = f"topology/{spec.topology}"
    if any(p.gpus for p in spec.nodepools):
        defaults["GresTypes"] = "gpu"
    if spec.restapi:
        # Users' JSON Web Tokens (`scontrol token`), which the REST API passes on: slurmctld
        # verifies them with the key, as slurmdbd does (slonk.accounting.slurmdbd).
        lifespan = spec.restapi.max_token_lifespan_seconds
        defaults["AuthAltTypes"] = JWT_AUTH
        defaults["AuthAltParameters"] = f"jwt_key={JWT_KEY},max_token_lifespan={lifespan}"
    if spec.mail:
        defaults["MailProg"] = str(MAIL_PROGRAM)
        if spec.mail.domain:
            defaults["MailDomain"] = spec.mail.domain
    else:
        defaults["MailProg"] = NO_MAIL  # Slurm wants a MailProg that exists
    if spec.backup_controller:
        # How long the backup waits for an unanswering primary (Slurm's default, 120 s, is
        # two minutes in which no job is accepted).
        defaults["SlurmctldTimeout"] = spec.backup_controller.takeover_seconds
    if "prolog" in spec.job_phases:
        # Health checks and hooks from git around jobs (slonk.hooks.dispatch). A failing
        # prolog drains its node; the job is requeued to run elsewhere rather than held.
        defaults["SchedulerParameters"] += ",nohold_on_prolog_fail"
    for phase in spec.job_phases:
        key = "".join(part.capitalize() for part in phase.split("-"))
        defaults[key] = str(HOOK_BIN / phase)
    if spec.health:
        # slurmd also runs it once at start, before registering: a node that failed its boot
        # checks registers drained (slonk.health).
        defaults["HealthCheckProgram"] = str(HOOK_BIN / "health")
        defaults["HealthCheckInterval"] = spec.health.interval_seconds
        # CYCLE: a share of the nodes at a time through the interval (ten or more), not every
        # node at once, which starts a thousand health runs against one DNS, one /home, and
        # at 256 `slonk local` pods on two cores timed out dozens of healthy nodes' checks.
        defaults["HealthCheckNodeState"] = "ANY,CYCLE"
    if active_pools(spec):
        # Users' jobs preempt active checks by partition tier (the checks' partition is the
        # lowest): cancelled at once, no user ever waits on one (slonk.align.active).
        defaults["PreemptType"] = active_checks.PREEMPT_TYPE
        defaults["PreemptMode"] = "CANCEL"
    settings = _merge(defaults, spec.slurm_conf)
    named = {key.lower() for key in spec.slurm_conf}
    if settings.get("MailProg") == NO_MAIL and "jobsubmitplugins" not in named:
        # No relay and no mailer of the site's: job_submit.lua tells a user who asks for
        # mail that none will come, rather than dropping it without a word.
        settings["JobSubmitPlugins"] = "lua"
    # Whatever slurmConf sets (or drops), nodes must be able to fetch the configuration.
    options = [o for o in settings.get("SlurmctldParameters", "").split(",") if o]
    if CONFIGLESS not in options:
        settings["SlurmctldParameters"] = ",".join([*options, CONFIGLESS])
    return settings


def _priority_settings(spec: ClusterSpec) -> dict[str, Any]:
    """Fair share: priority/multifactor with the spec's weights (usage needs accounting)."""
    priority, weights = spec.priority, spec.priority.weights
    return {
        "PriorityType": "priority/multifactor",
        "PriorityWeightFairshare": weights.fairshare,
        "PriorityWeightAge": weights.age,
        "PriorityWeightJobSize": weights.job_size,
        "PriorityWeightPartition": weights.partition,
        "PriorityWeightQOS": weights.qos,
        "PriorityDecayHalfLife": priority.decay_half_life,
        "PriorityMaxAge": priority.max_age,
    }


def _accounting_settings(spec: ClusterSpec) -> dict[str, Any]:
    """slurmdbd keeps every job's record; slurmctld queues them while it is away."""
    assert spec.accounting is not None
    settings: dict[str, Any] = {
        "AccountingStorageType": "accounting_storage/slurmdbd",
        "AccountingStorageHost": spec.accounting.host,
        "AccountingStoragePort": spec.accounting.port,
        # Only users with an association run jobs: slonk gives one to every user it writes
        # (slonk.users.associations), so fair share covers everyone. `limits`: the QOS's
        # per-user limits hold, among them slonk's on submitted jobs.
        "AccountingStorageEnforce": "associations,limits",
    }
    if any(p.gpus for p in spec.nodepools):
        settings["AccountingStorageTRES"] = "gres/gpu"
    return settings


def conf_server(spec: ClusterSpec) -> str:
    """Where slurmd (`--conf-server`) and clients (SLURM_CONF_SERVER) fetch the configuration."""
    return ",".join(f"{address}:{spec.slurmctld_port}" for address in spec.controller_addresses)


def cgroup_settings(spec: ClusterSpec) -> dict[str, str]:
    if spec.confinement == "none":
        # Slurm 24.11's slurmd refuses to start without a cgroup filesystem unless told that
        # no cgroup plugin is used (measured), even with proctrack/linuxproc and task/none.
        defaults: dict[str, Any] = {"CgroupPlugin": "disabled"}
    else:
        defaults = {
            # Kubernetes nodes run cgroup v2; autodetect would guess from what a pod sees.
            "CgroupPlugin": "cgroup/v2",
            # A pod has no systemd to ask for a scope: slurmd manages its own subtree.
            "IgnoreSystemd": True,
            "ConstrainCores": True,
            "ConstrainRAMSpace": True,
            "ConstrainDevices": True,
        }
    return _merge(defaults, spec.cgroup_conf)


def _ranged(names: list[str]) -> str:
    return hostlist.collect_hostlist(names)


def _node_line(spec: ClusterSpec, pool: NodePool) -> str:
    parts = [
        f"NodeName={_ranged(pool.node_names(spec.release))}",
        f"CPUs={pool.cpus}",
        f"RealMemory={pool.memory_mib}",
    ]
    if pool.gpus:
        kind = f"gpu:{pool.gpus.type}" if pool.gpus.type else "gpu"
        parts.append(f"Gres={kind}:{pool.gpus.count}")
    if pool.features:
        parts.append(f"Features={','.join(pool.features)}")
    if pool.weight is not None:
        parts.append(f"Weight={pool.weight}")
    parts.append("State=UNKNOWN")
    return " ".join(parts)


# Partition options that set a job's memory when it asks none: any one replaces slonk's.
MEMORY_DEFAULTS = frozenset({"defmempercpu", "defmempernode", "defmempergpu"})


def _mem_per_cpu(spec: ClusterSpec, pools: list[str]) -> int:
    """A pool's memory over its CPUs, the smallest among the partition's pools: a job of
    all a node's CPUs without --mem fits every node of the partition."""
    return min(spec.pool(p).memory_mib // spec.pool(p).cpus for p in pools) or 1


def active_pools(spec: ClusterSpec) -> list[str]:
    """The pools with nodes whose nodes run active checks: the checks' partition's."""
    return [p.name for p in spec.nodepools if p.replicas and spec.active_checks(p)]


def _active_partition_line(spec: ClusterSpec, pools: list[str]) -> str:
    """The active checks' partition: hidden, root's alone, the lowest tier; its jobs are
    cancelled when a user's job needs their node. Its time limit bounds every check's job."""
    assert spec.health is not None and spec.health.active is not None
    minutes = active_checks.time_limit_minutes(spec.health.active.checks)
    return " ".join(
        [
            f"PartitionName={active_checks.PARTITION}",
            f"Nodes={','.join(pools)}",
            "Default=NO",
            f"MaxTime={minutes}",
            f"PriorityTier={active_checks.PRIORITY_TIER}",
            "PreemptMode=CANCEL",
            "Hidden=YES",
            "AllowGroups=root",
            "State=UP",
        ]
    )


def _partition_lines(spec: ClusterSpec) -> list[str]:
    lines = [_partition_line(spec, p) for p in spec.partitions]
    pools = active_pools(spec)
    if not pools:
        return lines
    if not any(key.lower() == "preempttype" for key in spec.slurm_conf):
        # Preemption is on for the checks' sake alone: users' partitions stay as they were,
        # never preempted, unless a partition says otherwise.
        lines = [
            line if p.preempt_mode else f"{line} PreemptMode=OFF"
            for line, p in zip(lines, spec.partitions, strict=True)
        ]
    return [*lines, _active_partition_line(spec, pools)]


def _partition_line(spec: ClusterSpec, partition: Any) -> str:
    populated = [p for p in partition.pools if spec.pool(p).replicas]
    parts = [f"PartitionName={partition.name}"]
    if populated:
        parts.append(f"Nodes={','.join(populated)}")
    parts.append(f"Default={'YES' if partition.default else 'NO'}")
    parts.append(f"MaxTime={partition.max_time}")
    if populated and not any(k.lower() in MEMORY_DEFAULTS for k in partition.options):
        parts.append(f"DefMemPerCPU={_mem_per_cpu(spec, populated)}")
    if partition.default_time is not None:
        parts.append(f"DefaultTime={partition.default_time}")
    if partition.priority_tier is not None:
        parts.append(f"PriorityTier={partition.priority_tier}")
    if partition.preempt_mode:
        parts.append(f"PreemptMode={partition.preempt_mode}")
    parts.append(f"State={partition.state}")
    parts.extend(f"{k}={_conf_value(v)}" for k, v in partition.options.items() if v is not None)
    return " ".join(parts)


def _groups(spec: ClusterSpec, attribute: str, placement: Placement) -> dict[str, list[str]]:
    """Node names by switch or block: where the syncer found them (placement), else their
    pool's (ClusterSpec.placement_groups)."""
    groups: dict[str, list[str]] = {}
    for name, pools in spec.placement_groups(attribute).items():
        for node in (n for pool in pools for n in pool.node_names(spec.release)):
            found = placement.get(node, {}).get(attribute)
            if found == _spine(spec):
                found = None  # a label may not name the tree's root: the pool's place holds
            groups.setdefault(found or name, []).append(node)
    return groups


def neighbours(spec: ClusterSpec, placement: Placement = EMPTY) -> dict[str, list[str]]:
    """The nodes that share a place in the topology Slurm runs: a leaf switch (tree), a block
    (block), else a pool. A check that spans a block runs over one such group."""
    if spec.topology in ("tree", "block"):
        return _groups(spec, "switch" if spec.topology == "tree" else "block", placement)
    return {p.name: p.node_names(spec.release) for p in spec.nodepools if p.replicas}


def _spine(spec: ClusterSpec) -> str:
    return f"{spec.release}-spine"


def topology_lines(spec: ClusterSpec, placement: Placement = EMPTY) -> list[str]:
    if spec.topology == "tree":
        leaves = dict(sorted(_groups(spec, "switch", placement).items()))
        lines = [f"SwitchName={name} Nodes={_ranged(nodes)}" for name, nodes in leaves.items()]
        if len(leaves) > 1:
            # Slurm needs one root above the leaves to place jobs across them.
            lines.append(f"SwitchName={_spine(spec)} Switches={','.join(leaves)}")
        return lines
    if spec.topology == "block":
        # slurmctld takes the first block's node count as the base block size (the largest
        # --segment) and refuses to start on a later, smaller block (block_record.c): the
        # smallest block comes first, so every block size is valid. No BlockSizes: the
        # default aggregates consecutive blocks in powers of two, in this order.
        blocks = sorted(_groups(spec, "block", placement).items(), key=lambda b: (len(b[1]), b[0]))
        return [f"BlockName={name} Nodes={_ranged(nodes)}" for name, nodes in blocks]
    return []


def gres_lines(spec: ClusterSpec) -> list[str]:
    lines = []
    for pool in spec.nodepools:
        if pool.gpus and pool.replicas:
            kind = f" Type={pool.gpus.type}" if pool.gpus.type else ""
            files = _ranged([f"/dev/nvidia{i}" for i in range(pool.gpus.count)])
            nodes = _ranged(pool.node_names(spec.release))
            lines.append(f"NodeName={nodes} Name=gpu{kind} File={files}")
    return lines


def render(spec: ClusterSpec, placement: Placement = EMPTY) -> dict[str, str]:
    """Every config file's text, by file name; `placement` is where the syncer found each
    node (slonk.config.placement)."""
    context = {
        "spec": spec,
        "controllers": list(zip(spec.controller_names, spec.controller_addresses, strict=True)),
        "settings": slurm_settings(spec),
        "nodesets": [
            (p.name, _ranged(p.node_names(spec.release))) for p in spec.nodepools if p.replicas
        ],
        "nodes": [_node_line(spec, p) for p in spec.nodepools if p.replicas],
        "partitions": _partition_lines(spec),
        "topology": topology_lines(spec, placement),
        "gres": gres_lines(spec),
        "cgroup": cgroup_settings(spec),
        "job_tmp_base": JOB_TMP_BASE,
    }
    return {name: _env.get_template(f"{name}.j2").render(context) for name in CONFIG_FILES}


def write_config(spec: ClusterSpec, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render(spec).items():
        write_atomically(out_dir / name, text)
        written.append(out_dir / name)
    return written
