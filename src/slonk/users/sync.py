"""`slonk users sync`: the spec's static users and the directory's, into local files.

As the most trusted directory-to-files tools do: entries that are incomplete, invalid or
ambiguous are skipped and counted, never guessed at; a failed or empty search changes
nothing; a sync that would remove more than a set share of the users is refused unless
forced. Logins and jobs never wait on LDAP: they read the files.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slonk.config.spec import ACCOUNT_NAME, ClusterSpec, Group, LdapSettings, SpecError, User
from slonk.files import write_atomically
from slonk.services import idle
from slonk.users.directory import Directory, DirectoryError, Entry, read_directory
from slonk.users.files import make_homes, write_accounts, write_authorized_keys

STATE_FILE = Path("/var/lib/slonk/users.json")


class SyncRefused(RuntimeError):
    """The sync would be unsafe; the files stay as they were."""


@dataclass
class Result:
    users: list[User]
    groups: list[Group]
    skipped: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)

    def skip(self, reason: str, detail: str) -> None:
        self.skipped[reason] += 1
        self.warnings.append(f"skipped {detail}: {reason}")


def _first(entry: Entry, attribute: str) -> str | None:
    values = entry.get(attribute) or []
    return values[0] if values else None


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _shells(etc: Path) -> set[str]:
    try:
        lines = (etc / "shells").read_text().splitlines()
    except OSError:
        return {"/bin/sh", "/bin/bash"}
    return {line.strip() for line in lines if line.strip().startswith("/")}


def _system_accounts(path: Path, managed: set[str]) -> set[str]:
    """Names in a file that slonk does not manage: the image's own accounts."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return set()
    return {line.split(":")[0] for line in lines if line} - managed


def from_directory(
    directory: Directory,
    settings: LdapSettings,
    static: Result,
    shells: set[str],
    reserved_users: set[str],
    reserved_groups: set[str],
) -> Result:
    """Directory entries as users and groups; each bad entry skipped with its reason."""
    a = settings.attributes
    result = Result(users=list(static.users), groups=list(static.groups))
    names = {u.name: u for u in static.users}
    uids = {u.uid for u in static.users}
    group_names = {g.name for g in static.groups}
    gids = {g.gid for g in static.groups}

    members: dict[str, list[str]] = {}
    for entry in sorted(directory.groups, key=lambda e: e["dn"][0]):
        dn, name, gid = (
            entry["dn"][0],
            _first(entry, a["groupName"]),
            _number(_first(entry, a["gidNumber"])),
        )
        if name is None or not ACCOUNT_NAME.match(name):
            result.skip("invalid group name", f"group {dn}")
        elif gid is None:
            result.skip("no gidNumber", f"group {dn}")
        elif name in group_names or name in reserved_groups:
            result.skip("duplicate group name", f"group {dn} ({name})")
        elif gid in gids:
            result.skip("duplicate gid", f"group {dn} ({name}, gid {gid})")
        else:
            result.groups.append(Group(name=name, gid=gid))
            group_names.add(name)
            gids.add(gid)
            for member in entry.get(a["groupMember"], []):
                members.setdefault(member, []).append(name)

    for entry in sorted(directory.users, key=lambda e: e["dn"][0]):
        dn, name = entry["dn"][0], _first(entry, a["uid"])
        uid = _number(_first(entry, a["uidNumber"]))
        gid = _number(_first(entry, a["gidNumber"]))
        shell = _first(entry, a["loginShell"]) or "/bin/bash"
        if name is None or not ACCOUNT_NAME.match(name):
            result.skip("invalid user name", f"user {dn}")
        elif uid is None or gid is None:
            result.skip("no uidNumber or gidNumber", f"user {dn}")
        elif uid < settings.min_uid:
            result.skip(f"uid below {settings.min_uid}", f"user {dn} ({name}, uid {uid})")
        elif shell not in shells:
            result.skip("invalid shell", f"user {dn} ({name}, shell {shell})")
        elif name in reserved_users:
            result.skip("system account", f"user {dn} ({name})")
        elif name in names:
            if names[name].uid != uid:
                result.skip(
                    "clashes with a static user",
                    f"user {dn} ({name}, uid {uid} in LDAP, {names[name].uid} in values)",
                )
        elif uid in uids:
            result.skip("duplicate uid", f"user {dn} ({name}, uid {uid})")
        else:
            user = User(
                name=name,
                uid=uid,
                gid=gid,
                shell=shell,
                home=_first(entry, a["homeDirectory"]) or "",
                groups=tuple(members.get(name, ())),
                ssh_keys=tuple(k.strip() for k in entry.get(a["sshPublicKey"], []) if k.strip()),
            )
            result.users.append(user)
            names[name] = user
            uids.add(uid)
    return result


@dataclass(frozen=True)
class Paths:
    etc: Path = Path("/etc")
    home: Path = Path("/home")
    state: Path = STATE_FILE


def _load_state(path: Path) -> dict[str, list[str]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"users": [], "groups": [], "ldap_users": []}


def sync(
    spec: ClusterSpec,
    paths: Paths = Paths(),
    force: bool = False,
    read: Callable[[LdapSettings], Directory] = read_directory,
) -> Result:
    """Write the spec's static users and, if configured, the directory's. Raises
    DirectoryError or SyncRefused with the files untouched."""
    state = _load_state(paths.state)
    static = Result(users=list(spec.users), groups=list(spec.groups))
    result = static
    ldap_names: set[str] = set()
    if spec.ldap is not None:
        directory = read(spec.ldap)  # DirectoryError: nothing below runs
        if not directory.users:
            raise SyncRefused(
                f"{directory.server} returned no users for {spec.ldap.user_filter} under "
                f"{spec.ldap.user_base}; keeping the {len(state['ldap_users'])} synced before"
            )
        managed = set(state["users"]) | set(state["groups"])
        result = from_directory(
            directory,
            spec.ldap,
            static,
            _shells(paths.etc),
            _system_accounts(paths.etc / "passwd", managed),
            _system_accounts(paths.etc / "group", managed),
        )
        ldap_names = {u.name for u in result.users} - {u.name for u in spec.users}
        removed = set(state["ldap_users"]) - ldap_names
        limit = spec.ldap.max_removal_percent / 100 * len(state["ldap_users"])
        if removed and len(removed) > limit and not force:
            raise SyncRefused(
                f"sync would remove {len(removed)} of {len(state['ldap_users'])} users "
                f"(more than {spec.ldap.max_removal_percent}%): {', '.join(sorted(removed)[:5])}"
                f"{'...' if len(removed) > 5 else ''}; run `slonk users sync --force` to accept"
            )
    _write(result, state, paths, ldap_names)
    return result


def _write(result: Result, state: dict[str, list[str]], paths: Paths, ldap_names: set[str]) -> None:
    """Files first, then the record of what slonk manages: a crash in between leaves a record
    that still covers every entry slonk wrote."""
    names = {u.name for u in result.users}
    group_names = {g.name for g in result.groups} | names
    gone_users = set(state["users"]) - names
    write_accounts(
        result.users,
        result.groups,
        paths.etc,
        drop=gone_users | (set(state["groups"]) - group_names),
    )
    write_authorized_keys(result.users, paths.etc, drop=gone_users)
    make_homes(result.users, paths.home)
    new_state = {
        "users": sorted(names),
        "groups": sorted(group_names),
        "ldap_users": sorted(ldap_names),
    }
    paths.state.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(paths.state, json.dumps(new_state, indent=1) + "\n")


def log(message: str) -> None:
    print(f"slonk users: {message}", flush=True)


def run_once(spec: ClusterSpec, force: bool = False, reported: set[str] | None = None) -> bool:
    """One sync with its report on stdout; False if it changed nothing because it could not."""
    started = time.perf_counter()
    try:
        result = sync(spec, force=force)
    except (DirectoryError, SyncRefused) as err:
        log(f"sync refused, users kept as they were: {err}")
        return False
    for warning in result.warnings:
        if reported is None or warning not in reported:
            log(warning)
            if reported is not None:
                reported.add(warning)
    skipped = ", ".join(f"{n} {r}" for r, n in sorted(result.skipped.items())) or "none skipped"
    log(
        f"synced {len(result.users)} users, {len(result.groups)} groups ({skipped}) "
        f"in {(time.perf_counter() - started) * 1000:.0f} ms"
    )
    return True


def run_forever(load: Callable[[], ClusterSpec]) -> None:
    """Sync every `syncIntervalSeconds`, re-reading the spec each time (a broken ConfigMap
    keeps the last good spec); each warning is logged once, not every interval."""
    reported: set[str] = set()
    spec = load()
    while True:
        if spec.ldap is None:
            idle("LDAP is not configured", log)
        time.sleep(spec.ldap.sync_interval_seconds)
        try:
            spec = load()
        except SpecError as err:
            log(f"keeping the last good settings: {err}")
        if spec.ldap is not None:
            run_once(spec, reported=reported)
