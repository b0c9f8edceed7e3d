"""The controller's users sync with accounting (the agent's task `associations`):
after every users sync, the associations of the users it wrote (slonk.accounting.
associations); while slurmdbd does not answer, the same again every RETRY_SECONDS with the
last good users, so a new user waits at most one pass once slurmdbd is up."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from slonk.accounting.associations import AccountingUnavailable, ensure
from slonk.base.identity import pod_name
from slonk.config.render import max_job_count
from slonk.config.spec import ClusterSpec, SpecError
from slonk.slurm import control
from slonk.users import sync as users_sync

RETRY_SECONDS = 5.0
# Without LDAP the static users change only with cluster.yaml: this often is enough.
STATIC_INTERVAL_SECONDS = 30.0


def log(message: str) -> None:
    print(f"slonk accounting: {message}", flush=True)


class Associations:
    """The pass after each sync: it remembers the last good users and whether slurmdbd has
    taken them, and says a failure once, not at every retry."""

    def __init__(self) -> None:
        self.users: users_sync.Result | None = None
        self.pending = False
        self.last_error = ""

    def synced(self, result: users_sync.Result | None) -> None:
        if result is not None:
            self.users, self.pending = result, True

    def apply(self, spec: ClusterSpec) -> None:
        if not (self.pending and self.users and spec.accounting):
            return
        try:
            count, warnings = ensure(
                spec.cluster_name, self.users.users, self.users.groups, spec.accounting,
                max_job_count(spec),
            )  # fmt: skip
        except AccountingUnavailable as err:
            if str(err) != self.last_error:
                log(f"slurmdbd not ready, retrying every {RETRY_SECONDS:g} s: {err}")
            self.last_error = str(err)
            return
        for warning in warnings:
            log(warning)
        if count or self.last_error:
            log(f"associations of {len(self.users.users)} users in place ({count} sacctmgr adds)")
        self.pending, self.last_error = False, ""


def run_forever(
    load: Callable[[], ClusterSpec],
    stop: threading.Event,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Until `stop` is set. One controller in control: its syncs need no per-pod phase."""
    spec = load()
    passes = Associations()
    next_sync = clock()
    while not stop.is_set():
        if clock() >= next_sync:
            try:
                spec = load()
            except SpecError as err:
                log(f"keeping the last good settings: {err}")
            passes.synced(users_sync.run_once(spec))
            interval = spec.ldap.sync_interval_seconds if spec.ldap else STATIC_INTERVAL_SECONDS
            next_sync = clock() + interval
        # sacctmgr's adds once per cluster: in the controller pod in control (a standby's
        # users sync above keeps its own files current, for when it takes over).
        leading = control.in_control(spec, pod_name())
        if leading:
            passes.apply(spec)
        wait = next_sync - clock()
        stop.wait(max(0.0, min(wait, RETRY_SECONDS) if passes.pending and leading else wait))
