"""`slonk users sync` against a real slapd: TLS verified, failover, the wire's own errors."""

from __future__ import annotations

import pytest

from slonk.config.spec import Group, User, parse_spec
from slonk.ldapdev import seed_ldif
from slonk.users.directory import DirectoryError, read_directory

from .slapd import SUFFIX, free_port, make_ca, make_server_tls, running_slapd

SEED = seed_ldif(
    SUFFIX,
    [User("alice", 2001, 3000, ("research",), ("ssh-ed25519 AAAA alice",)),
     User("bob", 2002, 2002)],
    [Group("research", 3000)],
)


def _settings(uris, **extra):
    ldap = {"uris": uris, "userBase": f"ou=people,{SUFFIX}", "groupBase": f"ou=groups,{SUFFIX}",
            "timeoutSeconds": 2, **extra}
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
    settings = _settings([tls_slapd.ldaps_uri], tls="ldaps",
                         caFile=str(tls_slapd.directory.tls.ca))
    assert len(read_directory(settings).users) == 2


def test_starttls(tls_slapd):
    settings = _settings([tls_slapd.ldap_uri], tls="starttls",
                         caFile=str(tls_slapd.directory.tls.ca))
    assert len(read_directory(settings).users) == 2


def test_a_wrong_ca_fails_closed(tls_slapd, tmp_path):
    other_ca, _ = make_ca(tmp_path, "other")
    for tls, uri in [("ldaps", tls_slapd.ldaps_uri), ("starttls", tls_slapd.ldap_uri)]:
        with pytest.raises(DirectoryError, match="certificate verify failed"):
            read_directory(_settings([uri], tls=tls, caFile=str(other_ca)))


def test_a_missing_ca_file_is_named(tls_slapd, tmp_path):
    with pytest.raises(DirectoryError, match=r"ca\.crt: CA certificate missing"):
        read_directory(_settings([tls_slapd.ldaps_uri], tls="ldaps",
                                 caFile=str(tmp_path / "ca.crt")))


def test_bind_with_a_password_file(tls_slapd, tmp_path):
    password = tmp_path / "password"
    password.write_text("test-admin\n")
    settings = _settings([tls_slapd.ldap_uri], bindDN=tls_slapd.directory.admin_dn,
                         bindPasswordFile=str(password))
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
