"""The cluster spec's model: what `cluster.yaml` holds, as frozen dataclasses.

Each field's default is the one default of its key: `slonk.config.spec` reads a missing key
as the field's default (`default_of`), and a chart test holds values.yaml's defaults equal to
these. Every pod imports this module: it stays light (no YAML, no parser).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from slonk.config import accounts
from slonk.config.accounts import AccountRules

CONFINEMENTS = ("cgroup", "none")
TOPOLOGY_PLUGINS = ("tree", "block", "none")
PARTITION_STATES = ("UP", "DOWN", "DRAIN", "INACTIVE")
LDAP_TLS = ("none", "ldaps", "starttls")
HOOK_PHASES = ("prolog", "epilog", "task-prolog", "task-epilog")
HEALTH_PHASES = ("boot", "prolog", "epilog", "watch", "interval")
# RFC 2307 attribute names, overridable per directory.
LDAP_ATTRIBUTES = {
    "uid": "uid",
    "uidNumber": "uidNumber",
    "gidNumber": "gidNumber",
    "homeDirectory": "homeDirectory",
    "loginShell": "loginShell",
    "sshPublicKey": "sshPublicKey",
    "groupName": "cn",
    "groupMember": "memberUid",
}


def default_of(cls: type, name: str) -> Any:
    """The default of a model field: the parser's default for its key."""
    for f in fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
            raise LookupError(f"{cls.__name__}.{name} has no default")
    raise LookupError(f"{cls.__name__} has no field {name}")


@dataclass(frozen=True)
class Gpus:
    count: int
    type: str | None = None


@dataclass(frozen=True)
class Placement:
    """Where a pool's nodes sit in the network: a leaf switch (tree) and a block."""

    switch: str | None = None
    block: str | None = None


@dataclass(frozen=True)
class NodePool:
    name: str
    replicas: int
    cpus: int
    memory_mib: int
    gpus: Gpus | None = None
    features: tuple[str, ...] = ()
    weight: int | None = None
    placement: Placement = Placement()

    def node_names(self, release: str) -> list[str]:
        return [f"{release}-{self.name}-{i}" for i in range(self.replicas)]


@dataclass(frozen=True)
class Partition:
    name: str
    pools: tuple[str, ...]
    default: bool = False
    max_time: str = "INFINITE"
    default_time: str | None = None
    priority_tier: int | None = None
    preempt_mode: str | None = None
    state: str = "UP"
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Group:
    name: str
    gid: int


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    groups: tuple[str, ...] = ()
    ssh_keys: tuple[str, ...] = ()
    shell: str = accounts.DEFAULT_SHELL
    home: str = ""

    @property
    def home_dir(self) -> str:
        return self.home or f"{accounts.HOME}/{self.name}"


@dataclass(frozen=True)
class LdapSettings:
    uris: tuple[str, ...]
    user_base: str
    group_base: str
    user_filter: str = "(objectClass=posixAccount)"
    group_filter: str = "(objectClass=posixGroup)"
    attributes: Mapping[str, str] = field(default_factory=lambda: dict(LDAP_ATTRIBUTES))
    bind_dn: str | None = None
    bind_password_file: str | None = None
    tls: str = "none"
    ca_file: str | None = None
    timeout_seconds: float = 5.0
    sync_interval_seconds: int = 60
    max_removal_percent: int = 10


@dataclass(frozen=True)
class HookSettings:
    """Job hooks from git: where git-sync publishes, and which repo directory each phase runs."""

    link: str = "hooks"
    phases: Mapping[str, str] = field(default_factory=dict)  # phase -> directory in the repo
    timeout_seconds: int = 30  # each script
    # The whole phase, all its scripts together: a job waits at most this for its prolog.
    phase_timeout_seconds: int = 30
    max_file_bytes: int = 1024 * 1024


@dataclass(frozen=True)
class CheckSettings:
    """One health check: when it runs, how long it may take, and its own options. The
    checks and their defaults: slonk.config.health_checks."""

    phases: tuple[str, ...]
    timeout_seconds: float
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RecycleSettings:
    """Restart the pods of nodes slonk drained, once idle; quarantine repeat offenders."""

    idle_seconds: int = 300
    period_seconds: int = 30
    max_recycles: int = 3
    window_seconds: int = 3600
    taint_nodes: bool = True


@dataclass(frozen=True)
class HealthSettings:
    checks: Mapping[str, CheckSettings]  # the enabled ones
    interval_seconds: int = 300
    watch_seconds: int = 10  # the agent's watch phase (slonk.health.watch)
    undrain: bool = True
    recycle: RecycleSettings | None = RecycleSettings()
    # One check holds at most this share of the nodes drained (slonk.health.blast).
    max_drained_percent: int = 10


@dataclass(frozen=True)
class SyncerSettings:
    """Slurm and Kubernetes kept in agreement about every node (slonk.align)."""

    resync_seconds: int = 300
    slurm_poll_seconds: int = 5
    node_conditions: tuple[str, ...] = ()
    topology_labels: Mapping[str, str] = field(default_factory=dict)  # switch|block -> label
    # The pace of topology changes (slonk.align.topology.Gate, where the defaults are argued).
    topology_window_seconds: int = 10
    topology_min_interval_seconds: int = 30


@dataclass(frozen=True)
class MetricsSettings:
    """The `metrics` service (slonk.metrics) on the controller and every worker: Prometheus
    scrapes /metrics on this port."""

    port: int = 9341


@dataclass(frozen=True)
class CapacitySettings:
    """Nodes lent to Kubernetes (slonk.slurm.power): may Slurm ask them back for pending jobs?"""

    return_on_demand: bool = False


@dataclass(frozen=True)
class PriorityWeights:
    """priority/multifactor's weights: fair share dominates, age keeps old jobs moving, job
    size keeps wide jobs from starving behind narrow ones. Partition (of each partition's
    PriorityJobFactor) and QOS are the site's to weigh."""

    fairshare: int = 10000
    age: int = 1000
    job_size: int = 1000
    partition: int = 0
    qos: int = 0


@dataclass(frozen=True)
class Priority:
    weights: PriorityWeights = PriorityWeights()
    decay_half_life: str = "7-0"  # past usage counts half after this long
    max_age: str = "7-0"  # a job's age factor is full after this long


@dataclass(frozen=True)
class SshSettings:
    """sshd beyond the login pods: on every worker with pam_slurm_adopt (a user reaches the
    node of their job, inside the job), and the site's SSH certificate authorities
    (paths.SSH_USER_CA, mounted from ssh.trustedUserCAKeys) trusted for users' logins."""

    workers: bool = True
    trusted_user_ca_keys: bool = False


@dataclass(frozen=True)
class GroupAccount:
    """Users in `group` (static or LDAP) get an association in Slurm account `account`."""

    group: str
    account: str


@dataclass(frozen=True)
class Database:
    """slurmdbd's MariaDB: the chart's own (host <release>-mariadb) or a site's. The
    password is in a file (paths.ACCOUNTING_PASSWORD), never in cluster.yaml."""

    host: str
    port: int = 3306
    name: str = "slurm_acct_db"
    user: str = "slurm"
    tls: bool = False  # verify against paths.ACCOUNTING_CA


@dataclass(frozen=True)
class AccountingSettings:
    """Slurm accounting through slurmdbd (its own pod, Service `host`)."""

    host: str
    database: Database
    port: int = 6819
    default_account: str = "research"
    group_accounts: tuple[GroupAccount, ...] = ()


@dataclass(frozen=True)
class LdapServer:
    """The development directory's contents (its own pod; see slonk.pod.ldapdev)."""

    suffix: str
    users: tuple[User, ...] = ()
    groups: tuple[Group, ...] = ()


@dataclass(frozen=True)
class ClusterSpec:
    cluster_name: str
    release: str
    namespace: str = "default"
    cluster_domain: str = "cluster.local"
    slurmctld_port: int = 6817
    slurmd_port: int = 6818
    # In name order (as Helm ranges over the values' maps).
    nodepools: tuple[NodePool, ...] = ()
    partitions: tuple[Partition, ...] = ()
    # How long a stopping worker pod waits for its node's jobs before requeueing them
    # (workers.drainTimeoutSeconds; slonk.pod.worker_stop).
    drain_timeout_seconds: int = 300
    confinement: str = "cgroup"
    topology: str = "tree"
    slurm_conf: Mapping[str, Any] = field(default_factory=dict)
    cgroup_conf: Mapping[str, Any] = field(default_factory=dict)
    extra_lines: tuple[str, ...] = ()
    users: tuple[User, ...] = ()
    groups: tuple[Group, ...] = ()
    accounts: AccountRules = field(default_factory=AccountRules)
    ldap: LdapSettings | None = None
    ldap_server: LdapServer | None = None
    hooks: HookSettings | None = None
    health: HealthSettings | None = None
    syncer: SyncerSettings | None = SyncerSettings()
    capacity: CapacitySettings = CapacitySettings()
    priority: Priority = Priority()
    ssh: SshSettings = SshSettings()
    accounting: AccountingSettings | None = None
    metrics: MetricsSettings | None = None

    @property
    def controller_name(self) -> str:
        return f"{self.release}-controller-0"

    @property
    def controller_address(self) -> str:
        """The controller's Service, fully qualified: reachable from any namespace."""
        return f"{self.release}-controller.{self.namespace}.svc.{self.cluster_domain}"

    @property
    def srun_ports(self) -> tuple[int, int] | None:
        """slurm.conf's SrunPortRange as (first, last), which slonk.pod.srun_ports keeps each user
        to a share of; None: srun listens on ephemeral ports (or the range is not one, which
        the chart refuses)."""
        first, dash, last = str(self.slurm_conf.get("SrunPortRange", "")).partition("-")
        if dash and first.isdigit() and last.isdigit() and 0 < int(first) <= int(last) <= 65535:
            return int(first), int(last)
        return None

    @property
    def job_phases(self) -> tuple[str, ...]:
        """The Prolog/Epilog (and task) programs Slurm runs: for hooks from git, and for
        health checks around jobs. The Epilog always: it clears what the job's user left on
        the node, processes and scratch (slonk.health.leftovers)."""
        phases = {"epilog"} | (set(self.hooks.phases) if self.hooks else set())
        for pool in self.nodepools:
            phases |= {p for c in self.health_checks(pool).values() for p in c.phases}
        return tuple(p for p in HOOK_PHASES if p in phases)

    def placement_groups(self, attribute: str) -> dict[str, list[NodePool]]:
        """Pools with nodes, by their `switch` or `block` in the order they first appear;
        an unplaced pool forms its own group, named after it."""
        groups: dict[str, list[NodePool]] = {}
        for pool in self.nodepools:
            if pool.replicas:
                key = getattr(pool.placement, attribute) or pool.name
                groups.setdefault(key, []).append(pool)
        return groups

    def health_checks(self, pool: NodePool) -> dict[str, CheckSettings]:
        """The checks a pool's nodes run: the GPU check only where there are GPUs to count."""
        if self.health is None:
            return {}
        return {
            name: check
            for name, check in self.health.checks.items()
            if name != "gpu" or check.options["expectedCount"] or pool.gpus
        }

    def pool(self, name: str) -> NodePool:
        return next(p for p in self.nodepools if p.name == name)

    def node_names(self) -> list[str]:
        return [n for p in self.nodepools for n in p.node_names(self.release)]

    def pool_of(self, node_name: str) -> NodePool | None:
        """The pool a node (pod) name belongs to, or None."""
        for pool in self.nodepools:
            prefix = f"{self.release}-{pool.name}-"
            index = node_name.removeprefix(prefix)
            if index != node_name and index.isdigit() and int(index) < pool.replicas:
                return pool
        return None
