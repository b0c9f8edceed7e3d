"""A directory entry read as an account, or skipped with its reason: one value for each
attribute (a name with several: the one in the entry's own RDN), numbers that are numbers,
SSH keys one clean line each (a user keeps the others). Nothing is guessed at."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ldap3.core.exceptions import LDAPInvalidDnError
from ldap3.utils.dn import parse_dn

from slonk.config import accounts
from slonk.config.accounts import AccountError, show
from slonk.config.spec import Group, User
from slonk.users.directory import Entry

_NUMBER = re.compile(r"[0-9]{1,10}")
# The DN of a personal group's hold: no directory entry has an empty DN.
PERSONAL = ""


class Skip(Exception):
    """An entry that is not admitted: a short reason (counted) and the detail (logged)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def checked(reason: str, check: Any, *args: Any) -> Any:
    try:
        return check(*args)
    except AccountError as err:
        raise Skip(reason, str(err)) from err


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
    raise Skip(f"several values for {attribute}", f"{len(values)} values for {attribute}")


def _check_dn(entry: Entry) -> None:
    """Holds are matched on DNs; the empty one is a personal group's (and the root DSE's)."""
    if entry["dn"][0] == PERSONAL:
        raise Skip("no DN", "an entry without a DN")


def _number(entry: Entry, attribute: str) -> int:
    value = _single(entry, attribute)
    if value is None:
        raise Skip(f"no {attribute}", f"no {attribute}")
    if not _NUMBER.fullmatch(value):
        raise Skip(f"invalid {attribute}", f"{attribute} {show(value)} is not a number")
    return int(value)


def ldap_group(entry: Entry, a: Mapping[str, str]) -> tuple[Group, list[str]]:
    _check_dn(entry)
    name = _single(entry, a["groupName"], name_of_entry=True)
    if name is None:
        raise Skip("invalid group name", f"no {a['groupName']}")
    return Group(name=name, gid=_number(entry, a["gidNumber"])), entry.get(a["groupMember"], [])


class BadKeys(Exception):
    """A user admissible without some of its keys: the keys go, the user stays."""

    def __init__(self, user: User, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.user = user


def ldap_user(entry: Entry, a: Mapping[str, str]) -> User:
    _check_dn(entry)
    name = _single(entry, a["uid"], name_of_entry=True)
    if name is None:
        raise Skip("invalid user name", f"no {a['uid']}")
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
        raise BadKeys(user, bad)
    return user
