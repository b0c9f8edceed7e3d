"""Which accounts a pod writes: the spec's static users and groups, then the directory's.

As the most trusted directory-to-files tools do, an entry that is incomplete, invalid or
ambiguous is skipped with its reason, never guessed at. Every account, static or from LDAP,
passes the same rules (slonk.config.accounts) and may take no name or id of the image's
accounts. Where two entries want one name or id, the account that held it in the last good
sync keeps it (`Owners`): a newcomer with demo's uid cannot push demo out, whatever the DNs'
order; among entries none held, DN order decides, the same on every pod.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ldap3.core.exceptions import LDAPInvalidDnError
from ldap3.utils.dn import parse_dn

from slonk.config import accounts
from slonk.config.accounts import AccountError, AccountRules, show
from slonk.config.spec import Group, LdapSettings, User
from slonk.users.directory import Directory, Entry
from slonk.users.files import Base

_NUMBER = re.compile(r"[0-9]{1,10}")


@dataclass(frozen=True)
class Owner:
    """Who held a name in the last good sync: its id and its entry's DN."""

    id: int
    dn: str


@dataclass(frozen=True)
class Owners:
    """The directory's accounts of the last good sync, by name."""

    users: Mapping[str, Owner] = field(default_factory=dict)
    groups: Mapping[str, Owner] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            kind: {name: {"id": o.id, "dn": o.dn} for name, o in sorted(table.items())}
            for kind, table in (("users", self.users), ("groups", self.groups))
        }

    @classmethod
    def from_json(cls, data: Any) -> Owners:
        """ValueError unless `data` is what to_json wrote."""
        tables = []
        for kind in ("users", "groups"):
            table = data[kind]
            if not isinstance(table, dict):
                raise ValueError(f"{kind}: not a mapping")
            tables.append(
                {
                    accounts.check_name(name): Owner(int(o["id"]), str(o["dn"]))
                    for name, o in table.items()
                }
            )
        return cls(*tables)


@dataclass
class Result:
    users: list[User]
    groups: list[Group]
    owners: Owners = field(default_factory=Owners)
    skipped: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    new_warnings: list[str] = field(default_factory=list)

    def skip(self, reason: str, detail: str) -> None:
        self.skipped[reason] += 1
        self.warnings.append(f"skipped {detail}")


class _Skip(Exception):
    """An entry that is not admitted: a short reason (counted) and the detail (logged)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _rule(reason: str, check: Any, *args: Any) -> Any:
    try:
        return check(*args)
    except AccountError as err:
        raise _Skip(reason, str(err)) from err


def _single(entry: Entry, attribute: str, name_of_entry: bool = False) -> str | None:
    """The attribute's one value. A name with several values is the one in the entry's own
    RDN (RFC 2307 allows several uid or cn values); anything else with several is refused."""
    values = entry.get(attribute) or []
    if len(values) <= 1:
        return values[0] if values else None
    if name_of_entry:
        try:
            rdn_attribute, rdn_value, _ = parse_dn(entry["dn"][0])[0]
        except (LDAPInvalidDnError, IndexError):
            rdn_attribute, rdn_value = "", ""
        if rdn_attribute.lower() == attribute.lower() and rdn_value in values:
            return rdn_value
    raise _Skip(f"several values for {attribute}", f"{len(values)} values for {attribute}")


def _number(entry: Entry, attribute: str) -> int:
    value = _single(entry, attribute)
    if value is None:
        raise _Skip(f"no {attribute}", f"no {attribute}")
    if not _NUMBER.fullmatch(value):
        raise _Skip(f"invalid {attribute}", f"{attribute} {show(value)} is not a number")
    return int(value)


def _ldap_group(entry: Entry, a: Mapping[str, str]) -> tuple[Group, list[str]]:
    name = _single(entry, a["groupName"], name_of_entry=True)
    if name is None:
        raise _Skip("invalid group name", f"no {a['groupName']}")
    return Group(name=name, gid=_number(entry, a["gidNumber"])), entry.get(a["groupMember"], [])


class _BadKeys(Exception):
    """A user admissible without some of its keys: the keys go, the user stays."""

    def __init__(self, user: User, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.user = user


def _ldap_user(entry: Entry, a: Mapping[str, str]) -> User:
    name = _single(entry, a["uid"], name_of_entry=True)
    if name is None:
        raise _Skip("invalid user name", f"no {a['uid']}")
    keys, bad = [], []
    for value in entry.get(a["sshPublicKey"], []):
        try:
            keys.append(accounts.check_key(value))
        except AccountError as err:
            bad.append(str(err))
    user = User(
        name=name,
        uid=_number(entry, a["uidNumber"]),
        gid=_number(entry, a["gidNumber"]),
        shell=_single(entry, a["loginShell"]) or accounts.DEFAULT_SHELL,
        home=_single(entry, a["homeDirectory"]) or "",
        ssh_keys=tuple(keys),
    )
    if bad:  # the user stays, without the keys that are not one clean line each
        raise _BadKeys(user, bad)
    return user


@dataclass
class _Taken:
    """Names and ids in use: the image's, then each admitted account's."""

    base: Base
    user_names: dict[str, User] = field(default_factory=dict)
    uids: dict[int, str] = field(default_factory=dict)
    group_names: dict[str, int] = field(default_factory=dict)
    gids: dict[int, str] = field(default_factory=dict)


class _Admission:
    def __init__(
        self, rules: AccountRules, shells: Collection[str], base: Base, result: Result
    ) -> None:
        self.rules, self.shells, self.result = rules, shells, result
        self.taken = _Taken(base)

    def group(self, group: Group) -> None:
        """Raises _Skip, or admits the group."""
        taken, base = self.taken, self.taken.base
        name = _rule("invalid group name", accounts.check_name, group.name, "group name")
        gid = _rule("invalid gid", self.rules.check_id, group.gid, "gid")
        if name in base.names:
            raise _Skip("image account", f"name {name} is the image's")
        if gid in base.gids:
            raise _Skip("image account", f"gid {gid} is the image's")
        if name in taken.group_names:
            raise _Skip("duplicate group name", f"group name {name} is taken")
        if gid in taken.gids:
            raise _Skip("duplicate gid", f"gid {gid} is {taken.gids[gid]}'s")
        taken.group_names[name], taken.gids[gid] = gid, name
        self.result.groups.append(group)

    def user(self, user: User, static: Mapping[str, User]) -> bool:
        """Raises _Skip; False for a directory entry of a static user (same name and uid:
        one account), True when the user is admitted."""
        taken, base = self.taken, self.taken.base
        name = _rule("invalid user name", accounts.check_name, user.name, "user name")
        _rule("invalid uid", self.rules.check_id, user.uid, "uid")
        _rule("invalid gid", self.rules.check_id, user.gid, "gid")
        _rule("invalid home", self.rules.check_home, user.home_dir)
        _rule("invalid shell", accounts.check_shell, user.shell, self.shells)
        for key in user.ssh_keys:
            _rule("invalid SSH key", accounts.check_key, key)
        if name in base.names:
            raise _Skip("image account", f"name {name} is the image's")
        if user.uid in base.uids:
            raise _Skip("image account", f"uid {user.uid} is the image's")
        if user.gid in base.gids:
            raise _Skip("image account", f"gid {user.gid} is the image's")
        if name in taken.user_names:
            held = taken.user_names[name]
            if name in static and held.uid == user.uid:
                return False
            raise _Skip("duplicate user name", f"user name {name} is taken (uid {held.uid})")
        if user.uid in taken.uids:
            raise _Skip("duplicate uid", f"uid {user.uid} is {taken.uids[user.uid]}'s")
        admitted = replace(user, groups=tuple(g for g in user.groups if g in taken.group_names))
        taken.user_names[name], taken.uids[user.uid] = admitted, name
        self.result.users.append(admitted)
        return True

    def personal_groups(self) -> None:
        """A group named after each user whose gid no group has. Users sharing such a gid
        share the first one's group; a name a group already has gets none (warned)."""
        taken = self.taken
        for user in self.result.users:
            if user.gid in taken.gids:
                continue
            if user.name in taken.group_names:
                self.result.warnings.append(
                    f"user {user.name}: no group for its gid {user.gid}: the group "
                    f"{user.name} has gid {taken.group_names[user.name]}"
                )
                continue
            taken.group_names[user.name], taken.gids[user.gid] = user.gid, user.name
            self.result.groups.append(Group(user.name, user.gid))


def _held_first(items: Iterable[tuple[Any, str]], owners: Mapping[str, Owner]) -> list[Any]:
    """(account, dn) pairs: those whose name, id and DN were held in the last good sync
    first, then the rest, each in DN order."""

    def key(item: tuple[Any, str]) -> tuple[bool, str]:
        account, dn = item
        number = account.uid if isinstance(account, User) else account.gid
        return (owners.get(account.name) != Owner(number, dn), dn)

    return sorted(items, key=key)


def admit(
    static_users: Iterable[User],
    static_groups: Iterable[Group],
    directory: Directory | None,
    settings: LdapSettings | None,
    rules: AccountRules,
    shells: Collection[str],
    base: Base,
    previous: Owners,
) -> Result:
    """The accounts to write, each bad one skipped with its reason. Groups before users,
    static before the directory's, the directory's held in `previous` before the others."""
    result = Result(users=[], groups=[])
    admission = _Admission(rules, shells, base, result)
    static_users = list(static_users)
    static = {u.name: u for u in static_users}

    for group in static_groups:
        try:
            admission.group(group)
        except _Skip as skip:
            result.skip(skip.reason, f"static group {group.name}: {skip.detail}")

    groups, members_of, users = _parse(directory, settings, result)
    held_users: dict[str, Owner] = {}
    held_groups: dict[str, Owner] = {}
    memberships: dict[str, list[str]] = {}
    for group, dn in _held_first(groups, previous.groups):
        try:
            admission.group(group)
        except _Skip as skip:
            result.skip(skip.reason, f"group {show(dn)}: {skip.detail}")
            continue
        held_groups[group.name] = Owner(group.gid, dn)
        for member in members_of[dn]:
            memberships.setdefault(member, []).append(group.name)

    for user in static_users:
        try:
            admission.user(user, static)
        except _Skip as skip:
            result.skip(skip.reason, f"static user {user.name}: {skip.detail}")

    for user, dn in _held_first(users, previous.users):
        try:
            if admission.user(replace(user, groups=tuple(memberships.get(user.name, ()))), static):
                held_users[user.name] = Owner(user.uid, dn)
        except _Skip as skip:
            result.skip(skip.reason, f"user {show(dn)}: {skip.detail}")

    admission.personal_groups()
    result.owners = Owners(users=held_users, groups=held_groups)
    return result


def _parse(
    directory: Directory | None, settings: LdapSettings | None, result: Result
) -> tuple[list[tuple[Group, str]], dict[str, list[str]], list[tuple[User, str]]]:
    """The directory's groups (with their memberUid values by DN) and users, as accounts
    still to check; entries missing a value or holding several are skipped here."""
    groups: list[tuple[Group, str]] = []
    members_of: dict[str, list[str]] = {}
    users: list[tuple[User, str]] = []
    if directory is None or settings is None:
        return groups, members_of, users
    a = settings.attributes
    for entry in directory.groups:
        dn = entry["dn"][0]
        try:
            group, members = _ldap_group(entry, a)
        except _Skip as skip:
            result.skip(skip.reason, f"group {show(dn)}: {skip.detail}")
            continue
        groups.append((group, dn))
        members_of[dn] = members
    for entry in directory.users:
        dn = entry["dn"][0]
        try:
            users.append((_ldap_user(entry, a), dn))
        except _Skip as skip:
            result.skip(skip.reason, f"user {show(dn)}: {skip.detail}")
        except _BadKeys as bad:
            result.warnings.append(f"user {show(dn)}: SSH keys left out: {bad}")
            users.append((bad.user, dn))
    return groups, members_of, users
