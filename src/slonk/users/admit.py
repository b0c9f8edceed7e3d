"""Which accounts a pod writes: the spec's static users and groups, then the directory's.

As the most trusted directory-to-files tools do, an entry that is incomplete, invalid or
ambiguous is skipped with its reason, never guessed at. Every account, static or from LDAP,
passes the same rules (slonk.config.accounts) and may take no name or id of the image's
accounts, nor a home that is, holds or lies inside another account's.

A name and its id, once a good sync gave them to a directory entry, are that entry's (a
`Hold`, matched on its DN): no other entry may take the name or the id, whatever the DNs'
order. The hold outlives a sync that skips the entry (an invalid loginShell for a day must
not hand demo's name, uid and home to an entry waiting for it) and, for HOLD_SECONDS, one
whose DN is gone from the directory. An entry that moved (a new DN, nothing else) claims
exactly the held name and id while its old DN is gone: that one claimant takes the hold
over; when several do, none is admitted. A user's personal group holds its gid the same
way: no directory group may take it (its members would share the user's files). Among
entries touching no hold, DN order decides, the same on every pod.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from slonk.config import accounts
from slonk.config.accounts import AccountRules, show
from slonk.config.spec import Group, LdapSettings, User
from slonk.users.directory import Directory
from slonk.users.entries import PERSONAL, BadKeys, Skip, checked, ldap_group, ldap_user
from slonk.users.files import Base

# No time a hold is kept from may be later (year 5138): a bad record must not crash a sync.
_LATEST = 1e11

# How long a name and id stay held for an entry gone from the directory: long enough for
# someone to notice a deleted or filtered-out account, short enough for ids to be reused.
HOLD_SECONDS = 30 * 24 * 3600


@dataclass(frozen=True)
class Hold:
    """A name's id and the entry (DN) that holds both since a good sync admitted it.
    `admitted` False: carried forward, its entry skipped or missing; `gone_since`: since
    when its DN has been missing from the directory (the hold then lasts HOLD_SECONDS)."""

    id: int
    dn: str
    admitted: bool = True
    gone_since: float | None = None

    @property
    def personal(self) -> bool:
        return self.dn == PERSONAL

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "dn": self.dn}
        if not self.admitted:
            data["admitted"] = False
        if self.gone_since is not None:
            data["goneSince"] = self.gone_since
        return data

    @classmethod
    def from_json(cls, data: Any) -> Hold:
        """ValueError unless `data` is what to_json wrote (or the older {id, dn})."""
        number, dn = data["id"], data["dn"]
        admitted, gone = data.get("admitted", True), data.get("goneSince")
        if (
            type(number) is not int
            or not isinstance(dn, str)
            or type(admitted) is not bool
            or not (gone is None or (type(gone) in (int, float) and 0 <= gone < _LATEST))
        ):
            raise ValueError(f"not a hold: {show(data)[:80]}")
        return cls(number, dn, admitted, None if gone is None else float(gone))


@dataclass(frozen=True)
class Owners:
    """The holds of the last good sync, by name: directory users; directory and personal
    groups."""

    users: Mapping[str, Hold] = field(default_factory=dict)
    groups: Mapping[str, Hold] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            kind: {name: hold.to_json() for name, hold in sorted(table.items())}
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
                {accounts.check_name(name): Hold.from_json(h) for name, h in table.items()}
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


@dataclass
class _Taken:
    """Names and ids in use: the image's, then each admitted account's."""

    base: Base
    user_names: dict[str, User] = field(default_factory=dict)
    uids: dict[int, str] = field(default_factory=dict)
    group_names: dict[str, int] = field(default_factory=dict)
    gids: dict[int, str] = field(default_factory=dict)
    homes: dict[str, str] = field(default_factory=dict)  # home -> user
    around_homes: dict[str, str] = field(default_factory=dict)  # each home's parents -> user

    def check_home(self, home: str) -> None:
        """One home, one account: a home that is, holds or lies inside another account's
        would hand one user the other's files (or let one replace the other's dotfiles)."""
        parents = _parents(home)
        if home in self.homes:
            raise Skip("shared home", f"home {home} is {self.homes[home]}'s")
        if inside := next((p for p in parents if p in self.homes), None):
            raise Skip("shared home", f"home {home} is inside {self.homes[inside]}'s home")
        if home in self.around_homes:
            raise Skip("shared home", f"home {home} holds {self.around_homes[home]}'s home")

    def add_home(self, home: str, name: str) -> None:
        self.homes[home] = name
        for parent in _parents(home):
            self.around_homes.setdefault(parent, name)


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(2, len(parts))]


class _Admission:
    def __init__(
        self, rules: AccountRules, shells: Collection[str], base: Base, result: Result
    ) -> None:
        self.rules, self.shells, self.result = rules, shells, result
        self.taken = _Taken(base)

    def group(self, group: Group) -> None:
        """Raises Skip, or admits the group."""
        taken, base = self.taken, self.taken.base
        name = checked("invalid group name", accounts.check_name, group.name, "group name")
        gid = checked("invalid gid", self.rules.check_id, group.gid, "gid")
        if name in base.names:
            raise Skip("image account", f"name {name} is the image's")
        if gid in base.gids:
            raise Skip("image account", f"gid {gid} is the image's")
        if name in taken.group_names:
            raise Skip("duplicate group name", f"group name {name} is taken")
        if gid in taken.gids:
            raise Skip("duplicate gid", f"gid {gid} is {taken.gids[gid]}'s")
        taken.group_names[name], taken.gids[gid] = gid, name
        self.result.groups.append(group)

    def user(self, user: User, static: Mapping[str, User]) -> bool:
        """Raises Skip; False for a directory entry of a static user (same name and uid:
        one account), True when the user is admitted."""
        taken, base = self.taken, self.taken.base
        name = checked("invalid user name", accounts.check_name, user.name, "user name")
        checked("invalid uid", self.rules.check_id, user.uid, "uid")
        checked("invalid gid", self.rules.check_id, user.gid, "gid")
        checked("invalid home", self.rules.check_home, user.home_dir)
        checked("invalid shell", accounts.check_shell, user.shell, self.shells)
        for key in user.ssh_keys:
            checked("invalid SSH key", accounts.check_key, key)
        if name in base.names:
            raise Skip("image account", f"name {name} is the image's")
        if user.uid in base.uids:
            raise Skip("image account", f"uid {user.uid} is the image's")
        if user.gid in base.gids:
            raise Skip("image account", f"gid {user.gid} is the image's")
        if name in taken.user_names:
            held = taken.user_names[name]
            if name in static and held.uid == user.uid:
                return False
            raise Skip("duplicate user name", f"user name {name} is taken (uid {held.uid})")
        if user.uid in taken.uids:
            raise Skip("duplicate uid", f"uid {user.uid} is {taken.uids[user.uid]}'s")
        taken.check_home(user.home_dir)
        admitted = replace(user, groups=tuple(g for g in user.groups if g in taken.group_names))
        taken.user_names[name], taken.uids[user.uid] = admitted, name
        taken.add_home(user.home_dir, name)
        self.result.users.append(admitted)
        return True

    def personal_groups(self, holds: Mapping[str, Hold]) -> dict[str, Hold]:
        """A group named after each user whose gid no group has; their holds. Users sharing
        such a gid share the first one's group. No personal group for a gid or under a
        name a directory group holds while it is skipped or missing (warned for a name)."""
        taken, made = self.taken, {}
        directory_gids = {h.id for h in holds.values() if not h.personal}
        for user in self.result.users:
            if user.gid in taken.gids or user.gid in directory_gids:
                continue
            held = holds.get(user.name)
            if user.name in taken.group_names or (held is not None and not held.personal):
                gid = taken.group_names.get(user.name, held.id if held else None)
                self.result.warnings.append(
                    f"user {user.name}: no group for its gid {user.gid}: the group "
                    f"{user.name} has gid {gid}"
                )
                continue
            taken.group_names[user.name], taken.gids[user.gid] = user.gid, user.name
            self.result.groups.append(Group(user.name, user.gid))
            made[user.name] = Hold(user.gid, PERSONAL)
        return made


@dataclass(frozen=True)
class _Kind:
    """What the hold rules need to know of users or of groups."""

    word: str  # "user" or "group"
    id_word: str  # "uid" or "gid"
    number: Callable[[Any], int]


_USERS = _Kind("user", "uid", lambda user: user.uid)
_GROUPS = _Kind("group", "gid", lambda group: group.gid)


def _holder(name: str, hold: Hold) -> str:
    return f"user {name}'s personal group" if hold.personal else show(hold.dn)


def _refusal(kind: _Kind, account: Any, name: str, hold: Hold) -> tuple[str, str]:
    """Why `account` may not have what it claims of `name`'s hold: (reason, detail)."""
    holder = _holder(name, hold)
    if account.name == name:
        detail = f"{kind.word} name {name} is held by {holder} ({kind.id_word} {hold.id})"
        return f"duplicate {kind.word} name", detail
    number = kind.number(account)
    return f"duplicate {kind.id_word}", f"{kind.id_word} {number} is {name}'s (held by {holder})"


def _live(
    kind: _Kind,
    holds: Mapping[str, Hold],
    present: Callable[[str, Hold], bool],
    now: float,
    warnings: list[str],
) -> dict[str, Hold]:
    """The holds still in force: one whose entry is gone lasts HOLD_SECONDS."""
    live = {}
    for name, hold in holds.items():
        gone = hold.gone_since
        if gone is not None and now - gone >= HOLD_SECONDS and not present(name, hold):
            warnings.append(
                f"{kind.word} {name} ({kind.id_word} {hold.id}) released: "
                f"{_holder(name, hold)} missing since {_date(gone)}"
            )
            continue
        live[name] = hold
    return live


def _claims(
    kind: _Kind,
    items: Iterable[tuple[Any, str]],
    holds: Mapping[str, Hold],
    present: Collection[str],
) -> tuple[list[tuple[Any, str]], list[tuple[str, str, str]]]:
    """The (account, dn) pairs that may claim what they claim, in the order to admit them
    (holders and movers, then the rest, each in DN order), and those refused with their
    (dn, reason, detail). An entry touching a hold by name or id must be its holder (its
    DN), or the one entry claiming exactly its (name, id) while its DN is gone: a move.
    A personal group's hold moves to no directory group."""
    by_id = {hold.id: name for name, hold in holds.items()}
    first: list[tuple[Any, str]] = []
    later: list[tuple[Any, str]] = []
    refused: list[tuple[str, str, str]] = []
    movers: dict[str, list[tuple[Any, str]]] = {}
    for item in items:
        account, dn = item
        number = kind.number(account)
        touched = [n for n in dict.fromkeys((account.name, by_id.get(number))) if n in holds]
        foreign = [n for n in touched if holds[n].dn != dn]
        if not foreign:
            (first if touched else later).append(item)
            continue
        name, hold = foreign[0], holds[foreign[0]]
        moved = touched == [name] and (account.name, number) == (name, hold.id)
        if moved and not hold.personal and hold.dn not in present:
            movers.setdefault(name, []).append(item)
        else:
            refused.append((dn, *_refusal(kind, account, name, hold)))
    for name, claimants in movers.items():
        if len(claimants) == 1:
            first.extend(claimants)
            continue
        hold = holds[name]
        detail = (
            f"{len(claimants)} entries claim {kind.word} name {name} with {kind.id_word} "
            f"{hold.id}, none at {show(hold.dn)} which held it: none admitted"
        )
        refused.extend((dn, "ambiguous claim", detail) for _, dn in claimants)

    def by_dn(item: tuple[Any, str]) -> str:
        return item[1]

    return sorted(first, key=by_dn) + sorted(later, key=by_dn), refused


def _carry(
    kind: _Kind,
    live: Mapping[str, Hold],
    admitted: Mapping[str, Hold],
    present: Callable[[str, Hold], bool],
    now: float,
    warnings: list[str],
) -> dict[str, Hold]:
    """This sync's holds: those it admitted, then each live one not taken over, carried
    forward (a holder admitted under another name or id has let the old ones go)."""
    holds = dict(admitted)
    dns = {a.dn for a in admitted.values() if not a.personal}
    personal_ids = {a.id for a in admitted.values() if a.personal}
    for name, hold in live.items():
        new = holds.get(name)
        if new is not None:
            if new.dn != hold.dn and not (new.personal or hold.personal):
                warnings.append(
                    f"{kind.word} {name} ({kind.id_word} {hold.id}) moved from "
                    f"{show(hold.dn)} to {show(new.dn)}"
                )
            continue
        if hold.id in personal_ids if hold.personal else hold.dn in dns:
            continue
        gone = None
        if not present(name, hold):
            gone = now if hold.gone_since is None else hold.gone_since
            warnings.append(
                f"{kind.word} {name} ({kind.id_word} {hold.id}) kept for "
                f"{_holder(name, hold)}, missing from the directory: no other entry "
                f"may take the name or the {kind.id_word} before {_date(gone + HOLD_SECONDS)}"
            )
        holds[name] = Hold(hold.id, hold.dn, admitted=False, gone_since=gone)
    return holds


def _date(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def admit(
    static_users: Iterable[User],
    static_groups: Iterable[Group],
    directory: Directory | None,
    settings: LdapSettings | None,
    rules: AccountRules,
    shells: Collection[str],
    base: Base,
    previous: Owners,
    now: float,
) -> Result:
    """The accounts to write, each bad one skipped with its reason. Groups before users,
    static before the directory's, holders of `previous` before the others."""
    result = Result(users=[], groups=[])
    admission = _Admission(rules, shells, base, result)
    static_users = list(static_users)
    static = {u.name: u for u in static_users}

    for group in static_groups:
        try:
            admission.group(group)
        except Skip as skip:
            result.skip(skip.reason, f"static group {group.name}: {skip.detail}")

    user_dns = {e["dn"][0] for e in directory.users} if directory else set()
    group_dns = {e["dn"][0] for e in directory.groups} if directory else set()

    def user_present(name: str, hold: Hold) -> bool:
        return hold.dn in user_dns

    live_users = _live(_USERS, previous.users, user_present, now, result.warnings)

    def group_present(name: str, hold: Hold) -> bool:
        # A personal group is there while its user's hold is.
        return name in live_users if hold.personal else hold.dn in group_dns

    live_groups = _live(_GROUPS, previous.groups, group_present, now, result.warnings)
    groups, members_of, users = _parse(directory, settings, result)
    memberships: dict[str, list[str]] = {}

    def admit_group(group: Group, dn: str) -> bool:
        admission.group(group)
        for member in members_of[dn]:
            memberships.setdefault(member, []).append(group.name)
        return True

    group_holds = _directory(_GROUPS, groups, live_groups, group_dns, admit_group, result)
    for user in static_users:
        try:
            admission.user(user, static)
        except Skip as skip:
            result.skip(skip.reason, f"static user {user.name}: {skip.detail}")

    def admit_user(user: User, dn: str) -> bool:
        return admission.user(replace(user, groups=tuple(memberships.get(user.name, ()))), static)

    user_holds = _directory(_USERS, users, live_users, user_dns, admit_user, result)
    group_holds.update(admission.personal_groups(live_groups))
    result.owners = Owners(
        users=_carry(_USERS, live_users, user_holds, user_present, now, result.warnings),
        groups=_carry(_GROUPS, live_groups, group_holds, group_present, now, result.warnings),
    )
    return result


def _directory(
    kind: _Kind,
    items: list[tuple[Any, str]],
    live: Mapping[str, Hold],
    present: Collection[str],
    admit_one: Callable[[Any, str], bool],
    result: Result,
) -> dict[str, Hold]:
    """The directory's accounts of one kind, admitted in the order the holds allow; the
    holds of those admitted (`admit_one` True)."""
    ordered, refused = _claims(kind, items, live, present)
    for dn, reason, detail in refused:
        result.skip(reason, f"{kind.word} {show(dn)}: {detail}")
    holds = {}
    for account, dn in ordered:
        try:
            if admit_one(account, dn):
                holds[account.name] = Hold(kind.number(account), dn)
        except Skip as skip:
            result.skip(skip.reason, f"{kind.word} {show(dn)}: {skip.detail}")
    return holds


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
            group, members = ldap_group(entry, a)
        except Skip as skip:
            result.skip(skip.reason, f"group {show(dn)}: {skip.detail}")
            continue
        groups.append((group, dn))
        members_of[dn] = members
    for entry in directory.users:
        dn = entry["dn"][0]
        try:
            users.append((ldap_user(entry, a), dn))
        except Skip as skip:
            result.skip(skip.reason, f"user {show(dn)}: {skip.detail}")
        except BadKeys as bad:
            result.warnings.append(f"user {show(dn)}: SSH keys left out: {bad}")
            users.append((bad.user, dn))
    return groups, members_of, users
