"""sshd's files from the attacker's side: a CA file (ssh.trustedUserCAKeys, a Secret anyone
with write access to it controls) holding options, certificates, control characters or junk
stops the pod at start, naming the line; only plain public keys reach sshd. And what each
role's sshd is told."""

from __future__ import annotations

import base64
import stat
import subprocess

import pytest

from slonk.config.spec import parse_spec
from slonk.pod import sshd
from slonk.pod.secrets import MissingSecret


def _blob(kind: str, body: bytes = b"\x00\x00\x00\x20" + b"k" * 32) -> str:
    name = kind.encode()
    return base64.b64encode(len(name).to_bytes(4, "big") + name + body).decode()


ED25519 = f"ssh-ed25519 {_blob('ssh-ed25519')}"
ECDSA = f"ecdsa-sha2-nistp256 {_blob('ecdsa-sha2-nistp256')}"


def test_plain_keys_pass_without_their_comments():
    text = f"# the SSO's CA\n\n{ED25519} sso-2026\n{ECDSA}\n"
    assert sshd.check_ca_keys(text.encode(), "ca.pub") == [ED25519, ECDSA]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        # Options: what authorized_keys would read as restrictions or commands.
        (f'cert-authority,principals="root" {ED25519}', "not a public key type"),
        (f'command="/bin/sh" {ED25519}', "not a public key type"),
        (f"restrict {ED25519}", "not a public key type"),
        (f"@cert-authority * {ED25519}", "not a public key type"),
        # A certificate is not a CA key.
        (
            f"ssh-ed25519-cert-v01@openssh.com {_blob('ssh-ed25519-cert-v01@openssh.com')}",
            "not a public key type",
        ),
        # Control characters: a second line hidden in one, a carriage return, a tab, NUL, ESC.
        (f"{ED25519} x\rssh-rsa AAAA", "control character"),
        (f"ssh-ed25519\t{_blob('ssh-ed25519')}", "control character"),
        (f"{ED25519} \x00", "control character"),
        (f"{ED25519} \x1b[2J", "control character"),
        (f"{ED25519} \x7f", "control character"),
        # Keys that are not what they say.
        ("ssh-ed25519 not*base64", "not base64"),
        ("ssh-ed25519", "is not a ssh-ed25519 key"),
        (f"ssh-ed25519 {_blob('ssh-rsa')}", "is not a ssh-ed25519 key"),
        (f"ssh-ed25519 {base64.b64encode(b'xy').decode()}", "is not a ssh-ed25519 key"),
        ("AAAAC3NzaC1lZDI1NTE5AAAAI", "not a public key type"),
    ],
)
def test_a_hostile_line_is_refused_naming_it(line, reason):
    data = f"{ED25519}\n{line}\n".encode()
    with pytest.raises(sshd.SshError, match=rf"^ca\.pub line 2: .*{reason}"):
        sshd.check_ca_keys(data, "ca.pub")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "no public key"),
        (b"# only a comment\n\n", "no public key"),
        (f"{ED25519} caf\xc3\xa9\n".encode(), "not ASCII"),
        (b"#" * (sshd.MAX_CA_FILE_BYTES + 1), "more than"),
    ],
)
def test_a_file_that_trusts_nothing_or_is_no_ca_file_is_refused(data, reason):
    with pytest.raises(sshd.SshError, match=reason):
        sshd.check_ca_keys(data, "ca.pub")


def test_installed_keys_are_the_checked_ones_and_nothing_else(tmp_path):
    source, target = tmp_path / "secret" / "ca.pub", tmp_path / "etc" / "ca_keys"
    with pytest.raises(MissingSecret, match=r"ssh\.trustedUserCAKeys"):
        sshd.install_ca_keys(source, target)
    source.parent.mkdir()
    source.write_text(f"{ED25519} comment that sshd never sees\n")
    assert sshd.install_ca_keys(source, target) == 1
    assert target.read_text() == f"{ED25519}\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    source.write_text(f'{ED25519}\nenvironment="LD_PRELOAD=/tmp/x" {ED25519}\n')
    with pytest.raises(sshd.SshError, match="line 2"):
        sshd.install_ca_keys(source, target)
    assert target.read_text() == f"{ED25519}\n"  # the refused file wrote nothing


def test_a_real_ca_key_passes(tmp_path):
    key = tmp_path / "ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    public = key.with_suffix(".pub").read_text()
    assert sshd.check_ca_keys(public.encode(), "ca.pub") == [" ".join(public.split()[:2])]


def test_each_role_tells_sshd_what_it_needs():
    worker = sshd.pod_config("worker", sshd.TRUSTED_USER_CA_KEYS)
    assert "UsePAM yes\n" in worker  # pam_slurm_adopt
    assert f"TrustedUserCAKeys {sshd.TRUSTED_USER_CA_KEYS}\n" in worker
    login = sshd.pod_config("login", None)
    assert "UsePAM no\n" in login and "TrustedUserCAKeys" not in login
    # No AuthorizedPrincipals setting anywhere: a certificate's principals name the user.
    assert "Principals" not in worker + login


def test_one_users_refusals_do_not_penalise_the_login_pods_address():
    """Workers see every user come from the login pods: no per-source penalties there, and
    room for many half-open connections; login pods keep OpenSSH's defaults."""
    worker = sshd.pod_config("worker", None).splitlines()
    assert {"PerSourcePenalties no", "MaxStartups 100:30:300", "LoginGraceTime 30"} <= set(worker)
    login = sshd.pod_config("login", None)
    assert "PerSourcePenalties" not in login and "MaxStartups" not in login


def test_workers_run_sshd_unless_turned_off(demo_spec):
    on = parse_spec(demo_spec)
    off = parse_spec({**demo_spec, "ssh": {"workers": False}})
    assert sshd.runs_sshd(on, "worker") and sshd.runs_sshd(off, "login")
    assert not sshd.runs_sshd(off, "worker") and not sshd.runs_sshd(on, "controller")


def test_known_hosts_name_the_releases_pods(tmp_path, demo_spec):
    key = tmp_path / "ssh_host_ecdsa_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(key)], check=True)
    spec = parse_spec(demo_spec)
    kind, blob = key.with_suffix(".pub").read_text().split()[:2]
    names = f"{spec.release}-*,{spec.release}-*.{spec.namespace}.svc.{spec.cluster_domain}"
    assert sshd.known_hosts(spec, [key]) == f"{names} {kind} {blob}\n"


@pytest.mark.parametrize(
    ("ssh", "message"),
    [
        ({"workers": "yes"}, r"^ssh\.workers: "),
        ({"trustedUserCAKeys": "sso-ca"}, r"^ssh\.trustedUserCAKeys: "),
        ({"caKeys": True}, r"^ssh\.caKeys: unknown key"),
    ],
)
def test_the_ssh_section_is_checked_naming_the_key(demo_spec, ssh, message):
    from slonk.config.spec import SpecError

    with pytest.raises(SpecError, match=message):
        parse_spec({**demo_spec, "ssh": ssh})


def test_a_workers_sshd_and_syslog_services_exist(tmp_path):
    import os

    from slonk.base import paths
    from slonk.pod import services

    share = paths.rootfs_dir() / "usr/share/slonk"
    services.write_scan_dir("worker", ("sshd", "syslog"), share=share, scan_dir=tmp_path / "s")
    for service in ("sshd", "syslog"):
        assert os.access(tmp_path / "s" / service / "run", os.X_OK)
