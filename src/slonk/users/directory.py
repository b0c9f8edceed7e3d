"""Read users and groups from LDAP (ldap3): URIs tried in order, paged searches, TLS verified.

Entries come back as {attribute: [str, ...]} from the raw values, so nothing depends on the
directory's schema (an INTEGER uidNumber and a string one read the same).
"""

from __future__ import annotations

import contextlib
import math
import ssl
from dataclasses import dataclass
from pathlib import Path

import ldap3
from ldap3.core.exceptions import LDAPAdminLimitExceededResult, LDAPException

from slonk.base.errors import SlonkError
from slonk.config.spec import LdapSettings

Entry = dict[str, list[str]]


class DirectoryError(SlonkError):
    """The directory could not be read; nothing was changed."""


@dataclass(frozen=True)
class Directory:
    users: list[Entry]
    groups: list[Entry]
    server: str
    live: bool = True  # False: read back from the last good sync's snapshot


def _tls(settings: LdapSettings) -> ldap3.Tls | None:
    if settings.tls == "none" and not settings.ca_file:
        return None
    if settings.ca_file and not Path(settings.ca_file).is_file():
        raise DirectoryError(f"{settings.ca_file}: CA certificate missing (mount the CA Secret)")
    return ldap3.Tls(
        validate=ssl.CERT_REQUIRED,
        ca_certs_file=settings.ca_file,
        version=ssl.PROTOCOL_TLS_CLIENT,
    )


def _password(settings: LdapSettings) -> str | None:
    if not settings.bind_password_file:
        return None
    try:
        return Path(settings.bind_password_file).read_text().strip()
    except OSError as err:
        raise DirectoryError(
            f"{settings.bind_password_file}: bind password: {err.strerror}"
        ) from err


def _search(
    conn: ldap3.Connection, base: str, query: str, attributes: list[str], page_size: int
) -> list[Entry]:
    entries = []
    for item in conn.extend.standard.paged_search(
        base, query, ldap3.SUBTREE, attributes=attributes, paged_size=page_size, generator=True
    ):
        if item.get("type") != "searchResEntry":
            continue
        raw = item["raw_attributes"]
        entry = {k: [v.decode("utf-8", "replace") for v in values] for k, values in raw.items()}
        entry["dn"] = [item["dn"]]
        entries.append(entry)
    # A server limit ends a search early without an exception: a partial list must never
    # be taken for the directory (its missing users would be removed).
    if conn.result and conn.result.get("result") != 0:
        raise DirectoryError(
            f"search under {base} ended with {conn.result.get('description')} after "
            f"{len(entries)} entries; nothing synced (allow this account more results for "
            "paged searches, e.g. slapd's sizelimit / limits size.pr)"
        )
    return entries


def _read(settings: LdapSettings, uri: str, tls: ldap3.Tls | None) -> Directory:
    timeout = math.ceil(settings.timeout_seconds)  # ldap3 packs it into a socket option
    server = ldap3.Server(
        uri,
        use_ssl=uri.startswith("ldaps://"),
        tls=tls,
        get_info=ldap3.NONE,
        connect_timeout=timeout,
    )
    conn = ldap3.Connection(
        server,
        user=settings.bind_dn,
        password=_password(settings),
        read_only=True,
        receive_timeout=timeout,
        raise_exceptions=True,
    )
    a = settings.attributes
    try:
        conn.open()
        if settings.tls == "starttls":
            conn.start_tls(read_server_info=False)  # else a failed handshake hides its cause
        conn.bind()
        users = _search(
            conn,
            settings.user_base,
            settings.user_filter,
            [
                a["uid"],
                a["uidNumber"],
                a["gidNumber"],
                a["homeDirectory"],
                a["loginShell"],
                a["sshPublicKey"],
            ],
            settings.page_size,
        )
        groups = _search(
            conn,
            settings.group_base,
            settings.group_filter,
            [a["groupName"], a["gidNumber"], a["groupMember"]],
            settings.page_size,
        )
    finally:
        with contextlib.suppress(LDAPException, OSError):  # never hide why it failed
            conn.unbind()
    return Directory(users=users, groups=groups, server=uri)


def read_directory(settings: LdapSettings) -> Directory:
    """Users and groups from the first URI that answers; DirectoryError if none does."""
    tls = _tls(settings)
    failures = []
    for uri in settings.uris:
        try:
            return _read(settings, uri, tls)
        except (LDAPException, OSError, ssl.SSLError) as err:
            failures.append(f"{uri}: {type(err).__name__}: {err}")
            if isinstance(err, LDAPAdminLimitExceededResult):
                # slapd's `size.pr`, Active Directory's MaxPageSize: pages the server takes.
                failures[-1] += f" (pages of {settings.page_size} entries: lower ldap.pageSize)"
    raise DirectoryError("no LDAP server answered: " + "; ".join(failures))
