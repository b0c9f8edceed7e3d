"""The development directory: a real slapd, seeded from values, for trying slonk without an
LDAP of your own. Not for production: anyone on the cluster network may read it."""

from __future__ import annotations

import base64
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from slonk.base import paths
from slonk.config.spec import LDAP_SUFFIX_PATTERN, Group, User

SCHEMAS = ("core", "cosine", "nis", "inetorgperson")


@dataclass(frozen=True)
class Tls:
    certificate: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class DevDirectory:
    suffix: str
    admin_password: str
    data_dir: Path
    conf_dir: Path
    tls: Tls | None = None
    schema_dir: Path = Path("/etc/ldap/schema")
    lpk_schema: Path = paths.SHARE / "ldap" / "openssh-lpk.schema"

    def __post_init__(self) -> None:
        # Both are written into slapd.conf lines: a newline or a quote would add settings.
        if not re.fullmatch(LDAP_SUFFIX_PATTERN, self.suffix):
            raise ValueError(f"directory suffix {self.suffix!r} must be dc=...,dc=...")
        if not re.fullmatch(r"[\x21-\x7e]+", self.admin_password) or '"' in self.admin_password:
            raise ValueError("the admin password must be printable ASCII without spaces or '\"'")

    @property
    def admin_dn(self) -> str:
        return f"cn=admin,{self.suffix}"

    @property
    def conf_file(self) -> Path:
        return self.conf_dir / "slapd.conf"

    def config(self) -> str:
        lines = [f"include {self.schema_dir / name}.schema" for name in SCHEMAS]
        lines += [
            f"include {self.lpk_schema}",
            f"pidfile {self.conf_dir / 'slapd.pid'}",
            "modulepath /usr/lib/ldap",
            "moduleload back_mdb",
            # slapd stops any search at 500 entries by default, paged or not.
            "sizelimit unlimited",
        ]
        if self.tls:
            lines += [
                f"TLSCertificateFile {self.tls.certificate}",
                f"TLSCertificateKeyFile {self.tls.key}",
                f"TLSCACertificateFile {self.tls.ca}",
            ]
        lines += [
            "database mdb",
            "maxsize 1073741824",
            f'suffix "{self.suffix}"',
            f'rootdn "{self.admin_dn}"',
            f"rootpw {self.admin_password}",
            f"directory {self.data_dir}",
            "index objectClass eq",
            "index uid,uidNumber,gidNumber,memberUid,cn eq",
            # Development only: the directory is readable by anyone who can reach it.
            "access to attrs=userPassword by anonymous auth by * none",
            "access to * by * read",
        ]
        return "\n".join(lines) + "\n"

    def prepare(self, seed: str, owner: str | None = None) -> bool:
        """Write slapd.conf; load the seed into an empty database. True when it seeded."""
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.conf_file.write_text(self.config())
        self.conf_file.chmod(0o600)  # it holds the admin password
        self.data_dir.mkdir(parents=True, exist_ok=True)
        seeded = False
        if not (self.data_dir / "data.mdb").exists():
            subprocess.run(
                ["slapadd", "-q", "-f", str(self.conf_file)],
                input=seed,
                text=True,
                check=True,
                capture_output=True,
            )
            seeded = True
        if owner:
            subprocess.run(
                ["chown", "-R", f"{owner}:{owner}", str(self.data_dir), str(self.conf_dir)],
                check=True,
            )
        return seeded


# What may follow "name: " as it is: printable ASCII not starting with a space, ':' or '<'
# (within RFC 2849's SAFE-STRING) and not ending with a space (tools strip it). Anything
# else, a newline that would start an attribute or an entry of its own first, is written
# base64-encoded after "name:: ", the DN as well.
_PLAIN = re.compile(r"([\x21-\x39\x3b\x3d-\x7e]([\x20-\x7e]*[\x21-\x7e])?)?")


def _line(name: str, value: str) -> str:
    if _PLAIN.fullmatch(value):
        return f"{name}: {value}"
    return f"{name}:: {base64.b64encode(value.encode()).decode()}"


def _entry(dn: str, attributes: Iterable[tuple[str, str]]) -> str:
    lines = [_line("dn", dn)] + [_line(name, value) for name, value in attributes]
    return "\n".join(lines) + "\n"


def user_entry(user: User, people: str) -> str:
    attributes = [
        ("objectClass", "inetOrgPerson"),
        ("objectClass", "posixAccount"),
        ("objectClass", "ldapPublicKey"),
        ("uid", user.name),
        ("cn", user.name),
        ("sn", user.name),
        ("uidNumber", str(user.uid)),
        ("gidNumber", str(user.gid)),
        ("homeDirectory", user.home_dir),
        ("loginShell", user.shell),
    ]
    attributes += [("sshPublicKey", key) for key in user.ssh_keys]
    return _entry(f"uid={user.name},{people}", attributes)


def group_entry(group: Group, members: Iterable[str], groups: str) -> str:
    attributes = [("objectClass", "posixGroup"), ("cn", group.name), ("gidNumber", str(group.gid))]
    attributes += [("memberUid", m) for m in members]
    return _entry(f"cn={group.name},{groups}", attributes)


def seed_ldif(suffix: str, users: Iterable[User], groups: Iterable[Group]) -> str:
    """The base entries (organization, ou=people, ou=groups) and the given accounts."""
    users = list(users)
    first = suffix.split(",")[0].split("=", 1)[1]
    entries = [
        _entry(
            suffix,
            [
                ("objectClass", "dcObject"),
                ("objectClass", "organization"),
                ("dc", first),
                ("o", first),
            ],
        ),
        _entry(f"ou=people,{suffix}", [("objectClass", "organizationalUnit"), ("ou", "people")]),
        _entry(f"ou=groups,{suffix}", [("objectClass", "organizationalUnit"), ("ou", "groups")]),
    ]
    entries += [user_entry(u, f"ou=people,{suffix}") for u in users]
    entries += [
        group_entry(g, [u.name for u in users if g.name in u.groups], f"ou=groups,{suffix}")
        for g in groups
    ]
    return "\n".join(entries)
