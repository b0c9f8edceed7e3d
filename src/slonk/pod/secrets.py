"""Install the munge key and SSH host keys from their mounted Secrets."""

from __future__ import annotations

from pathlib import Path

from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.base.files import make_dir, write_atomically

MIN_MUNGE_KEY_BYTES = 32  # munged refuses shorter keys


class MissingSecret(SlonkError):
    """A Secret the pod needs is not mounted; the message says which and where."""


def install_munge_key(source: Path = paths.MUNGE_SECRET, target: Path = paths.MUNGE_KEY) -> None:
    if not source.is_file():
        raise MissingSecret(
            f"{source}: no munge key; mount the Secret <release>-munge (key munge.key) there"
        )
    key = source.read_bytes()
    if len(key) < MIN_MUNGE_KEY_BYTES:
        raise MissingSecret(
            f"{source}: munge key is {len(key)} bytes, munged needs at least {MIN_MUNGE_KEY_BYTES}"
        )
    # munged refuses a key directory or file that anyone but munge (or root) could change.
    make_dir(target.parent, 0o700, owner="munge")
    write_atomically(target, key, mode=0o400, owner="munge")


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
