"""LDAP values: what the pods are told (cluster.yaml) and which Secrets they mount."""

from __future__ import annotations

from .test_objects import _container, _names, _spec, _volume


def test_site_directory_settings_reach_the_spec(ldap_manifest):
    settings = _spec(ldap_manifest).ldap
    assert settings.uris == ("ldap://ldap1.example.org", "ldap://ldap2.example.org")
    assert settings.tls == "starttls"
    assert settings.bind_dn == "cn=slonk,ou=services,dc=example,dc=org"
    assert settings.bind_password_file == "/var/run/secrets/slonk/ldap-bind/password"
    assert settings.ca_file == "/var/run/secrets/slonk/ldap-ca/ca.crt"
    assert settings.attributes["sshPublicKey"] == "altSecurityIdentities"
    assert settings.sync_interval_seconds == 300
    assert settings.page_size == 100
    assert "slonk-ldap" not in _names(ldap_manifest, "StatefulSet")


def test_every_pod_mounts_the_bind_password_and_ca(ldap_manifest):
    for name in ("controller", "cpu", "login"):
        sts = ldap_manifest.get(f"StatefulSet/slonk-{name}")
        assert _volume(sts, "ldap-bind").secret.secretName == "site-ldap-bind"
        assert _volume(sts, "ldap-ca").secret.secretName == "site-ldap-ca"
        mounts = {m.name: m.mountPath for m in _container(sts).volumeMounts}
        assert mounts["ldap-bind"] == "/var/run/secrets/slonk/ldap-bind"
        assert mounts["ldap-ca"] == "/var/run/secrets/slonk/ldap-ca"


def test_development_directory(ldap_dev_manifest):
    m = ldap_dev_manifest
    spec = _spec(m)
    assert spec.ldap.uris == ("ldap://slonk-ldap",)
    assert spec.ldap.user_base == "ou=people,dc=slonk,dc=local"
    assert spec.ldap.page_size == 500  # values.yaml's, the model's default
    assert [u.name for u in spec.ldap_server.users] == ["alice"]
    assert spec.ldap_server.users[0].groups == ("research",)
    slapd = m.get("StatefulSet/slonk-ldap")
    assert list(_container(slapd).command) == ["slonk", "init", "--role", "ldap"]
    assert slapd.spec.volumeClaimTemplates[0].metadata.name == "data"
    assert m.get("Service/slonk-ldap").spec.ports[0].port == 389
    admin = m.get("Secret/slonk-ldap-admin")
    assert admin.metadata.annotations["helm.sh/resource-policy"] == "keep"
    worker_volumes = m.get("StatefulSet/slonk-cpu").spec.template.spec.volumes
    assert "ldap-bind" not in {v.name for v in worker_volumes}
