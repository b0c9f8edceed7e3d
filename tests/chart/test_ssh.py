"""sshd on the workers (workers.ssh) and the site's user CAs (ssh.trustedUserCAKeys) in the
chart: what the pods get only when on, and who may reach the workers' sshd."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from .netpol import allowed
from .test_security import OUTSIDE, STRANGER, _container, _docs, _get, _pods, _policies

SSHD_CAPS = {"AUDIT_WRITE", "NET_BIND_SERVICE", "SYS_CHROOT", "SYS_PTRACE"}
# workers.capabilities without SYS_PTRACE (which its default has, for job accounting).
WITHOUT_PTRACE = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID", "SYS_ADMIN"]
CA = {"ssh": {"trustedUserCAKeys": "sso-ca"}}
OFF = {"workers": {"ssh": {"enabled": False}}}


def _pod_spec(docs, statefulset: str) -> dict[str, Any]:
    return _get(docs, "StatefulSet", statefulset)["spec"]["template"]["spec"]


def _mounts(docs, statefulset: str) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in _container(docs, statefulset)["volumeMounts"]}


def _spec(docs) -> dict[str, Any]:
    return yaml.safe_load(_get(docs, "ConfigMap", "slonk-cluster")["data"]["cluster.yaml"])


@pytest.fixture(scope="module")
def on():
    return _docs(CA)


@pytest.fixture(scope="module")
def off():
    return _docs({**OFF, **CA})


def _caps(docs) -> list[str]:
    return _container(docs, "slonk-cpu")["securityContext"]["capabilities"]["add"]


def test_workers_get_sshds_capabilities_only_with_ssh():
    caps_on = _caps(_docs({"workers": {"capabilities": WITHOUT_PTRACE}}))
    caps_off = _caps(_docs({"workers": {"capabilities": WITHOUT_PTRACE, **OFF["workers"]}}))
    assert set(caps_on) >= SSHD_CAPS
    assert not SSHD_CAPS & set(caps_off)
    assert set(caps_on) - set(caps_off) == SSHD_CAPS
    assert len(caps_on) == len(set(caps_on))


def test_a_capability_listed_already_is_not_added_twice():
    docs = _docs({"workers": {"capabilities": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL",
                                               "SETGID", "SETUID", "SYS_CHROOT"]}})  # fmt: skip
    caps = _caps(docs)
    assert caps.count("SYS_CHROOT") == 1 and set(caps) >= SSHD_CAPS
    assert _caps(_docs()).count("SYS_PTRACE") == 1  # in the default list already


def test_workers_listen_for_ssh_only_with_ssh(on, off):
    ports = {p["name"] for p in _container(on, "slonk-cpu")["ports"]}
    assert "ssh" in ports
    assert "ssh" not in {p["name"] for p in _container(off, "slonk-cpu")["ports"]}


def test_the_user_ca_secret_is_mounted_where_sshd_runs(on, off):
    for docs, statefulset in ((on, "slonk-login"), (on, "slonk-cpu"), (off, "slonk-login")):
        assert _mounts(docs, statefulset)["ssh-user-ca"] == "/var/run/secrets/slonk/ssh-ca"
        volumes = _pod_spec(docs, statefulset)["volumes"]
        volume = next(v for v in volumes if v["name"] == "ssh-user-ca")
        # Only the documented key: a Secret without it fails the pod's mount, naming it.
        assert volume["secret"]["secretName"] == "sso-ca"
        assert volume["secret"]["items"] == [{"key": "ca.pub", "path": "ca.pub"}]
    assert "ssh-user-ca" not in _mounts(off, "slonk-cpu")
    assert "ssh-host-keys" not in _mounts(off, "slonk-cpu")
    assert _mounts(on, "slonk-cpu")["ssh-host-keys"] == "/var/run/secrets/slonk/ssh"


def test_no_ca_no_mount_and_the_spec_says_so(on):
    plain = _docs()
    for statefulset in ("slonk-login", "slonk-cpu"):
        assert "ssh-user-ca" not in _mounts(plain, statefulset)
    assert _spec(plain)["ssh"] == {"workers": True, "trustedUserCAKeys": False}
    assert _spec(on)["ssh"] == {"workers": True, "trustedUserCAKeys": True}
    assert _spec(_docs(OFF))["ssh"]["workers"] is False


def test_host_keys_are_made_for_workers_without_login_pods():
    docs = _docs({"login": {"replicas": 0}})
    assert _get(docs, "Secret", "slonk-ssh-host-keys")["data"]["ssh_host_ecdsa_key"]
    docs = _docs({"login": {"replicas": 0}, **OFF})
    assert not [d for d in docs if d["kind"] == "Secret" and "ssh" in d["metadata"]["name"]]


def test_who_reaches_the_workers_sshd(on, off):
    pods = _pods(on)
    policies = _policies(on)
    assert allowed(policies, pods["login"], pods["cpu"], 22)
    assert allowed(policies, pods["cpu"], pods["cpu"], 22)
    assert not allowed(policies, pods["controller"], pods["cpu"], 22)
    assert not allowed(policies, STRANGER, pods["cpu"], 22)
    assert not allowed(policies, OUTSIDE, pods["cpu"], 22)
    # pam_slurm_adopt's question to a login pod's (absent) slurmd is let in, to be refused.
    assert allowed(policies, pods["cpu"], pods["login"], 6818)
    assert not allowed(policies, pods["controller"], pods["login"], 6818)
    pods, policies = _pods(off), _policies(off)
    assert not allowed(policies, pods["login"], pods["cpu"], 22)
    assert not allowed(policies, pods["cpu"], pods["login"], 6818)
