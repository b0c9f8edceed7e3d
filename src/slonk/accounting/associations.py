"""Every user slonk writes (static or from LDAP) gets a Slurm association, on the controller
after each users sync: AccountingStorageEnforce=associations refuses jobs of users without one.

Only additions: an account, a user's association, the cluster itself when slurmdbd does not
know it yet. Nothing that exists is removed or changed (a user who left the directory keeps
their associations and their jobs' history; an operator removes them with sacctmgr), so a
failed, partial or wrong search can never take anyone's association or usage away.

`plan` is the pure part: from the wanted associations and what slurmdbd has, the sacctmgr
commands (argv lists, never a shell) that add what is missing.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.config import accounts, patterns
from slonk.config.model import AccountingSettings, Group, User

SACCTMGR_TIMEOUT_SECONDS = 30
# The QOS of every association (slurmdbd makes it with the cluster). Its per-user limit on
# submitted jobs (pending and running, each array task one) keeps one user from filling
# slurmctld's job table (MaxJobCount) with held jobs, so that nobody else can submit: each
# user may hold 1/SUBMIT_SHARE of it. slonk sets it only while it is unset, once: an
# operator's own (`sacctmgr modify qos normal set MaxSubmitJobsPerUser=N`) stays, and so does
# slonk's when MaxJobCount changes later (set it again by hand then).
DEFAULT_QOS = "normal"
SUBMIT_SHARE = 10


class AccountingUnavailable(SlonkError):
    """slurmdbd did not answer, or refused a command: retried at the next sync."""


@dataclass(frozen=True)
class Existing:
    """What slurmdbd holds for this cluster: whether it knows the cluster, the accounts that
    have an association on it, and each user's accounts on it."""

    cluster: bool = False
    accounts: frozenset[str] = frozenset()
    users: Mapping[str, frozenset[str]] = field(default_factory=dict)


def wanted(
    users: Iterable[User], groups: Iterable[Group], settings: AccountingSettings
) -> dict[str, tuple[str, ...]]:
    """Each user's accounts, their default first: the accounts of the groupAccounts entries
    whose group the user is in (supplementary or primary group), in that order, else the
    default account."""
    by_gid = {g.gid: g.name for g in groups}
    result = {}
    for user in users:
        names = set(user.groups)
        if user.gid in by_gid:
            names.add(by_gid[user.gid])
        mapped = [m.account for m in settings.group_accounts if m.group in names]
        result[user.name] = tuple(dict.fromkeys(mapped)) or (settings.default_account,)
    return result


def plan(
    cluster: str, want: Mapping[str, Sequence[str]], existing: Existing
) -> tuple[list[list[str]], list[str]]:
    """The sacctmgr arguments that add what `want` lacks, in the order to run them, and a
    warning for every name refused (none should be: the spec and the users sync check them,
    and here they become `key=value` arguments, where `=` or `,` would be syntax)."""
    warnings = []
    if not patterns.matches(patterns.CLUSTER_NAME, cluster):
        return [], [f"cluster name {cluster!r} is not a Slurm cluster name"]
    clean: dict[str, tuple[str, ...]] = {}
    for user, user_accounts in sorted(want.items()):
        bad = [a for a in user_accounts if not patterns.matches(patterns.ACCOUNT_NAME, a)]
        if not patterns.matches(accounts.NAME_PATTERN, user) or bad or not user_accounts:
            warnings.append(f"user {user!r} with accounts {list(user_accounts)!r} skipped")
            continue
        clean[user] = tuple(user_accounts)
    commands: list[list[str]] = []
    if not existing.cluster:
        commands.append(["add", "cluster", cluster])
    needed = sorted({a for accs in clean.values() for a in accs} - existing.accounts)
    if needed:
        commands.append(["add", "account", ",".join(needed), f"cluster={cluster}"])
    # A user without an association here is added in their default account first (sacctmgr
    # needs one for a new user), then in their other accounts.
    first: dict[str, list[str]] = {}
    more: dict[str, list[str]] = {}
    for user, user_accounts in clean.items():
        has = existing.users.get(user, frozenset())
        missing = [a for a in user_accounts if a not in has]
        if not has and missing:
            first.setdefault(missing[0], []).append(user)
            missing = missing[1:]
        for account in missing:
            more.setdefault(account, []).append(user)
    for account, names in sorted(first.items()):
        commands.append(
            ["add", "user", ",".join(names), f"account={account}",
             f"defaultaccount={account}", f"cluster={cluster}"]
        )  # fmt: skip
    for account, names in sorted(more.items()):
        user_list = ",".join(names)
        commands.append(["add", "user", user_list, f"account={account}", f"cluster={cluster}"])
    return commands, warnings


def submit_limit(max_job_count: int) -> int:
    return max(1, max_job_count // SUBMIT_SHARE)


def submit_limit_command(current: str, limit: int) -> list[str] | None:
    """The sacctmgr arguments that give DEFAULT_QOS its per-user limit on submitted jobs;
    None when it has one, or when there is no such QOS (a site that removed it).
    `current`: `sacctmgr -n -P show qos DEFAULT_QOS format=Name,MaxSubmitPU` (untrusted)."""
    for line in current.splitlines():
        name, _, value = line.partition("|")
        if name == DEFAULT_QOS:
            return None if value.strip() else [
                "modify", "qos", DEFAULT_QOS, "set", f"MaxSubmitJobsPerUser={limit}",
            ]  # fmt: skip
    return None


def parse_existing(cluster: str, clusters: str, associations: str) -> Existing:
    """Existing from `sacctmgr -n -P` output (untrusted: lines that are not two fields are
    ignored, names are only ever compared)."""
    known = any(line.strip() == cluster for line in clusters.splitlines())
    account_set: set[str] = set()
    users: dict[str, set[str]] = {}
    for line in associations.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 2 or not fields[0]:
            continue
        account, user = fields
        if user:
            users.setdefault(user, set()).add(account)
        else:
            account_set.add(account)
    return Existing(known, frozenset(account_set), {u: frozenset(a) for u, a in users.items()})


def sacctmgr(args: Sequence[str], conf: str = str(paths.SLURMCTLD_CONF_DIR / "slurm.conf")) -> str:
    """One sacctmgr command, not interactive (-i: commit without asking). On the controller it
    reads slurmctld's own slurm.conf: the configless fetch needs slurmctld, which on a new
    cluster may wait on slurmdbd."""
    argv = ["sacctmgr", "-i", "-n", "-P", *args]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False,
            timeout=SACCTMGR_TIMEOUT_SECONDS, env={**os.environ, "SLURM_CONF": conf},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AccountingUnavailable(f"sacctmgr {args[0]} {args[1]}: no answer") from None
    said = " ".join((done.stderr.strip() or done.stdout.strip()).split())[:300]
    if done.returncode and "Nothing new added" not in said:
        raise AccountingUnavailable(f"sacctmgr {' '.join(args[:2])}: {said or 'failed'}")
    return done.stdout


def ensure(
    cluster: str,
    users: Iterable[User],
    groups: Iterable[Group],
    settings: AccountingSettings,
    max_job_count: int,
) -> tuple[int, list[str]]:
    """Add the missing associations, and the QOS's per-user limit on submitted jobs if it
    has none; how many commands ran, and the warnings. Raises AccountingUnavailable when
    slurmdbd does not answer (the next sync tries again)."""
    existing = parse_existing(
        cluster,
        sacctmgr(["show", "cluster", "format=cluster"]),
        sacctmgr(["show", "association", f"cluster={cluster}", "format=account,user"]),
    )
    commands, warnings = plan(cluster, wanted(users, groups, settings), existing)
    current = sacctmgr(["show", "qos", DEFAULT_QOS, "format=Name,MaxSubmitPU"])
    if limit := submit_limit_command(current, submit_limit(max_job_count)):
        commands.append(limit)
    elif not current.strip():
        warnings.append(f"no QOS {DEFAULT_QOS}: users' submitted jobs have no per-user limit")
    for command in commands:
        sacctmgr(command)
    return len(commands), warnings
