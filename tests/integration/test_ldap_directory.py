"""`slonk users sync` against a real slapd: TLS verified, failover, the wire's own errors."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from slonk.config.spec import Group, User, parse_spec
from slonk.pod.ldapdev import seed_ldif
from slonk.users.directory import DirectoryError, read_directory
from slonk.users.sync import Paths, sync

from .slapd import SUFFIX, free_port, make_ca, make_server_tls, running_slapd

SEED = seed_ldif(
    SUFFIX,
    [
        User("alice", 2001, 3000, ("research",), ("ssh-ed25519 AAAA alice",)),
        User("bob", 2002, 2002),
    ],
    [Group("research", 3000)],
)


def _settings(uris, **extra):
    ldap = {
        "uris": uris,
        "userBase": f"ou=people,{SUFFIX}",
        "groupBase": f"ou=groups,{SUFFIX}",
        "timeoutSeconds": 2,
        **extra,
    }
    return parse_spec({"clusterName": "x", "release": "r", "ldap": ldap}).ldap


@pytest.fixture(scope="module")
def tls_slapd(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slapd")
    tls = make_server_tls(workdir)
    with running_slapd(workdir, SEED, tls) as server:
        yield server


def test_plain_ldap_with_failover_past_a_dead_server(tls_slapd):
    dead = f"ldap://127.0.0.1:{free_port()}"
    directory = read_directory(_settings([dead, tls_slapd.ldap_uri]))
    assert directory.server == tls_slapd.ldap_uri
    assert sorted(u["uid"][0] for u in directory.users) == ["alice", "bob"]
    research = next(g for g in directory.groups if g["cn"] == ["research"])
    assert research["memberUid"] == ["alice"]
    alice = next(u for u in directory.users if u["uid"] == ["alice"])
    assert alice["sshPublicKey"] == ["ssh-ed25519 AAAA alice"]


def test_ldaps_with_the_ca_from_a_secret(tls_slapd):
    settings = _settings([tls_slapd.ldaps_uri], tls="ldaps", caFile=str(tls_slapd.directory.tls.ca))
    assert len(read_directory(settings).users) == 2


def test_starttls(tls_slapd):
    settings = _settings(
        [tls_slapd.ldap_uri], tls="starttls", caFile=str(tls_slapd.directory.tls.ca)
    )
    assert len(read_directory(settings).users) == 2


def test_a_wrong_ca_fails_closed(tls_slapd, tmp_path):
    other_ca, _ = make_ca(tmp_path, "other")
    for tls, uri in [("ldaps", tls_slapd.ldaps_uri), ("starttls", tls_slapd.ldap_uri)]:
        with pytest.raises(DirectoryError, match="certificate verify failed"):
            read_directory(_settings([uri], tls=tls, caFile=str(other_ca)))


def test_a_missing_ca_file_is_named(tls_slapd, tmp_path):
    with pytest.raises(DirectoryError, match=r"ca\.crt: CA certificate missing"):
        read_directory(
            _settings([tls_slapd.ldaps_uri], tls="ldaps", caFile=str(tmp_path / "ca.crt"))
        )


def test_bind_with_a_password_file(tls_slapd, tmp_path):
    password = tmp_path / "password"
    password.write_text("test-admin\n")
    settings = _settings(
        [tls_slapd.ldap_uri], bindDN=tls_slapd.directory.admin_dn, bindPasswordFile=str(password)
    )
    assert len(read_directory(settings).users) == 2
    password.write_text("wrong\n")
    with pytest.raises(DirectoryError, match=r"LDAPInvalidCredentialsResult"):
        read_directory(settings)


def test_a_truncated_search_is_refused_not_synced(tmp_path):
    """A server size limit ends a search quietly; syncing that partial list would drop users."""
    seed = seed_ldif(SUFFIX, [User(f"u{i}", 3000 + i, 3000) for i in range(12)], [])
    refused = pytest.raises(DirectoryError, match="ended with sizeLimitExceeded after 5 entries")
    with running_slapd(tmp_path, seed, size_limit=5) as server, refused:
        read_directory(_settings([server.ldap_uri]))


def test_pages_fit_the_directory_s_own_cap(tmp_path):
    """A directory that pages at most 5 entries refuses slonk's default page (500) outright,
    saying what to set; with ldap.pageSize at its cap every entry is read."""
    seed = seed_ldif(SUFFIX, [User(f"u{i}", 3000 + i, 3000) for i in range(12)], [])
    with running_slapd(tmp_path, seed, page_limit=5) as server:
        with pytest.raises(DirectoryError, match=r"pages of 500 entries: lower ldap\.pageSize"):
            read_directory(_settings([server.ldap_uri]))
        users = read_directory(_settings([server.ldap_uri], pageSize=5)).users
    assert sorted(u["uid"][0] for u in users) == sorted(f"u{i}" for i in range(12))


# From the attacker's side: what a real slapd hands back, through the whole sync.

INJECTED_HOME = "/home/x\nrootkit::0:0::/root"


def _ldif(name: str, uid: int, gid: int, *extra: str) -> str:
    return "\n".join(
        [
            f"dn: uid={name},ou=people,{SUFFIX}",
            "objectClass: inetOrgPerson",
            "objectClass: posixAccount",
            f"uid: {name}",
            f"cn: {name}",
            f"sn: {name}",
            f"uidNumber: {uid}",
            f"gidNumber: {gid}",
            *extra,
            "",
        ]
    )


@pytest.fixture
def node(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    for name in ("passwd", "group", "shadow", "shells"):
        (etc / name).write_text(Path(f"/etc/{name}").read_text())
    (tmp_path / "home").mkdir()
    return Paths(etc=etc, home=tmp_path / "home", var=tmp_path / "var")


def test_hostile_entries_from_slapd_write_no_line(tmp_path, node):
    with running_slapd(tmp_path / "slapd", SEED) as server:
        spec = server.spec()
        sync(spec, node)  # alice holds 2001 from here on
        encoded = base64.b64encode(INJECTED_HOME.encode()).decode()
        server.add(
            "\n".join(
                [
                    _ldif("mallory", 2101, 2101, f"homeDirectory:: {encoded}"),
                    _ldif("oscar", 2102, 0, "homeDirectory: /home/oscar"),
                    _ldif("aaron", 2001, 3000, "homeDirectory: /home/aaron"),  # alice's uid
                    f"dn: cn=wheel,ou=groups,{SUFFIX}",
                    "objectClass: posixGroup",
                    "cn: wheel",
                    "gidNumber: 42",
                    "memberUid: alice",
                    "",
                ]
            )
        )
        settings = _settings([server.ldap_uri])
        directory = read_directory(settings)
        mallory = next(u for u in directory.users if u["uid"] == ["mallory"])
        assert mallory["homeDirectory"] == [INJECTED_HOME]  # the wire hands it back as is
        result = sync(spec, node)
    assert sorted(u.name for u in result.users) == ["alice", "bob"]
    assert result.skipped == {"invalid home": 1, "invalid gid": 2, "duplicate uid": 1}
    for name in ("passwd", "group", "shadow"):
        image = Path(f"/etc/{name}").read_text()
        assert (node.etc / name).read_text().startswith(image)
    added = (node.etc / "passwd").read_text()[len(Path("/etc/passwd").read_text()) :]
    assert added.splitlines() == [
        "alice:x:2001:3000::/home/alice:/bin/bash",
        "bob:x:2002:2002::/home/bob:/bin/bash",
    ]


def test_the_dev_seed_loads_hostile_values_as_values(tmp_path):
    """The development directory's seed, through slapadd: a value never becomes an attribute
    or an entry of its own."""
    eve = User(
        "eve",
        2003,
        2003,
        shell="/bin/sh\nuidNumber: 0",
        home="/home/eve\n\ndn: cn=x,dc=slonk,dc=test\nobjectClass: organizationalRole",
        ssh_keys=("ssh-ed25519 A a\nsshPublicKey: ssh-ed25519 EVE eve",),
    )
    with running_slapd(tmp_path, seed_ldif(SUFFIX, [eve], [])) as server:
        directory = read_directory(_settings([server.ldap_uri]))
    (entry,) = directory.users
    assert entry["uidNumber"] == ["2003"]
    assert entry["loginShell"] == [eve.shell]
    assert entry["homeDirectory"] == [eve.home]
    assert entry["sshPublicKey"] == list(eve.ssh_keys)
