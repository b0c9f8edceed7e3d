"""`slonk users sync`: the spec's static users and the directory's, into local files.

A failed or empty search changes nothing; a sync that would remove more than a set share of
the directory's users, or of its groups, is refused unless forced; which entries become
accounts is slonk.users.admit's business, homes slonk.users.homes'. Logins and jobs never
wait on LDAP: they read the files. Each good sync is kept twice: in this pod's record (the
holds on names and ids, the warnings already logged), and as the snapshot on /home that a
pod starting while LDAP is down begins from.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slonk.base import jitter
from slonk.base.errors import SlonkError
from slonk.base.files import write_atomically
from slonk.config import accounts
from slonk.config.spec import ClusterSpec, LdapSettings, SpecError
from slonk.users import snapshot
from slonk.users.admit import Owners, admit
from slonk.users.admit import Result as Result  # re-exported: what sync() returns
from slonk.users.directory import Directory, DirectoryError, read_directory
from slonk.users.files import capture_base, write_accounts, write_authorized_keys
from slonk.users.homes import make_homes, make_scratch, secure_root


class SyncRefused(SlonkError):
    """The sync would be unsafe; the files stay as they were."""


@dataclass(frozen=True)
class Paths:
    etc: Path = Path("/etc")
    home: Path = Path(accounts.HOME)
    scratch: Path = Path(accounts.SCRATCH)
    var: Path = Path("/var/lib/slonk")

    @property
    def state(self) -> Path:
        return self.var / "users.json"

    @property
    def base(self) -> Path:
        """The image's passwd, group and shadow, captured by the pod's first sync."""
        return self.var / "users-base"

    @property
    def snapshot(self) -> Path:
        return self.home / ".slonk" / "users.json"


@dataclass(frozen=True)
class _State:
    owners: Owners
    warnings: tuple[str, ...]


def _load_state(path: Path) -> _State | None:
    try:
        data = json.loads(path.read_text())
        return _State(Owners.from_json(data["owners"]), tuple(map(str, data["warnings"])))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _shells(etc: Path) -> set[str]:
    try:
        lines = (etc / "shells").read_text().splitlines()
    except OSError:
        return {"/bin/sh", accounts.DEFAULT_SHELL}
    return {line.strip() for line in lines if line.strip().startswith("/")}


def _previous(paths: Paths, state: _State | None) -> tuple[Owners, list[str]]:
    """Who held each name in the last good sync: this pod's record, or for a new pod the
    snapshot every pod keeps on /home."""
    if state is not None:
        return state.owners, []
    if not paths.snapshot.exists():
        return Owners(), []
    try:
        return snapshot.load(paths.snapshot)[1], []
    except snapshot.SnapshotError as err:
        return Owners(), [f"last good sync not used: {err}"]


def last_good(paths: Paths = Paths()) -> Callable[[LdapSettings], Directory]:
    """A directory reader for when LDAP does not answer: the snapshot of the last good
    sync (DirectoryError if there is none to trust)."""
    return lambda settings: snapshot.load(paths.snapshot)[0]


def sync(
    spec: ClusterSpec,
    paths: Paths = Paths(),
    force: bool = False,
    read: Callable[[LdapSettings], Directory] = read_directory,
    now: float | None = None,
) -> Result:
    """Write the spec's static users and, if configured, the directory's. Raises
    DirectoryError or SyncRefused with the files untouched. `now`: the time holds are
    measured against (seconds since the epoch)."""
    base = capture_base(paths.etc, paths.base)
    state = _load_state(paths.state)
    previous, notes = _previous(paths, state)
    directory = None
    if spec.ldap is not None:
        directory = read(spec.ldap)  # DirectoryError: nothing below runs
        if not directory.users:
            raise SyncRefused(
                f"{directory.server} returned no users for {spec.ldap.user_filter} under "
                f"{spec.ldap.user_base}; keeping the {len(previous.users)} synced before"
            )
    result = admit(
        spec.users,
        spec.groups,
        directory,
        spec.ldap,
        spec.accounts,
        _shells(paths.etc),
        base,
        previous,
        time.time() if now is None else now,
    )
    if spec.ldap is None:
        result.owners = previous  # the directory was not asked: its record stands
    else:
        _check_removals(spec.ldap, previous, result, force)
    write_accounts(base, result.users, result.groups, paths.etc)
    write_authorized_keys(result.users, paths.etc)
    result.warnings += secure_root(paths.home) + make_homes(result.users, paths.home)
    if spec.scratch and paths.scratch.is_dir():  # a pod that mounts it: login, workers
        # Only on a root users cannot write (an export with root_squash cannot be closed):
        # there, any user could make another's directory first, or rename it away later.
        problems = secure_root(paths.scratch, accounts.SCRATCH)
        result.warnings += problems or make_scratch(result.users, paths.scratch)
    if directory is not None and directory.live:
        try:
            snapshot.save(paths.snapshot, directory, result.owners)
        except (snapshot.SnapshotError, OSError) as err:
            result.warnings.append(f"last good sync not kept on /home: {err}")
    result.warnings += notes
    seen = set(state.warnings) if state else set()
    result.new_warnings = [w for w in result.warnings if w not in seen]
    paths.state.parent.mkdir(parents=True, exist_ok=True)
    record = {"owners": result.owners.to_json(), "warnings": result.warnings}
    write_atomically(paths.state, json.dumps(record, indent=1) + "\n", mode=0o600)
    return result


def _check_removals(settings: LdapSettings, previous: Owners, result: Result, force: bool) -> None:
    """Directory users and groups the last good sync admitted and this one would not: a
    share above the limit of either is refused (a search that returns no groups must not
    drop every membership). Personal groups follow their users and are not counted."""
    kinds = (
        ("users", previous.users, result.owners.users),
        ("groups", previous.groups, result.owners.groups),
    )
    for kind, before, now in kinds:
        had = {name for name, hold in before.items() if hold.admitted and not hold.personal}
        removed = had - {name for name, hold in now.items() if hold.admitted}
        limit = settings.max_removal_percent / 100 * len(had)
        if removed and len(removed) > limit and not force:
            raise SyncRefused(
                f"sync would remove {len(removed)} of {len(had)} {kind} "
                f"(more than {settings.max_removal_percent}%): {', '.join(sorted(removed)[:5])}"
                f"{'...' if len(removed) > 5 else ''}; run `slonk users sync --force` to accept"
            )


def log(message: str) -> None:
    print(f"slonk users: {message}", flush=True)


def run_once(spec: ClusterSpec, force: bool = False) -> Result | None:
    """One sync with its report on stdout; None if it changed nothing because it could not.
    A warning is logged when it first appears, not at every sync."""
    started = time.perf_counter()
    try:
        result = sync(spec, force=force)
    except (DirectoryError, SyncRefused) as err:
        log(f"sync refused, users kept as they were: {err}")
        return None
    for warning in result.new_warnings:
        log(warning)
    skipped = ", ".join(f"{n} {r}" for r, n in sorted(result.skipped.items())) or "none skipped"
    log(
        f"synced {len(result.users)} users, {len(result.groups)} groups ({skipped}) "
        f"in {(time.perf_counter() - started) * 1000:.0f} ms"
    )
    return result


def run_forever(load: Callable[[], ClusterSpec], stop: threading.Event, pod: str) -> None:
    """Sync every `syncIntervalSeconds` at this pod's phase of it (slonk.base.jitter: N pods do not
    search the directory in the same second), re-reading the spec each time (a broken
    ConfigMap keeps the last good spec), until `stop` is set or LDAP is switched off."""
    spec = load()
    while spec.ldap is not None:
        interval = spec.ldap.sync_interval_seconds
        now = time.time()
        if stop.wait(jitter.next_slot(now, interval, jitter.phase(pod, interval)) - now):
            return
        try:
            spec = load()
        except SpecError as err:
            log(f"keeping the last good settings: {err}")
        if spec.ldap is not None:
            run_once(spec)
    log("LDAP is not configured; no sync")
