"""Install the munge key, the JWT key and SSH host keys from their mounted Secrets."""

from __future__ import annotations

from pathlib import Path

from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.base.files import make_dir, write_atomically

MIN_MUNGE_KEY_BYTES = 32  # munged refuses shorter keys
# Slurm signs tokens with HMAC-SHA256: a key shorter than the hash gives less than its strength.
MIN_JWT_KEY_BYTES = 32


class MissingSecret(SlonkError):
    """A Secret the pod needs is not mounted; the message says which and where."""


def _key_from(source: Path, what: str, secret: str, minimum: int, reader: str) -> bytes:
    if not source.is_file():
        raise MissingSecret(
            f"{source}: no {what}; mount the Secret {secret} (key {source.name}) there"
        )
    key = source.read_bytes()
    if len(key) < minimum:
        raise MissingSecret(
            f"{source}: {what} is {len(key)} bytes, {reader} needs at least {minimum}"
        )
    return key


def install_munge_key(source: Path = paths.MUNGE_SECRET, target: Path = paths.MUNGE_KEY) -> None:
    key = _key_from(source, "munge key", "<release>-munge", MIN_MUNGE_KEY_BYTES, "munged")
    # munged refuses a key directory or file that anyone but munge (or root) could change.
    make_dir(target.parent, 0o700, owner="munge")
    write_atomically(target, key, mode=0o400, owner="munge")


def install_jwt_key(source: Path = paths.JWT_SECRET, target: Path = paths.JWT_KEY) -> None:
    """slurmctld's and slurmdbd's copy: SlurmUser's alone, 0400, as Slurm's JWT guide asks."""
    key = _key_from(source, "JWT key", "<release>-jwt", MIN_JWT_KEY_BYTES, "auth/jwt")
    make_dir(target.parent, 0o755)
    write_atomically(target, key, mode=0o400, owner="slurm")


def install_ssh_host_keys(
    source: Path = paths.SSH_SECRET_DIR, target: Path = Path("/etc/ssh")
) -> list[str]:
    """Replace whatever host keys the filesystem has with the Secret's, so they survive restarts."""
    keys = (
        sorted(p for p in source.glob("ssh_host_*_key") if p.is_file()) if source.is_dir() else []
    )
    if not keys:
        raise MissingSecret(
            f"{source}: no ssh_host_*_key files; mount the Secret <release>-ssh-host-keys there"
        )
    for stale in target.glob("ssh_host_*"):
        stale.unlink()
    for key in keys:
        write_atomically(target / key.name, key.read_bytes(), mode=0o600)
    return [k.name for k in keys]
