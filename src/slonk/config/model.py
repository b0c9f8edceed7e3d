"""The cluster spec's model: what `cluster.yaml` holds, as frozen dataclasses.

A field made with `setting` is the one home of its key's contract: its default, its type (the
default's), its bounds and what a refusal adds. `slonk.config.spec` reads a missing key as the
field's default and refuses what its `Rule` refuses; `slonk.config.contract` writes the same
into the chart's values.schema.json and values.yaml (a CI check keeps them current). Every pod
imports this module: it stays light (no YAML, no parser).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, TypeVar

from slonk.config import accounts, check_names, patterns
from slonk.config.accounts import AccountRules

CONFINEMENTS = ("cgroup", "none")
TOPOLOGY_PLUGINS = ("tree", "block", "none")
PARTITION_STATES = ("UP", "DOWN", "DRAIN", "INACTIVE")
LDAP_TLS = ("none", "ldaps", "starttls")
HOOK_PHASES = ("prolog", "epilog", "task-prolog", "task-epilog")
HEALTH_PHASES = ("boot", "prolog", "epilog", "watch", "interval")
# Every phase checks run in: the active checks' own besides (slonk.config.active_checks).
CHECK_PHASES = (*HEALTH_PHASES, check_names.ACTIVE)
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


MAX_PORT = 65535
PORT = {"minimum": 1, "maximum": MAX_PORT}
# Slurm's 16-bit counts: CPUs= and PriorityTier=.
MAX_UINT16 = 65535


@dataclass(frozen=True)
class Rule:
    """What one key of cluster.yaml may hold. Numbers: `minimum`, `maximum` (inclusive),
    `above` (exclusive); strings: one of `choices`, or text whole-matching `pattern`
    (slonk.config.patterns), refused as not `what`; empty or null is the default, and with
    `numbers` an integer is read as its text too (Slurm's minutes). `why` ends a refusal of a
    bound. `values` is the key's path in values.yaml where it is not its section's path and
    `key`. `doc`, where given, is what values.yaml and the schema say of the key (otherwise
    values.yaml's own)."""

    key: str
    kind: type
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    choices: tuple[str, ...] = ()
    why: str = ""
    values: str | None = None
    nullable: bool = False
    doc: str = ""
    pattern: str | None = None
    what: str = ""
    numbers: bool = False

    def refusal(self, value: Any) -> str | None:
        """Why `value` (of the right type) breaks a bound; None when it keeps them."""
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}"
        if self.above is not None and self.maximum is not None:
            if not self.above < value <= self.maximum:
                return f"must be > {_number(self.above)} and at most {_number(self.maximum)}"
        elif self.above is not None and not value > self.above:
            return f"must be > {_number(self.above)}"
        if self.minimum is not None and value < self.minimum:
            return f"must be >= {_number(self.minimum)}, got {value}"
        if self.maximum is not None and self.above is None and value > self.maximum:
            return f"must be <= {_number(self.maximum)}, got {value}"
        return None

    def refuse(self, value: Any) -> str | None:
        """`refusal` with the rule's reason."""
        found = self.refusal(value)
        return f"{found} ({self.why})" if found and self.why else found


def _number(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else str(bound)


# Rules shared by several keys. A switch, block or GRES type is written as it is or not at all.
SLURM_NAME = {"kind": str, "pattern": patterns.SLURM_NAME, "nullable": False}
SLURM_TIME = {
    "pattern": patterns.SLURM_TIME,
    "what": "a Slurm time (minutes, [days-]hours:minutes:seconds or INFINITE)",
    "numbers": True,
    "minimum": 0,
}
LDAP_FILTER = {"pattern": patterns.LDAP_FILTER, "what": "an LDAP filter in parentheses"}
PERIOD = {
    "pattern": patterns.PRIORITY_PERIOD,
    "what": "days-hours from 0-1 to 9999-23 (e.g. 7-0)",
}

T = TypeVar("T")


def setting(default: T, key: str, **rule: Any) -> T:
    """A field with a default whose key follows `rule` (Rule's fields but `key` and `kind`:
    the default's type)."""
    kind = rule.pop("kind", type(default))
    nullable = rule.pop("nullable", default is None)
    made: T = field(default=default, metadata={"rule": Rule(key, kind, nullable=nullable, **rule)})
    return made


def required(key: str, kind: type, **rule: Any) -> Any:
    """A field without a default (the key must be given) whose key follows `rule`."""
    return field(metadata={"rule": Rule(key, kind, **rule)})


def rule_of(cls: type, name: str) -> Rule:
    """The rule of a field made with `setting` or `required`."""
    rule: Rule = _field(cls, name).metadata["rule"]
    return rule


def rules(cls: type) -> dict[str, Rule]:
    """Every ruled field of a model class, by field name, in order."""
    return {f.name: f.metadata["rule"] for f in fields(cls) if "rule" in f.metadata}


def _field(cls: type, name: str) -> Field[Any]:
    for f in fields(cls):
        if f.name == name:
            return f
    raise LookupError(f"{cls.__name__} has no field {name}")


def default_of(cls: type, name: str) -> Any:
    """The default of a model field: the parser's default for its key."""
    f = _field(cls, name)
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise LookupError(f"{cls.__name__}.{name} has no default")


@dataclass(frozen=True)
class Gpus:
    count: int = required("count", int, minimum=1)
    type: str | None = setting(None, "type", **SLURM_NAME, what="a valid GRES type")


@dataclass(frozen=True)
class Placement:
    """Where a pool's nodes sit in the network: a leaf switch (tree) and a block."""

    switch: str | None = setting(None, "switch", **SLURM_NAME, what="a valid switch name")
    block: str | None = setting(None, "block", **SLURM_NAME, what="a valid block name")


@dataclass(frozen=True)
class NodePool:
    name: str
    # Every replica is a pod, a Service and a Slurm node: the bound keeps a typo from asking
    # the chart for a hundred million Services.
    replicas: int = required("replicas", int, minimum=0, maximum=10000)
    cpus: int = required("cpus", int, minimum=1, maximum=MAX_UINT16)
    memory_mib: int = required("memoryMiB", int, minimum=1)
    gpus: Gpus | None = None
    features: tuple[str, ...] = ()
    weight: int | None = setting(None, "weight", kind=int, minimum=0)
    placement: Placement = Placement()

    def node_names(self, release: str) -> list[str]:
        return [f"{release}-{self.name}-{i}" for i in range(self.replicas)]


@dataclass(frozen=True)
class Partition:
    name: str
    pools: tuple[str, ...]
    default: bool = False
    max_time: str = setting("INFINITE", "maxTime", **SLURM_TIME)
    default_time: str | None = setting(None, "defaultTime", kind=str, **SLURM_TIME)
    priority_tier: int | None = setting(
        None, "priorityTier", kind=int, minimum=0, maximum=MAX_UINT16
    )
    preempt_mode: str | None = setting(
        None, "preemptMode", kind=str, pattern=patterns.PREEMPT_MODE, what="a Slurm PreemptMode"
    )
    state: str = setting("UP", "state", choices=PARTITION_STATES)
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
    user_filter: str = setting("(objectClass=posixAccount)", "userFilter", **LDAP_FILTER)
    group_filter: str = setting("(objectClass=posixGroup)", "groupFilter", **LDAP_FILTER)
    attributes: Mapping[str, str] = field(default_factory=lambda: dict(LDAP_ATTRIBUTES))
    bind_dn: str | None = None
    bind_password_file: str | None = None
    tls: str = setting("none", "tls", choices=LDAP_TLS)
    ca_file: str | None = None
    timeout_seconds: float = setting(5.0, "timeoutSeconds", above=0)
    sync_interval_seconds: int = setting(60, "syncIntervalSeconds", minimum=1)
    max_removal_percent: int = setting(10, "maxRemovalPercent", minimum=0, maximum=100)
    page_size: int = setting(
        500,
        "pageSize",
        minimum=1,
        maximum=10000,
        doc="Entries per page of each search (paged results, RFC 2696). A directory that caps "
        "pages below this refuses every search and nothing is synced: set it to that cap "
        "(slapd's `limits ... size.pr`, Active Directory's MaxPageSize). At most 10,000: a "
        "larger page holds most of a directory in one answer, which paging exists to avoid.",
    )


@dataclass(frozen=True)
class HookSettings:
    """Job hooks from git: where git-sync publishes, and which repo directory each phase runs."""

    link: str = "hooks"
    phases: Mapping[str, str] = field(default_factory=dict)  # phase -> directory in the repo
    timeout_seconds: int = setting(30, "timeoutSeconds", minimum=1)  # each script
    # The whole phase, all its scripts together: a job waits at most this for its prolog.
    phase_timeout_seconds: int = setting(30, "phaseTimeoutSeconds", minimum=1)
    max_file_bytes: int = setting(1024 * 1024, "maxFileBytes", minimum=1)


@dataclass(frozen=True)
class CheckSettings:
    """One health check: when it runs, how long it may take, and its own options. The
    checks and their defaults: slonk.config.health_checks."""

    phases: tuple[str, ...]
    timeout_seconds: float
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ActiveCheckSettings:
    """One active check: how long its job may run, and its own options. The checks and their
    defaults: slonk.config.active_checks."""

    timeout_seconds: int
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ActiveSettings:
    """Active checks: tests run as Slurm jobs on idle nodes, preempted by any user's job
    (slonk.align.active), and before a new pod's node enters service (`gate`)."""

    # The enabled ones: slonk's (slonk.config.active_checks) and the site's own `commands`
    # (their options a `command`, no probe).
    checks: Mapping[str, ActiveCheckSettings]
    # Each node runs its checks at most this often (twice a day, as Soperator's do).
    interval_seconds: int = setting(43200, "intervalSeconds", minimum=10)
    # Check jobs submitted per minute, cluster-wide: a round over thousands of nodes is spread
    # out, never a herd of RPCs at slurmctld.
    starts_per_minute: int = setting(30, "startsPerMinute", minimum=1, maximum=600)
    gate: bool = setting(True, "gate")


@dataclass(frozen=True)
class TrendRule:
    """One GPU counter's rule: more than `max_increase` within `window_seconds` drains. The
    rules and their defaults: slonk.config.trends."""

    field: str  # nvidia-smi --query-gpu's name of the counter (or slonk.health.nvml's)
    max_increase: int
    window_seconds: int


@dataclass(frozen=True)
class TrendSettings:
    """Drains on GPU counters that rise too fast (slonk.health.trend), with a blast-radius
    limit of their own: a driver roll-out that makes every board count errors is no
    machine's fault."""

    rules: Mapping[str, TrendRule]  # the enabled ones
    max_drained_percent: int = setting(5, "maxDrainedPercent", minimum=1, maximum=100)


@dataclass(frozen=True)
class RecycleSettings:
    """Restart the pods of nodes slonk drained, once idle; quarantine repeat offenders."""

    # At least 1: Slurm gives slurmd's start time in whole seconds, and the loop knows a
    # recycled node's new slurmd by it. Idle a second or more, a drained node's slurmd and the
    # one that replaces it never start in the same second.
    idle_seconds: int = setting(300, "idleSeconds", minimum=1)
    period_seconds: int = setting(30, "periodSeconds", minimum=1)
    max_recycles: int = setting(3, "maxRecycles", minimum=1)
    window_seconds: int = setting(3600, "windowSeconds", minimum=1)
    taint_nodes: bool = setting(True, "taintNodes")


@dataclass(frozen=True)
class HealthSettings:
    checks: Mapping[str, CheckSettings]  # the enabled ones
    interval_seconds: int = setting(300, "intervalSeconds", minimum=1)
    # The agent's watch phase (slonk.health.watch).
    watch_seconds: int = setting(10, "watchSeconds", minimum=1)
    undrain: bool = setting(True, "undrain")
    recycle: RecycleSettings | None = RecycleSettings()
    # One check holds at most this share of the nodes drained (slonk.health.blast).
    max_drained_percent: int = setting(10, "maxDrainedPercent", minimum=1, maximum=100)
    active: ActiveSettings | None = None
    trends: TrendSettings | None = None


@dataclass(frozen=True)
class SyncerSettings:
    """Slurm and Kubernetes kept in agreement about every node (slonk.align)."""

    resync_seconds: int = setting(300, "resyncSeconds", minimum=10)
    slurm_poll_seconds: int = setting(5, "slurmPollSeconds", minimum=1)
    node_conditions: tuple[str, ...] = ()
    topology_labels: Mapping[str, str] = field(default_factory=dict)  # switch|block -> label
    # The pace of topology changes (slonk.align.topology.Gate, where the defaults are argued),
    # at most an hour: labels steer new jobs, and an hour-old topology is as stale as anyone
    # should choose.
    topology_window_seconds: int = setting(10, "topologyWindowSeconds", minimum=1, maximum=3600)
    topology_min_interval_seconds: int = setting(
        30, "topologyMinIntervalSeconds", minimum=1, maximum=3600
    )


@dataclass(frozen=True)
class MetricsSettings:
    """The `metrics` service (slonk.metrics) on the controller and every worker: Prometheus
    scrapes /metrics on this port."""

    port: int = setting(9341, "port", **PORT)


@dataclass(frozen=True)
class RestApiSettings:
    """slurmrestd (its own pod, Service <release>-restapi): Slurm's REST API. Clients send a
    JSON Web Token that slurmctld issued to their user (`scontrol token`), and each request
    acts as that user; slurmctld and slurmdbd verify it with a key the REST pod never holds."""

    port: int = setting(6820, "port", **PORT)
    max_token_lifespan_seconds: int = setting(
        3600,
        "maxTokenLifespanSeconds",
        minimum=60,
        maximum=30 * 86400,
        doc="The longest token slurmctld issues to a user (`scontrol token lifespan=`): a "
        "token leaked from a command line or a log acts as its user until it expires. Root "
        "and SlurmUser are not held to it.",
    )


@dataclass(frozen=True)
class MailSettings:
    """Mail for `sbatch --mail-type`: slurmctld's MailProg (slonk.slurm.mail) hands each
    message to the site's SMTP relay. Without a relay there is no `mail` section, and sbatch
    tells a user who asks for mail that none will come."""

    relay: str = setting(
        "",
        "relay",
        pattern=patterns.MAIL_RELAY,
        what="host[:port]",
        doc="The SMTP relay, host[:port] (port 25 when omitted), that accepts mail from the "
        "controller pods without authentication. Empty: no mail; sbatch tells users who ask "
        "for it (--mail-type) that none will come.",
    )
    sender: str = setting(
        "slurm",
        "sender",
        pattern=patterns.MAIL_ADDRESS,
        what="a mail address",
        doc="The messages' From: address; without a domain, domain's.",
    )
    domain: str = setting(
        "",
        "domain",
        pattern=patterns.MAIL_DOMAIN,
        what="a DNS name",
        doc="slurm.conf's MailDomain: a recipient without a domain (a user name, which "
        "--mail-user defaults to) gets this one. Empty: the relay qualifies it, or refuses.",
    )

    def address(self, name: str) -> str:
        """`name` with the domain, unless it has one or there is none."""
        return f"{name}@{self.domain}" if self.domain and "@" not in name else name


@dataclass(frozen=True)
class BackupController:
    """A second slurmctld (Slurm's second SlurmctldHost) in the controller's second pod, on
    the same state volume: it takes over when the first stops answering, and hands control
    back when the first returns."""

    takeover_seconds: int = setting(
        10,
        "takeoverSeconds",
        minimum=4,
        maximum=600,
        why="the primary's heartbeat comes every takeoverSeconds / 4 whole seconds: below 4, "
        "every instant",
        doc="slurm.conf's SlurmctldTimeout: how long the backup waits for an unanswering "
        "primary before it takes control. Too short, and a primary busy for that long is "
        "taken over while it runs. slurm.slurmConf's SlurmctldTimeout, where set, wins.",
    )


@dataclass(frozen=True)
class CapacitySettings:
    """Nodes lent to Kubernetes (slonk.slurm.power): may Slurm ask them back for pending jobs?"""

    return_on_demand: bool = setting(False, "returnOnDemand")


# Slurm adds the weighted factors into a 32-bit priority: five weights of at most this cannot
# overflow it.
WEIGHT = {"minimum": 0, "maximum": 100_000_000}


@dataclass(frozen=True)
class PriorityWeights:
    """priority/multifactor's weights: fair share dominates, age keeps old jobs moving, job
    size keeps wide jobs from starving behind narrow ones. Partition (of each partition's
    PriorityJobFactor) and QOS are the site's to weigh."""

    fairshare: int = setting(10000, "fairshare", **WEIGHT)
    age: int = setting(1000, "age", **WEIGHT)
    job_size: int = setting(1000, "jobSize", **WEIGHT)
    partition: int = setting(0, "partition", **WEIGHT)
    qos: int = setting(0, "qos", **WEIGHT)


@dataclass(frozen=True)
class Priority:
    weights: PriorityWeights = PriorityWeights()
    # Past usage counts half after this long.
    decay_half_life: str = setting("7-0", "decayHalfLife", **PERIOD)
    max_age: str = setting("7-0", "maxAge", **PERIOD)  # a job's age factor is full after this long


@dataclass(frozen=True)
class SshSettings:
    """sshd beyond the login pods: on every worker with pam_slurm_adopt (a user reaches the
    node of their job, inside the job), and the site's SSH certificate authorities
    (paths.SSH_USER_CA, mounted from ssh.trustedUserCAKeys) trusted for users' logins."""

    workers: bool = setting(True, "workers", values="workers.ssh.enabled")
    trusted_user_ca_keys: bool = False  # the chart's: ssh.trustedUserCAKeys holds keys


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
    port: int = setting(3306, "port", **PORT)
    name: str = setting(
        "slurm_acct_db",
        "name",
        pattern=patterns.DATABASE_NAME,
        what="a database name (letters, digits, _)",
    )
    user: str = setting(
        "slurm",
        "user",
        pattern=patterns.DATABASE_USER,
        what="a database user (letters, digits, _)",
    )
    # Verify against paths.ACCOUNTING_CA.
    tls: bool = setting(False, "tls", values="accounting.database.tls.enabled")


@dataclass(frozen=True)
class AccountingSettings:
    """Slurm accounting through slurmdbd (its own pod, Service `host`)."""

    host: str
    database: Database
    port: int = setting(6819, "port", values="accounting.slurmdbd.port", **PORT)
    default_account: str = setting(
        "research",
        "defaultAccount",
        pattern=patterns.ACCOUNT_NAME,
        what="a Slurm account (lowercase letters, digits, _ . -)",
        values="accounting.defaultAccount",
    )
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
    cluster_domain: str = setting(
        "cluster.local",
        "clusterDomain",
        pattern=patterns.DNS_NAME,
        what="a DNS domain",
        values="clusterDomain",
    )
    slurmctld_port: int = setting(6817, "slurmctldPort", values="slurm.slurmctldPort", **PORT)
    slurmd_port: int = setting(6818, "slurmdPort", values="slurm.slurmdPort", **PORT)
    # In name order (as Helm ranges over the values' maps).
    nodepools: tuple[NodePool, ...] = ()
    partitions: tuple[Partition, ...] = ()
    # How long a stopping worker pod waits for its node's jobs before requeueing them
    # (workers.drainTimeoutSeconds; slonk.pod.worker_stop).
    drain_timeout_seconds: int = setting(
        300, "drainTimeoutSeconds", minimum=0, values="workers.drainTimeoutSeconds"
    )
    confinement: str = setting(
        "cgroup", "confinement", choices=CONFINEMENTS, values="slurm.confinement"
    )
    topology: str = setting("tree", "topology", choices=TOPOLOGY_PLUGINS, values="slurm.topology")
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
    restapi: RestApiSettings | None = None
    backup_controller: BackupController | None = None
    mail: MailSettings | None = None
    # The site's scratch volume at /scratch on login pods and workers (values scratch): the
    # users sync makes each user's directory there.
    scratch: bool = False

    @property
    def controller_names(self) -> tuple[str, ...]:
        """The controller StatefulSet's pods, primary first (Slurm's SlurmctldHost order)."""
        count = 1 if self.backup_controller is None else 2
        return tuple(f"{self.release}-controller-{i}" for i in range(count))

    @property
    def controller_addresses(self) -> tuple[str, ...]:
        """Where each slurmctld answers, fully qualified (reachable from any namespace): the
        controller's Service, or with a backup each pod's own name (the headless Service
        <release>-pods), since clients must reach each one in turn."""
        domain = f"{self.namespace}.svc.{self.cluster_domain}"
        if self.backup_controller is None:
            return (f"{self.release}-controller.{domain}",)
        return tuple(f"{name}.{self.release}-pods.{domain}" for name in self.controller_names)

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

    def jobs_private(self) -> bool:
        """Whether slurm.conf's PrivateData hides one user's jobs from another: then nothing
        slonk serves names a job or its user. Read as Slurm reads it, a word anywhere in the
        value, in any case (`job`, `jobs`, `users`, `all`), so slonk hides no less."""
        # extraLines' settings are in slurm_conf too (the parser merges them; only comments stay).
        given = [str(v or "") for k, v in self.slurm_conf.items() if k.lower() == "privatedata"]
        return any(word in value.lower() for value in given for word in ("job", "user", "all"))

    def active_checks(self, pool: NodePool) -> dict[str, ActiveCheckSettings]:
        """The active checks a pool's nodes run: every check slonk ships tests GPUs, so only
        pools with GPUs run any (a site's own commands among them)."""
        if self.health is None or self.health.active is None or not pool.gpus:
            return {}
        return dict(self.health.active.checks)

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
