"""With accounting, a job runs only for a user slurmctld knows an association of
(AccountingStorageEnforce=associations): `up` waits until it knows one for every user of the
spec, static or in the development directory, as it waits for the nodes."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection

from slonk.config import accounts
from slonk.config.spec import ClusterSpec
from slonk.local.manifests import LocalModeError
from slonk.local.state import Cluster

ASSOCIATIONS_TIMEOUT_SECONDS = 120.0
# `scontrol show assoc_mgr` names a user's association "UserName=demo(5000)"; only names
# slonk admits (slonk.config.accounts) are read, whatever else a line holds.
_USER = re.compile(rf"\bUserName=({accounts.NAME_PATTERN.strip('^$')})\(")


def spec_users(spec: ClusterSpec) -> list[str]:
    directory = spec.ldap_server.users if spec.ldap_server else ()
    return sorted({u.name for u in (*spec.users, *directory)})


def known_users(cluster: Cluster, users: Collection[str]) -> set[str]:
    """The users among `users` slurmctld holds an association of (none while it does not
    answer)."""
    controller = cluster.running_controller()
    if controller is None or not users:
        return set()
    command = ["scontrol", "show", "assoc_mgr", "flags=assoc", f"users={','.join(users)}"]
    result = cluster.run(controller, command)
    return parse_users(result.stdout, users) if result.returncode == 0 else set()


def parse_users(output: str, users: Collection[str]) -> set[str]:
    return set(_USER.findall(output)) & set(users)


def wait_associations(
    cluster: Cluster,
    spec: ClusterSpec,
    timeout: float = ASSOCIATIONS_TIMEOUT_SECONDS,
    progress: Callable[[str], None] = print,
) -> None:
    users = spec_users(spec)
    if spec.accounting is None or not users:
        return
    started = time.monotonic()
    while (missing := sorted(set(users) - known_users(cluster, users))) and (
        time.monotonic() - started < timeout
    ):
        time.sleep(0.1)
    if missing:
        raise LocalModeError(
            f"no Slurm association for {', '.join(missing)} after {timeout:.0f} s: their jobs "
            "would be refused (see the controller's log, `slonk accounting`)"
        )
    progress(f"  associations: {', '.join(users)} ({time.monotonic() - started:.1f} s)")
