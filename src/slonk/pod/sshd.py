"""sshd in a pod: on the login pods, and on the workers with ssh.workers (pam_slurm_adopt).

Both run the same sshd (rootfs' sshd service, sshd_config.d/slonk.conf): keys from the users
sync, host keys from the ssh Secret, and the site's user certificate authorities. What differs
by role is written here, into one drop-in read before slonk.conf (sshd takes the first value):
workers run PAM, for pam_slurm_adopt (rootfs' pam.d/sshd); login pods do not.
"""

from __future__ import annotations

import base64
import binascii
import subprocess
from pathlib import Path

from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.base.files import make_dir, write_atomically
from slonk.config.model import ClusterSpec
from slonk.pod import secrets

# Plain public keys a certificate authority may have: OpenSSH's key types without the
# certificate ones (a CA is a key, not a certificate).
PLAIN_KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)
# A handful of CA keys is a few kilobytes; anything far beyond is not a CA file.
MAX_CA_FILE_BYTES = 64 * 1024

SSHD_CONFIG_DIR = Path("/etc/ssh/sshd_config.d")
# Sorted before slonk.conf: its values win.
POD_CONFIG = SSHD_CONFIG_DIR / "00-slonk-pod.conf"
# The CA keys as checked at start: sshd reads this copy, never the Secret's volume, which the
# kubelet may change after the check.
TRUSTED_USER_CA_KEYS = Path("/etc/ssh/slonk/trusted_user_ca_keys")
KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
PRIVSEP_DIR = Path("/run/sshd")


# A worker's sshd sees every user arrive from a few addresses (the login pods', the other
# workers'), keys only, never from outside the release (NetworkPolicy). OpenSSH 10 penalises
# an address for its failed logins: a handful of one user's refusals by pam_slurm_adopt (no
# job on this node) blocked the login pod's address for every user. No penalties on workers
# (login pods keep them against the outside world); MaxStartups counts half-open connections
# of all users together, so room for many, each given 30 s to authenticate.
WORKER_SOURCES = (
    "PerSourcePenalties no",
    "MaxStartups 100:30:300",
    "LoginGraceTime 30",
)


class SshError(SlonkError):
    """A file sshd would trust is not what it must be; the message names it and the line."""


def runs_sshd(spec: ClusterSpec, role: str) -> bool:
    return role == "login" or (role == "worker" and spec.ssh.workers)


def check_ca_keys(data: bytes, where: str) -> list[str]:
    """The CA file's keys as `TYPE BASE64` lines (comments dropped), or SshError naming the
    first line that is anything but a plain public key: options (`cert-authority,...`,
    `command=...`), a certificate, a control character, bad base64, a blob of another type.
    Blank lines and `#` comments are allowed; at least one key is required."""
    if len(data) > MAX_CA_FILE_BYTES:
        raise SshError(f"{where}: {len(data)} bytes, more than {MAX_CA_FILE_BYTES}")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as err:
        raise SshError(f"{where}: not ASCII (byte {err.start})") from None
    keys = []
    for number, line in enumerate(text.split("\n"), 1):
        at = f"{where} line {number}"
        if bad := next((c for c in line if c < " " or c == "\x7f"), None):
            raise SshError(f"{at}: holds a control character ({bad!r})")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        kind, blob, *_comment = [*line.split(), ""]
        if kind not in PLAIN_KEY_TYPES:
            raise SshError(
                f"{at}: starts with {kind[:60]!r}, not a public key type: each line is "
                "TYPE BASE64 [comment], without options or certificates"
            )
        try:
            decoded = base64.b64decode(blob, validate=True)
        except (binascii.Error, ValueError):
            raise SshError(f"{at}: the key is not base64") from None
        if _wire_type(decoded) != kind:
            raise SshError(f"{at}: the key's data is not a {kind} key")
        keys.append(f"{kind} {blob}")
    if not keys:
        raise SshError(f"{where}: no public key (a CA file that trusts nothing)")
    return keys


def _wire_type(blob: bytes) -> str | None:
    """The key type an SSH public key blob starts with (a uint32 length, then the name)."""
    length = int.from_bytes(blob[:4], "big")
    name = blob[4 : 4 + length]
    return name.decode("ascii", "replace") if len(blob) >= 4 + length else None


def install_ca_keys(source: Path = paths.SSH_USER_CA, target: Path = TRUSTED_USER_CA_KEYS) -> int:
    if not source.is_file():
        raise secrets.MissingSecret(
            f"{source}: no CA keys; mount the Secret of ssh.trustedUserCAKeys (key ca.pub) there"
        )
    keys = check_ca_keys(source.read_bytes(), f"{source} (ssh.trustedUserCAKeys, key ca.pub)")
    make_dir(target.parent, 0o755)
    write_atomically(target, "".join(f"{k}\n" for k in keys), mode=0o644)
    return len(keys)


def pod_config(role: str, ca_keys: Path | None) -> str:
    lines = [
        "# Written by `slonk init` (slonk.pod.sshd) at each start: what this pod's role needs.",
        # pam_slurm_adopt decides who logs in to a worker; a login pod needs no PAM.
        f"UsePAM {'yes' if role == 'worker' else 'no'}",
    ]
    if role == "worker":
        lines.extend(WORKER_SOURCES)
    if ca_keys is not None:
        # No AuthorizedPrincipalsFile: a certificate's principals must name the user.
        lines.append(f"TrustedUserCAKeys {ca_keys}")
    return "".join(f"{line}\n" for line in lines)


def known_hosts(spec: ClusterSpec, host_keys: list[Path]) -> str:
    """Every pod of the release that runs sshd shows these host keys: users' ssh between
    them knows them by the names users type (pod, Service, fully qualified)."""
    names = f"{spec.release}-*,{spec.release}-*.{spec.namespace}.svc.{spec.cluster_domain}"
    publics = [
        subprocess.run(
            ["ssh-keygen", "-y", "-f", str(key)], check=True, capture_output=True, text=True
        ).stdout.split()[:2]
        for key in host_keys
    ]
    return "".join(f"{names} {kind} {blob}\n" for kind, blob in publics)


def prepare(spec: ClusterSpec, role: str) -> str:
    """Host keys, the users' CA keys, this role's settings, known hosts, privsep dir."""
    etc_ssh = KNOWN_HOSTS.parent
    installed = secrets.install_ssh_host_keys(target=etc_ssh)
    ca_keys = None
    done = [", ".join(installed)]
    if spec.ssh.trusted_user_ca_keys:
        done.append(f"{install_ca_keys()} trusted user CA keys")
        ca_keys = TRUSTED_USER_CA_KEYS
    write_atomically(POD_CONFIG, pod_config(role, ca_keys))
    write_atomically(KNOWN_HOSTS, known_hosts(spec, [etc_ssh / name for name in installed]))
    make_dir(PRIVSEP_DIR, 0o755)
    return "; ".join(done)
